"""`python -m bot model check PATH`: what a model is, whether and how the service serves it.

For an operator before serving a model file or a `zoo:` path: its shape (parameters, layers,
embedding size, dictionary, context length, decoding options), the runtime path that will
serve it (the batched search or ParlAI's, the continuous scheduler or the micro-batcher, and
why), a short parity probe (a few turns through our loader, clones and scheduler against a
plain `create_agent_from_model_file` agent's observe/act: the replies equal or not), the time
per reply and the process's resident memory. A model that cannot be served (missing files, an
agent the service does not run, an unstaged zoo model offline) is refused by the loader itself
(ConfigError: exit status 2), with the same message the service would log.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bot.config import Settings

# The probe's user turns: one conversation, each turn answered before the next.
PROBE_TURNS = (
    "hi! how are you today?",
    "i just got back from a trip to italy.",
    "what kind of music do you like?",
    "what's your favorite food?",
)
SEED = 0


@dataclass
class Report:
    """What `model check` found; `lines()` is what it prints."""

    model: str
    shape: dict[str, object]
    runtime: dict[str, str]
    ours: list[str] = field(default_factory=list)
    parlai: list[str] = field(default_factory=list)
    ms_per_reply: float = 0.0
    rss_mb: float = 0.0  # after our agent loaded and answered
    rss_both_mb: float = 0.0  # with ParlAI's plain agent loaded too

    @property
    def equal(self) -> bool:
        return self.ours == self.parlai

    def lines(self) -> list[str]:
        out = [f"model: {self.model}"]
        out += [f"  {k}: {v}" for k, v in self.shape.items()]
        out.append("served by:")
        out += [f"  {k}: {v}" for k, v in self.runtime.items()]
        out.append(f"parity: {'equal' if self.equal else 'differs'} ({len(self.ours)} turns)")
        for i, (ours, theirs) in enumerate(zip(self.ours, self.parlai, strict=True), 1):
            mark = "=" if ours == theirs else "!"
            line = f"  {mark} turn {i}: {ours}"
            out.append(line if ours == theirs else f"{line}  |  ParlAI: {theirs}")
        out.append(f"ms per reply: {self.ms_per_reply:.0f} (our path, one chat)")
        out.append(
            f"resident memory: {self.rss_mb:.0f} MB served our way "
            f"({self.rss_both_mb:.0f} MB with ParlAI's agent for the probe as well)"
        )
        return out


def model_path(path: str) -> str:
    """A directory holding `model.opt` means its `model` (as admin variants add reads it)."""
    if path.startswith("zoo:"):
        return path
    candidate = Path(path).expanduser()
    if candidate.is_dir() and (candidate / "model.opt").is_file():
        return str(candidate / "model")
    return str(candidate)


def shape(agent: Any) -> dict[str, object]:
    """The model's size and options as a person reads them."""
    opt = agent.opt
    params = sum(p.numel() for p in agent.model.parameters())
    n_layers = opt.get("n_layers")
    enc = opt.get("n_encoder_layers") if (opt.get("n_encoder_layers") or -1) > 0 else n_layers
    dec = opt.get("n_decoder_layers") if (opt.get("n_decoder_layers") or -1) > 0 else n_layers
    inference = opt.get("inference")
    decoding = f"inference={inference} beam_size={opt.get('beam_size')}"
    decoding += f" beam_min_length={opt.get('beam_min_length')}"
    decoding += f" beam_block_ngram={opt.get('beam_block_ngram')}"
    decoding += f" beam_context_block_ngram={opt.get('beam_context_block_ngram')}"
    decoding += f" beam_length_penalty={opt.get('beam_length_penalty')}"
    if inference in ("topk", "delayedbeam"):
        decoding += f" topk={opt.get('topk')}"
    if inference in ("nucleus", "delayednucleusbeam"):
        decoding += f" topp={opt.get('topp')}"
    if inference in ("delayedbeam", "delayednucleusbeam"):
        decoding += f" beam_delay={opt.get('beam_delay')}"
    return {
        "agent": f"{opt.get('model')} ({type(agent).__name__})",
        "parameters": f"{params:,}",
        "layers": f"{enc} encoder, {dec} decoder",
        "embedding size": f"{opt.get('embedding_size')} (ffn {opt.get('ffn_size')}, "
        f"{opt.get('n_heads')} heads, variant {opt.get('variant')})",
        "dictionary": f"{len(agent.dict):,} tokens, tokenizer {opt.get('dict_tokenizer')}, "
        f"{'lower-cased' if opt.get('dict_lower') else 'cased'} (dict_lower="
        f"{bool(opt.get('dict_lower'))})",
        "context": f"text_truncate={getattr(agent, 'text_truncate', opt.get('text_truncate'))} "
        f"label_truncate={getattr(agent, 'label_truncate', opt.get('label_truncate'))} "
        f"n_positions={_positions(agent)}",
        "decoding": decoding,
    }


