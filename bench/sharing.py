"""Memory of model workers: variants of one model file share its weights.

    python -m bench.sharing [--conversations 1000] [--quick]

Every case starts its own model worker processes (bot.engine.backends.local.ModelProcess, spawn,
exactly as the service does), on the BlenderBot-90M-architecture model
(bench/common.build_bench_model), and answers one turn on each so that everything lazy is
loaded. Cases:
  one worker                 one variant
  two, one file (mapped)     two variants of one file (beam and greedy): weights mapped from
                             the file (torch.load(mmap=True), the default), one copy in the
                             page cache for both
  two, one file (private)    the same two variants with mapping off: each reads its own copy
                             (what a worker did before)
  two files                  two variants of two copies of the file: nothing to share
Figure: the workers' total PSS (proportional set size: a page two processes share counts half
in each, so the sum is what the workers really cost). Then the cost of one more cached
conversation inside a worker: `--conversations` chats through one worker (its cache large
enough to keep them all); their cost is the worker's RSS with them cached minus its RSS once
they are evicted, divided by their number (RSS measured after gc and malloc_trim). The raw
growth from the start is printed too: it includes the allocator's high-water mark from
generating, which no conversation owns and which evicting them does not give back.
With the cache full, `sharing_worker_stats_ms` and `sharing_worker_stats_memory_ms` time a
status report from the worker without and with its memory figures: measuring memory holds the
GIL, so the worker's inference waits that long (the heartbeat's report every few seconds asked
for memory until 2026-12-04 and dropped it).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import common
from bot.config import Settings
from bot.db.conversations import MessageRow, SessionRow
from bot.engine.backends.local import ModelProcess
from bot.engine.protocol import ConversationContext
from bot.engine.spec import ProcessSpec

MB = 2**20


class _Contexts:
    """A ContextSource for sessions that exist only here: a persona and a short history."""

    async def load_context(
        self, session_id: int, tail: int | None, upto: int | None = None
    ) -> ConversationContext:
        turns = common.conversation(session_id, 4)
        messages = [
            MessageRow(i + 1, session_id, role, text) for i, (role, text) in enumerate(turns)
        ]
        return ConversationContext(session_id, session_id, common.persona(session_id), messages)


def _session(i: int) -> SessionRow:
    return SessionRow(i, i, None, common.persona(i), "active", datetime.now(UTC), None, 4)


def _settings(model_file: str, **generation: Any) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        bot_model=model_file,
        data_dir=Path(model_file).parent / "data",
        model_device="cpu",
        agent_cache_size=100_000,
        batch_max_wait_ms=5,
        **generation,
    )


async def _workers(specs: list[ProcessSpec]) -> list[ModelProcess]:
    handles = [ModelProcess(spec, _Contexts()) for spec in specs]
    await asyncio.gather(*(h.start() for h in handles))
    await asyncio.gather(*(h.generate(_session(1000 + i), "hello") for i, h in enumerate(handles)))
    return handles


async def _case(specs: list[ProcessSpec]) -> dict[str, float]:
    handles = await _workers(specs)
    try:
        figures = [await h.stats(memory=True) for h in handles]
    finally:
        await asyncio.gather(*(h.close() for h in handles))
    return {
        "workers": len(handles),
        "pss_mb": sum(f["pss"] for f in figures) / MB,
        "rss_mb": sum(f["rss"] for f in figures) / MB,
    }


async def _per_conversation(spec: ProcessSpec, n: int) -> dict[str, float]:
    [handle] = await _workers([spec])
    try:
        before = await handle.stats(memory=True)
        started = time.perf_counter()
        batch = 64
        for first in range(0, n, batch):
            await asyncio.gather(
                *(
                    handle.generate(_session(i), "tell me more")
                    for i in range(first, min(n, first + batch))
                )
            )
        elapsed = time.perf_counter() - started
        after = await handle.stats(memory=True)
        # What a status report costs the worker with its cache full: it answers on its event
        # loop, and measuring memory (a garbage collection, a walk of its pages) holds the GIL,
        # so the inference thread waits as long (the heartbeat asked every few seconds).
        pauses = {}
        for memory in (False, True):
            took = []
            for _ in range(3):
                asked = time.perf_counter()
                await handle.stats(memory=memory)
                took.append((time.perf_counter() - asked) * 1000)
            pauses[memory] = sorted(took)[1]
        for i in range(n):
            handle.evict(i)
        evicted = await handle.stats(memory=True)
    finally:
        await handle.close()
    assert after["cached"] - before["cached"] == n, (before, after)
    assert evicted["cached"] == before["cached"], (before, evicted)
    return {
        "conversations": n,
        # What the cached conversations hold: RSS with them minus RSS once they are evicted.
        "kb_per_conversation": (after["rss"] - evicted["rss"]) / n / 1024,
        # All growth since the start, including the allocator's high-water mark from
        # generating (freed memory malloc keeps for reuse): not owned by any conversation.
        "kb_growth_per_conversation": (after["rss"] - before["rss"]) / n / 1024,
        "seconds": elapsed,
        "stats_ms": pauses[False],
        "stats_memory_ms": pauses[True],
    }


def _spec(name: str, settings: Settings, share: bool = True) -> ProcessSpec:
    return ProcessSpec(name, settings, threads=1, log_level="WARNING", share_weights=share)


def _copy_model(model: str, directory: str) -> str:
    """A second copy of the model's files (other pages in the page cache)."""
    copy = str(Path(directory) / "model")
    for suffix in ("", ".opt", ".dict", ".dict.codecs"):
        source = Path(model + suffix)
        if source.exists():
            shutil.copy(source, copy + suffix)
    return copy


