"""Load the one shared ParlAI agent every conversation is cloned from."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

from bot.config import ConfigError, Settings
from bot.model_files import SERVED_AGENTS, unservable_model, zoo_refusal

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


# Torch intra-op threads of a model process when neither TORCH_THREADS nor WORKER_THREADS nor
# a variant's `threads` says: one. On a shared host more threads collapse (the figure in
# docs/configuration.md: greedy batch 8 beside a busy process); the service scales by
# processes (variants, replicas), each with its own thread.
MODEL_THREADS = 1


def passive_waiting() -> None:
    """OpenMP threads that sleep when idle instead of spinning (OMP_WAIT_POLICY=PASSIVE, and
    KMP_BLOCKTIME=0 for Intel's runtime), unless the environment already says. OpenMP reads
    these when torch loads it: call before the process imports torch (set_torch_threads does).
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("KMP_BLOCKTIME", "0")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS says; else all)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def set_torch_threads(threads: int | None, default: int | None = MODEL_THREADS) -> None:
    """Torch's intra-op thread count for this process: `threads` (TORCH_THREADS, a worker's or
    variant's), else `default` (one per model process; None keeps torch's own: one per core,
    for training). Sets passive waiting first (see passive_waiting).

    Process-wide: a model process calls it once, before the model loads or trains, ideally
    before anything imports torch.
    """
    passive_waiting()
    n = threads or default
    cores = usable_cores()
    if n and n > cores:
        # A variant's `threads` is bounded when it is stored, not by this host's cores: more
        # threads than cores only slow the process down.
        log.warning(
            "%d torch threads asked for, but this machine has %d cores: using %d", n, cores, cores
        )
        n = cores
    if n:
        import torch

        torch.set_num_threads(n)


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


def projection_kind(settings: Settings) -> Literal["int8", "fused"] | None:
    """The fast search's output projection for these settings (fastgen/projection.py): int8
    under QUANTIZE=int8; None (ParlAI's own, bit for bit) by default."""
    if settings.quantize == "int8":
        return "int8"
    return None


def model_dtype(settings: Settings, device: str) -> Any:
    """The torch dtype DTYPE casts the model to on `device` (None: fp32, as loaded), or a
    ConfigError saying what to set where this machine cannot do it."""
    if settings.dtype == "fp32":
        return None
    import torch

    from bot.inference import hardware

    name = settings.dtype.upper()
    if settings.quantize != "none":
        raise ConfigError(
            f"DTYPE={settings.dtype} and QUANTIZE={settings.quantize} exclude each other: "
            "set DTYPE=fp32 to quantize, or QUANTIZE=none to cast."
        )
    if device == "cuda":
        if settings.dtype == "bf16" and not torch.cuda.is_bf16_supported():
            raise ConfigError("DTYPE=bf16: this GPU has no bf16; set DTYPE=fp16 or fp32.")
        return torch.bfloat16 if settings.dtype == "bf16" else torch.float16
    if settings.dtype == "fp16":
        raise ConfigError(
            "DTYPE=fp16 needs a GPU (MODEL_DEVICE=cuda); on the CPU set DTYPE=bf16 (with AMX "
            "or AVX-512-bf16) or DTYPE=fp32."
        )
    if not hardware.has_bf16():
        raise ConfigError(
            f"DTYPE={name} on the CPU needs AMX or AVX-512-bf16 (cpuinfo flag amx_bf16 or "
            "avx512_bf16), which this CPU lacks: without them bf16 is emulated and slower than "
            "fp32. Set DTYPE=fp32 (or QUANTIZE=int8 for a faster CPU mode)."
        )
    return torch.bfloat16


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


