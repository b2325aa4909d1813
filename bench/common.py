"""Shared by every benchmark: the BlenderBot-90M-architecture model, synthetic conversations,
memory readings, and the three outputs (a table, `RESULT name=value` lines, JSON + PNG)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
# The model is ~350 MB: kept out of the repository, rebuilt when missing.
MODEL_DIR = Path(
    os.environ.get("BENCH_MODEL_DIR", Path(tempfile.gettempdir()) / "bot-bench-blender90m")
)

# BlenderBot-90M (zoo:blender/blender_90M): 8 encoder + 8 decoder layers, 512 dims, 16 heads,
# FFN 2048, a 54,944-entry BPE dictionary, 512-token context.
DICT_SIZE = 54_944
N_LAYERS = 8
EMBEDDING_SIZE = 512
N_HEADS = 16
FFN_SIZE = 2048
TEXT_TRUNCATE = 512
# Every reply is exactly this long (beam_min_length == label_truncate), so runs compare.
REPLY_TOKENS = 20
# ParlAI's Blender generation settings.
BLENDER_BEAM = {
    "inference": "beam",
    "beam_size": 10,
    "beam_min_length": REPLY_TOKENS,
    "beam_block_ngram": 3,
    "beam_context_block_ngram": 3,
}
GREEDY = {
    "inference": "greedy",
    "beam_size": 1,
    "beam_block_ngram": 3,
    "beam_context_block_ngram": 3,
}


# --- the model ------------------------------------------------------------------------------


def _model_args(model_file: Path) -> list[str]:
    return [
        "--model", "transformer/generator",
        "--model-file", str(model_file),
        "--dict-file", str(model_file) + ".dict",
        "--dict-tokenizer", "bpe",
        "--dict-lower", "true",
        "--n-layers", str(N_LAYERS),
        "--n-encoder-layers", str(N_LAYERS),
        "--n-decoder-layers", str(N_LAYERS),
        "--embedding-size", str(EMBEDDING_SIZE),
        "--ffn-size", str(FFN_SIZE),
        "--n-heads", str(N_HEADS),
        "--n-positions", str(TEXT_TRUNCATE),
        "--variant", "xlm",
        "--activation", "gelu",
        "--learn-positional-embeddings", "true",
        "--embeddings-scale", "true",
        "--text-truncate", str(TEXT_TRUNCATE),
        "--truncate", str(TEXT_TRUNCATE),
        "--label-truncate", str(REPLY_TOKENS),
        "--inference", "beam",
        "--beam-size", "10",
        "--beam-min-length", str(REPLY_TOKENS),
        "--beam-block-ngram", "3",
        "--beam-context-block-ngram", "3",
        "--skip-generation", "false",
        "--no-cuda",
        "--datatype", "valid",
    ]  # fmt: skip


def build_bench_model(directory: Path | None = None) -> str:
    """Build (once) a random-weight model with BlenderBot-90M's architecture; returns its path.

    The dictionary is real BPE learned on the chitchat dataset (so tokenizing costs what it does
    in production), padded with unused entries to BlenderBot-90M's 54,944, which sizes the
    embedding and the output projection exactly like the original. Built the way the tests' tiny
    model is (tests/support/tinymodel.py), only bigger.
    """
    from tests.support.tinymodel import build_model

    directory = directory or MODEL_DIR
    started = time.perf_counter()
    filler = 0

    def announce() -> None:
        nonlocal started
        print(f"building the BlenderBot-90M-architecture model in {directory} (once)", flush=True)
        started = time.perf_counter()
        os.environ.setdefault("TQDM_DISABLE", "1")  # subword-nmt's progress bar

    def fill_dictionary(dictionary: Any, dict_file: str) -> None:
        nonlocal filler
        for text in corpus():
            dictionary.add_to_dict(dictionary.tokenize(text))
        # learns the BPE codecs and keeps only BPE tokens
        dictionary.save(dict_file, sort=True)
        while len(dictionary) < DICT_SIZE:
            token = f"__unused{filler}__"
            dictionary.add_token(token)
            dictionary.freq[token] = 1
            filler += 1
        dictionary.resize_to_max(DICT_SIZE)
        dictionary.save(dict_file, sort=False)

    def built(agent: Any) -> None:
        assert len(agent.dict) == DICT_SIZE, len(agent.dict)
        print(
            f"model built in {time.perf_counter() - started:.0f} s "
            f"({sum(p.numel() for p in agent.model.parameters()) / 1e6:.1f} M parameters, "
            f"{DICT_SIZE - filler} BPE tokens + {filler} unused)",
            flush=True,
        )

    return build_model(directory, _model_args, fill_dictionary, announce=announce, built=built)


def load_agent(
    model_file: str,
    generation: dict[str, Any] | None = None,
    *,
    threads: int | None = None,
    quantize: bool = False,
    search_impl: str | None = None,
    device: str = "cpu",
) -> Any:
    """The shared agent, loaded the way the service loads it (bot.inference.model), on
    `device` (MODEL_DEVICE: cpu or cuda).

    `search_impl` "parlai" keeps ParlAI's own tree search (stock ParlAI); None: the service's.
    """
    from bot.config import Settings
    from bot.inference import compat
    from bot.inference.model import load_shared_agent, set_torch_threads

    # A benchmark is its own composition root: the process set-up bot/__main__.py does.
    compat.apply()
    set_torch_threads(threads)
    gen = dict(BLENDER_BEAM if generation is None else generation)
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        bot_model=model_file,
        data_dir=Path(model_file).parent / "data",
        model_device=device,
        torch_threads=threads,
        inference=gen.pop("inference"),
        beam_size=gen.pop("beam_size"),
        beam_block_ngram=gen.pop("beam_block_ngram"),
        beam_context_block_ngram=gen.pop("beam_context_block_ngram"),
        beam_min_length=gen.pop("beam_min_length", None),
    )
    if search_impl:
        settings = settings.model_copy(update={"search_impl": search_impl})
    agent = load_shared_agent(settings)
    if quantize:
        quantize_linear(agent)
    return agent


def cuda_refusal(command: str) -> str | None:
    """Why `command --device cuda` cannot run here (None: it can): torch sees no CUDA device.
    Loads torch, which only `--device cuda` asks for."""
    import torch

    if torch.cuda.is_available():
        return None
    return (
        f"{command} --device cuda: torch sees no CUDA device on this machine "
        "(torch.cuda.is_available() is false). Run it on a machine with a GPU and a CUDA build "
        "of torch, or use --device cpu."
    )


def sync(device: str) -> None:
    """Wait for the GPU's queued work (on cuda), so a timer read after it counts that work."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def quantize_linear(agent: Any) -> None:
    """int8 dynamic quantization of every nn.Linear of the shared model, in place."""
    import torch

    torch.ao.quantization.quantize_dynamic(
        agent.model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True
    )