def _positions(agent: Any) -> object:
    """The positions the encoder embeds (ParlAI derives them when the options say None)."""
    encoder = getattr(getattr(agent, "model", None), "encoder", None)
    return getattr(encoder, "n_positions", None) or agent.opt.get("n_positions")


def runtime_path(agent: Any, settings: Settings) -> dict[str, str]:
    """Which search and which scheduler serve the agent under these settings, and why."""
    from bot.inference import fastgen
    from bot.inference.fastgen.continuous import continuous_supported
    from bot.inference.fastgen.policy import search_reason
    from bot.inference.fastgen.steppers import bare_model

    if settings.search_impl == "parlai":
        search = "ParlAI's search (SEARCH_IMPL=parlai)"
    elif not fastgen.is_accelerated(agent):
        search = f"ParlAI's search: {type(agent).__name__} is not a stock transformer generator"
    elif (why := search_reason(agent)) is not None:
        search = f"ParlAI's search for each batch ({why}); the batched search otherwise"
    else:
        stepper = (
            "FastDecoder, the stock decoder op for op"
            if fastgen.fast_decoder_supported(bare_model(agent))
            else "GenericDecoder: not the stock transformer decoder"
        )
        search = f"our batched search (SEARCH_IMPL=fast; {stepper})"
    if settings.scheduler == "batch":
        scheduler = "the micro-batcher (SCHEDULER=batch)"
    elif (why := continuous_supported(agent)) is None:
        scheduler = f"continuous batching (SCHEDULER=continuous, up to {settings.batch_max_size})"
    else:
        scheduler = f"the micro-batcher: continuous batching does not apply ({why})"
    return {"search": search, "scheduler": scheduler}


def _seed() -> None:
    import torch

    random.seed(SEED)
    torch.manual_seed(SEED)


async def _our_replies(
    agent: Any, settings: Settings, turns: tuple[str, ...]
) -> tuple[list[str], list[float]]:
    """Replies through the service's path: a clone (new_clone, persona pinning) and the
    scheduler the settings choose (make_decoder); returns the texts and times."""
    from bot.inference.cache import new_clone
    from bot.inference.responder import make_decoder

    decoder = make_decoder(agent, settings)
    await decoder.start()
    clone = new_clone(agent, "")
    texts: list[str] = []
    times: list[float] = []
    try:
        for text in turns:
            _seed()
            started = time.perf_counter()
            result = await decoder.generate(clone, text)
            times.append((time.perf_counter() - started) * 1000.0)
            texts.append(result.text)
    finally:
        await decoder.close()
    return texts, times


def _parlai_replies(
    model_file: str, overrides: dict[str, Any], turns: tuple[str, ...]
) -> list[str]:
    """Replies of a plain ParlAI agent of the same file and options, through observe/act,
    cleaned the way the service cleans this model's replies (`reply_cleaner`: a cased
    byte-level BPE model's verbatim, a lowercased one's detokenised), so that equal tokens
    compare equal."""
    from parlai.core.agents import create_agent_from_model_file

    from bot.inference.batcher import reply_cleaner

    plain = create_agent_from_model_file(model_file, dict(overrides))
    plain.model.eval()
    clean = reply_cleaner(plain.opt)
    out = []
    for text in turns:
        _seed()
        plain.observe({"text": text, "episode_done": False})
        out.append(clean(plain.act()["text"]))
    return out


def rss_mb() -> float:
    """This process's resident memory now, in MB (/proc/self/status VmRSS)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:  # pragma: no cover - not Linux
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def check_model(settings: Settings, path: str, turns: int = len(PROBE_TURNS)) -> Report:
    """Load `path` as the service would (ConfigError when it cannot be served) and probe it."""
    from bot.inference.model import generation_overrides, load_shared_agent

    model = model_path(path)
    served = settings.model_copy(update={"bot_model": model})
    agent = load_shared_agent(served)
    probe = PROBE_TURNS[: max(1, turns)]
    ours, times = asyncio.run(_our_replies(agent, served, probe))
    served_rss = rss_mb()
    overrides = {
        "interactive_mode": True,
        "skip_generation": False,
        "datapath": agent.opt.get("datapath"),
        "no_cuda": bool(agent.opt.get("no_cuda", True)),
        **generation_overrides(served),
    }
    theirs = _parlai_replies(agent.opt["model_file"], overrides, probe)
    return Report(
        model=model,
        shape=shape(agent),
        runtime=runtime_path(agent, served),
        ours=ours,
        parlai=theirs,
        ms_per_reply=sum(times) / len(times),
        rss_mb=served_rss,
        rss_both_mb=rss_mb(),
    )


def run_check(settings: Settings, path: str, turns: int, out: TextIO) -> int:
    """Print the report; 0 when the replies equal ParlAI's, 1 when they differ."""
    report = check_model(settings, path, turns)
    for line in report.lines():
        print(line, file=out)
    return 0 if report.equal else 1
