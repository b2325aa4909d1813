"""Load the one shared ParlAI agent every conversation is cloned from."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from bot.config import ConfigError, Settings

log = logging.getLogger(__name__)


def route_parlai_logging(level: int | str = logging.WARNING) -> None:
    """Send ParlAI's log lines through our handlers (and redaction) instead of its own stdout.

    ParlAI builds its logger outside the logging registry, with a stdout handler of its own.
    Process-wide: the composition root (bot/__main__.py) calls it once, before the model loads.
    """
    from parlai.utils import logging as parlai_logging

    plog = parlai_logging.logger
    handler = getattr(plog, "streamHandler", None)
    if handler is not None:
        plog.removeHandler(handler)
    plog.parent = logging.getLogger("parlai")
    plog.setLevel(level)


def set_torch_threads(threads: int | None) -> None:
    """Torch's intra-op thread count for this process (TORCH_THREADS); None keeps torch's own.

    Process-wide: the composition root (bot/__main__.py) calls it once, before the model loads
    or trains.
    """
    if threads:
        import torch

        torch.set_num_threads(threads)


def generation_overrides(settings: Settings) -> dict[str, Any]:
    """ParlAI options the settings override (None keeps the model file's own)."""
    pairs = {
        "inference": settings.inference,
        "beam_size": settings.beam_size,
        "beam_min_length": settings.beam_min_length,
        "beam_block_ngram": settings.beam_block_ngram,
        "beam_context_block_ngram": settings.beam_context_block_ngram,
    }
    return {k: v for k, v in pairs.items() if v is not None}


def resolve_device(settings: Settings) -> str:
    """cpu or cuda, from MODEL_DEVICE and what this machine has."""
    import torch

    if settings.model_device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("MODEL_DEVICE=cuda but no CUDA device is available; use auto or cpu.")
    if settings.model_device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return settings.model_device


def map_weights(agent: Any, model_file: str) -> bool:
    """Point the loaded model's parameters at the weight file's own pages.

    `torch.load(mmap=True)` maps the file instead of reading it into private memory, so every
    process that serves the same file (two variants of one model: beam and nucleus, say) uses
    the same page-cache pages for its weights: one copy, not one per process. The pages are
    mapped copy-on-write and inference never writes them. Only done when the file's tensors
    match the model's exactly (names, shapes, dtypes: an fp16 file for an fp32 model is copied
    as before); returns whether it was.
    """
    import parlai.utils.pickle
    import torch

    try:
        states = torch.load(
            model_file, mmap=True, map_location="cpu", pickle_module=parlai.utils.pickle
        )
    except (RuntimeError, OSError, ValueError) as err:  # e.g. a legacy (non-zip) file
        log.info("weights of %s stay private to this process: %s", model_file, err)
        return False
    saved = states.get("model") if isinstance(states, dict) else None
    current = agent.model.state_dict()
    if not isinstance(saved, dict) or saved.keys() != current.keys():
        log.info("weights of %s stay private: its tensors are not the model's", model_file)
        return False
    for name, tensor in current.items():
        other = saved[name]
        if other.shape != tensor.shape or other.dtype != tensor.dtype:
            log.info("weights of %s stay private: %s differs from the model's", model_file, name)
            return False
    agent.model.load_state_dict(saved, assign=True)
    return True


def load_shared_agent(
    settings: Settings,
    extra_overrides: dict[str, Any] | None = None,
    *,
    share_weights: bool = False,
) -> Any:
    """Build the shared agent from BOT_MODEL (a model file or a `zoo:` path) for serving.

    With `share_weights` (model worker processes), the weights are mapped from the file, shared
    with every other process serving it (map_weights).

    Expects the process set up (ParlAI shims, torch threads, logging): bot/__main__.py does it.
    """
    import torch
    from parlai.core.agents import create_agent_from_model_file
    from parlai.core.build_data import modelzoo_path

    device = resolve_device(settings)
    datapath = str((settings.data_dir / "parlai").resolve())
    model_file = settings.model_file
    # zoo: paths are downloaded here, into the data directory, on first use.
    resolved = modelzoo_path(datapath, model_file)
    if not Path(str(resolved) + ".opt").exists():
        raise ConfigError(
            f"no ParlAI model at {model_file}: run `python -m bot train` to build the default "
            "model, or set BOT_MODEL to a model file or a zoo path such as "
            "zoo:blender/blender_90M/model."
        )
    overrides: dict[str, Any] = {
        "interactive_mode": True,
        "skip_generation": False,
        "datapath": datapath,
        "no_cuda": device == "cpu",
        **generation_overrides(settings),
        **(extra_overrides or {}),
    }
    log.info("loading model %s on %s", model_file, device)
    agent = create_agent_from_model_file(str(resolved), overrides)
    if agent is None:  # pragma: no cover - guarded by the .opt check above
        raise ConfigError(f"could not load a ParlAI model from {model_file}")
    agent.model.eval()
    if share_weights and settings.quantize == "none" and device == "cpu":
        shared = map_weights(agent, str(resolved))
        log.info("weights of %s: %s", model_file, "mapped from the file" if shared else "private")
    if settings.quantize == "int8":
        if device != "cpu":
            raise ConfigError(
                "QUANTIZE=int8 works on the CPU only: set MODEL_DEVICE=cpu or QUANTIZE=none."
            )
        # Clones share agent.model, so every conversation gets the quantized weights.
        torch.ao.quantization.quantize_dynamic(
            agent.model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True
        )
    if settings.search_impl == "fast":
        from bot.inference import fastgen

        # batched beam search, same replies; other model types come back unchanged
        agent = fastgen.accelerate(agent)
        agent.encoder_buckets = settings.encoder_buckets  # opt-in: not ParlAI's exact replies
    log.info(
        "model ready: %s, inference=%s beam=%s text_truncate=%s",
        type(agent).__name__,
        agent.opt.get("inference"),
        agent.opt.get("beam_size"),
        getattr(agent, "text_truncate", None),
    )
    return agent