# --- conversations --------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def corpus() -> list[str]:
    """Real chat utterances (the chitchat dataset ships with its package), in a fixed order."""
    import chitchat_dataset

    out: list[str] = []
    for convo in chitchat_dataset.Dataset().values():
        for turn in convo["messages"]:
            for msg in turn:
                text = " ".join(str(msg["text"]).split())
                if 2 <= len(text) <= 200:
                    out.append(text)
    return out


PERSONA_FACTS = [
    "I love hiking in the mountains.",
    "I have two dogs.",
    "I work as a nurse.",
    "My favorite food is pizza.",
    "I play the guitar in a band.",
    "I grew up on a farm.",
    "I am learning to cook Thai food.",
    "I read a book every week.",
    "I live near the beach.",
    "My sister is a doctor.",
]
NAMES = ["Sarah", "Jessica", "Tom", "Maria", "Ken", "Aisha", "Lena", "Omar", "Yuki", "Pedro"]


def persona(user: int) -> str:
    """A four-sentence persona, different per user."""
    rng = random.Random(user)
    facts = rng.sample(PERSONA_FACTS, 3)
    return f"My name is {NAMES[user % len(NAMES)]}. " + " ".join(facts)


def conversation(user: int, n_messages: int) -> list[tuple[str, str]]:
    """`n_messages` alternating (role, text) messages, user first, different per user."""
    texts = corpus()
    rng = random.Random(1_000_003 * (user + 1))
    start = rng.randrange(len(texts) - n_messages)
    return [("user" if i % 2 == 0 else "bot", texts[start + i]) for i in range(n_messages)]