def not_a_generator(model_file: str) -> str | None:
    """None when the `.opt`'s agent class is a TorchGeneratorAgent subclass, else why it is
    not served (the names bot.model_files refuses are refused before this imports anything)."""
    import json

    from parlai.core.loader import load_agent_module
    from parlai.core.torch_generator_agent import TorchGeneratorAgent

    name = json.loads(Path(model_file + ".opt").read_text(encoding="utf-8")).get("model")
    try:
        cls = load_agent_module(name)
    except Exception as err:  # noqa: BLE001 - an unknown or broken agent module
        return f"the model at {model_file} names agent {name!r}, which ParlAI cannot load ({err})"
    if isinstance(cls, type) and issubclass(cls, TorchGeneratorAgent):
        return None
    return (
        f"the model at {model_file} cannot be served: its agent {name} is not a generator "
        f"({getattr(cls, '__name__', cls)}). Supported: {SERVED_AGENTS}"
    )


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
    from parlai.core.agents import create_agent_from_model_file

    device = resolve_device(settings)
    dtype = model_dtype(settings, device)  # refused before the model loads
    datapath = str((settings.data_dir / "parlai").resolve())
    model_file = settings.model_file
    resolved = _servable_model(model_file, datapath)
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
    if share_weights and settings.quantize == "none" and dtype is None and device == "cpu":
        shared = map_weights(agent, str(resolved))
        log.info("weights of %s: %s", model_file, "mapped from the file" if shared else "private")
    agent = _prepared(agent, settings, device, dtype)
    log.info(
        "model ready: %s, inference=%s beam=%s text_truncate=%s",
        type(agent).__name__,
        agent.opt.get("inference"),
        agent.opt.get("beam_size"),
        getattr(agent, "text_truncate", None),
    )
    return agent


def _servable_model(model_file: str, datapath: str) -> Any:
    """BOT_MODEL's model file, resolved (a zoo: path downloaded); ConfigError where it is
    missing, incomplete or not a generator."""
    from parlai.core.build_data import modelzoo_path

    # zoo: paths are downloaded here, into the data directory, on first use; a model not
    # staged there while the zoo is unreachable is refused within seconds, naming where its
    # files go, instead of ParlAI's 15 s of retries.
    if model_file.startswith("zoo:") and (refusal := zoo_refusal(datapath, model_file)):
        raise ConfigError(f"BOT_MODEL {refusal}")
    resolved = modelzoo_path(datapath, model_file)
    if not Path(str(resolved) + ".opt").exists():
        raise ConfigError(
            f"no ParlAI model at {model_file}: run `python -m bot train` to build the default "
            "model, or set BOT_MODEL to a model file or a zoo path such as "
            "zoo:blender/blender_90M/model."
        )
    # ParlAI would build a model with random weights where the weights file is missing, and
    # fail at the first turn without the dictionary: neither is ever served.
    incomplete = unservable_model(resolved)
    if incomplete is not None:
        raise ConfigError(incomplete)
    refused = not_a_generator(str(resolved))
    if refused is not None:
        raise ConfigError(refused)
    return resolved


def _prepared(agent: Any, settings: Settings, device: str, dtype: Any) -> Any:
    """The loaded agent quantized or cast as the settings say, and with the batched search
    (SEARCH_IMPL=fast)."""
    import torch

    if settings.quantize == "int8":
        if device != "cpu":
            raise ConfigError(
                "QUANTIZE=int8 works on the CPU only: set MODEL_DEVICE=cpu or QUANTIZE=none."
            )
        # Clones share agent.model, so every conversation gets the quantized weights.
        torch.ao.quantization.quantize_dynamic(
            agent.model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True
        )
    if dtype is not None:
        # in place: every clone shares agent.model, so one cast copy of the weights; the
        # search's log-softmax and scores stay fp32 (fastgen/beam.py)
        agent.model.to(dtype)
    if settings.search_impl == "fast":
        from bot.inference import fastgen

        # batched beam search, same replies; other model types come back unchanged
        agent = fastgen.accelerate(agent)
        kind = projection_kind(settings)
        if kind is not None and fastgen.fast_decoder_supported(agent.model):
            # the output projection in int8 too (fastgen/projection.py); a cast model's is
            # ParlAI's F.linear in its dtype
            fastgen.projection.prepare(agent.model, kind)
        if settings.quantize == "int8":
            if fastgen.fast_decoder_supported(agent.model):
                # each self-attention's q / k / v as one int8 product (fastgen/qkv.py); before
                # the encoder's swap below, which then takes the merged product
                fastgen.qkv.prepare(agent.model)
            # the encoder's self-attention as one fused kernel (fastgen/encoder.py)
            fastgen.encoder.prepare(agent.model)
        agent.encoder_buckets = settings.encoder_buckets  # opt-in: not ParlAI's exact replies
    return agent