async def main_async(args: argparse.Namespace, model: str, copy: str, size_mb: float) -> None:
    beam = _settings(model, inference="beam", beam_size=2, beam_min_length=2)
    greedy = _settings(model, inference="greedy", beam_size=1)
    other = _settings(copy, inference="greedy", beam_size=1)
    cases = {
        "one worker": [_spec("a", beam)],
        "two, one file (mapped)": [_spec("a", beam), _spec("b", greedy)],
        "two, one file (private)": [_spec("a", beam, False), _spec("b", greedy, False)],
        "two files": [_spec("a", beam), _spec("b", other)],
    }
    results = {}
    for name, specs in cases.items():
        common.settle()
        results[name] = await _case(specs)
        print(f"{name}: {results[name]}", flush=True)
    conversation = await _per_conversation(_spec("a", greedy), args.conversations)
    one = results["one worker"]["pss_mb"]
    common.print_table(
        f"Model workers' memory (weights file {size_mb:.0f} MB; PSS summed over the workers)",
        ["case", "workers", "PSS MB", "RSS MB", "vs one worker"],
        [
            (
                name,
                r["workers"],
                f"{r['pss_mb']:.0f}",
                f"{r['rss_mb']:.0f}",
                f"{r['pss_mb'] / one:.2f}x",
            )
            for name, r in results.items()
        ],
    )
    per, growth = conversation["kb_per_conversation"], conversation["kb_growth_per_conversation"]
    print(
        f"one more cached conversation inside a worker: {per:.1f} KB "
        f"({args.conversations} conversations; RSS growth from the start {growth:.1f} KB each)"
    )
    print(
        f"a status report from that worker (median of 3): {conversation['stats_ms']:.1f} ms, "
        f"{conversation['stats_memory_ms']:.1f} ms with its memory (the worker's loop and "
        "inference wait as long)"
    )
    common.emit_results(
        {
            "sharing_weights_mb": size_mb,
            "sharing_one_worker_pss_mb": one,
            "sharing_two_same_file_mapped_pss_mb": results["two, one file (mapped)"]["pss_mb"],
            "sharing_two_same_file_private_pss_mb": results["two, one file (private)"]["pss_mb"],
            "sharing_two_files_pss_mb": results["two files"]["pss_mb"],
            "sharing_worker_kb_per_conversation": conversation["kb_per_conversation"],
            "sharing_worker_stats_ms": conversation["stats_ms"],
            "sharing_worker_stats_memory_ms": conversation["stats_memory_ms"],
        }
    )
    common.write_json(
        "sharing", {"weights_mb": size_mb, "cases": results, "per_conversation": conversation}
    )


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.conversations = 64
    model = common.build_bench_model()
    size_mb = Path(model).stat().st_size / MB
    with tempfile.TemporaryDirectory(prefix="bench-sharing-") as tmp:
        asyncio.run(main_async(args, model, _copy_model(model, tmp), size_mb))


if __name__ == "__main__":
    main()