def user_message(user: int, turn: int = 0) -> str:
    """The new message a user sends."""
    texts = corpus()
    return texts[random.Random(7919 * (user + 1) + turn).randrange(len(texts))]


# --- memory ---------------------------------------------------------------------------------


def settle() -> None:
    """Collect garbage and hand freed heap back to the OS, so RSS readings are stable."""
    gc.collect()
    gc.collect()
    if platform.system() == "Linux":
        # not glibc: RSS is a little noisier, nothing else changes
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of this (or another) process."""
    import psutil

    return int(psutil.Process(pid).memory_info().rss)


def uss_bytes(pid: int | None = None) -> int:
    """Unique set size: memory freed if the process exited (shared pages not counted)."""
    import psutil

    return int(psutil.Process(pid).memory_full_info().uss)


# --- measuring ------------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (no interpolation), NaN on an empty list."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Machine:
    """What the figures were measured on (load: 1-minute load average when written)."""

    cpus: int
    load_1min: float
    python: str
    torch: str
    when: str


def machine() -> Machine:
    """This machine, with its load average so a busy run can be recognised."""
    from importlib.metadata import version

    return Machine(
        cpus=os.cpu_count() or 1,
        load_1min=round(os.getloadavg()[0], 2),
        python=platform.python_version(),
        torch=version("torch"),
        when=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def run_worker(module: str, args: Iterable[str], timeout: float = 1800) -> dict[str, Any]:
    """Run `python -m module args` in a fresh process; it prints one `JSON {...}` line."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("JSON "):
            data: dict[str, Any] = json.loads(line[5:])
            return data
    raise RuntimeError(
        f"worker {module} {' '.join(args)} failed (exit {proc.returncode}):\n"
        f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )


def worker_reply(data: dict[str, Any]) -> None:
    """A worker's answer to run_worker."""
    print("JSON " + json.dumps(data), flush=True)


# --- output ---------------------------------------------------------------------------------


def fmt(value: object) -> str:
    """A table cell: floats to 3 significant figures, large ones without decimals."""
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(title: str, headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A plain-text table with right-aligned columns."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = [title, "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def print_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Print a table with a blank line around it."""
    print()
    print(table(title, headers, list(rows)))
    print(flush=True)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table; cells as `fmt` writes them, number columns
    right-aligned."""
    body = [list(row) for row in rows]
    numeric = [
        bool(body) and all(isinstance(row[i], int | float) for row in body)
        for i in range(len(headers))
    ]
    lines = ["| " + " | ".join(headers) + " |"]
    lines.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def emit_results(results: dict[str, float]) -> None:
    """The machine-readable lines every benchmark ends with."""
    for name, value in results.items():
        print(f"RESULT {name}={value:.6g}", flush=True)


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """bench/results/<name>.json, with the machine it was measured on."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    body = {"benchmark": name, "machine": machine().__dict__, **payload}
    path.write_text(json.dumps(body, indent=2, default=str) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return path


def new_figure(ncols: int = 1, width: float = 6.0) -> tuple[Any, Any]:
    """A matplotlib figure on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 4.2), squeeze=False)
    return fig, axes


def save_figure(name: str, fig: Any) -> Path:
    """bench/results/<name>.png."""
    import matplotlib.pyplot as plt

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path.relative_to(ROOT)}")
    return path
