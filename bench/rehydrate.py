"""Rehydration: rebuilding a conversation's agent from the database after eviction or restart.

    python -m bench.rehydrate [--sizes 10,100,1000] [--repeats 30] [--quick]

The service path is what Responder.conversation does on a cache miss:
ConversationStore.load_context(session_id, tail=cache.tail_limit) + AgentCache.rebuild.
The naive path
loads the whole conversation and replays it through observe()/self_observe() of a fresh clone,
as a plain ParlAI agent would. Both on SQLite (a file, WAL) and on PostgreSQL
(TEST_DATABASE_URL, a database created and dropped here; skipped with a note if unreachable).
The model is the BlenderBot-90M-architecture one (BPE dictionary, text_truncate 512).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from bench import common

NAIVE_BUDGET_S = 3.0


@dataclass
class Point:
    """Timings for one backend and history length (milliseconds, one entry per repeat)."""

    backend: str
    messages: int
    load_ms: list[float] = field(default_factory=list)
    rebuild_ms: list[float] = field(default_factory=list)
    naive_ms: list[float] = field(default_factory=list)
    loaded_rows: int = 0
    kept_turns: int = 0

    @property
    def total_ms(self) -> list[float]:
        """load + rebuild, per repeat."""
        return [a + b for a, b in zip(self.load_ms, self.rebuild_ms, strict=True)]

    def summary(self) -> dict[str, Any]:
        """Medians (and p95 of the total) for the table and JSON."""
        return {
            "backend": self.backend,
            "messages": self.messages,
            "repeats": len(self.load_ms),
            "naive_repeats": len(self.naive_ms),
            "load_ms_median": statistics.median(self.load_ms),
            "rebuild_ms_median": statistics.median(self.rebuild_ms),
            "total_ms_median": statistics.median(self.total_ms),
            "total_ms_p95": common.percentile(self.total_ms, 95),
            "naive_ms_median": statistics.median(self.naive_ms) if self.naive_ms else math.nan,
            "loaded_rows": self.loaded_rows,
            "kept_turns": self.kept_turns,
        }


async def _seed(store: Any, sizes: list[int]) -> dict[int, int]:
    """One session per size, filled with a real-text conversation; returns size -> session id."""
    from bot.db import conversations
    from bot.db.models import Message, utcnow

    ids: dict[int, int] = {}
    for chat_id, n in enumerate(sizes, start=1):
        session = await store.active_session(chat_id, chat_id)
        rows = [
            {
                "session_id": session.id,
                "chat_id": chat_id,
                "role": role,
                "text": text,
                "created_at": utcnow(),
            }
            for role, text in common.conversation(chat_id, n)
        ]
        async with store.sessionmaker.begin() as db:
            await conversations.set_session_persona(db, session.id, common.persona(chat_id))
            await db.execute(insert(Message), rows)
        ids[n] = session.id
    return ids


def _naive_replay(agent: Any, persona: str, messages: list[tuple[str, str]]) -> Any:
    """What a plain ParlAI agent does: persona lines in the first observation, then replay."""
    from parlai.core.message import Message

    from bot.persona import join_turns, persona_lines

    clone = agent.clone()
    head = "\n".join(persona_lines(persona))
    for role, text in join_turns(messages):
        if role == "user":
            if head:
                text, head = f"{head}\n{text}", ""
            clone.observe(Message({"text": text, "episode_done": False}))
        else:
            clone.self_observe(Message({"text": text, "episode_done": False}))
    return clone


async def measure_backend(
    backend: str,
    url: str,
    agent: Any,
    sizes: list[int],
    repeats: int,
    naive_repeats: int,
    naive_max: int,
) -> list[Point]:
    """Seed a migrated database at `url`, then time both paths for every size."""
    from bot.conversations.store import ConversationStore
    from bot.db.engine import make_engine, make_sessionmaker
    from bot.inference.cache import AgentCache

    engine = make_engine(url)
    store = ConversationStore(make_sessionmaker(engine))
    cache = AgentCache(agent, capacity=10)
    points: list[Point] = []
    try:
        ids = await _seed(store, sizes)
        for n in sizes:
            sid = ids[n]
            point = Point(backend, n)
            # one untimed pass warms the connection pool and statement caches
            await store.load_context(sid, tail=cache.tail_limit)
            for _ in range(repeats):
                t0 = time.perf_counter()
                ctx = await store.load_context(sid, tail=cache.tail_limit)
                t1 = time.perf_counter()
                entry = cache.rebuild(sid, ctx.persona, [(m.role, m.text) for m in ctx.messages])
                t2 = time.perf_counter()
                point.load_ms.append((t1 - t0) * 1000)
                point.rebuild_ms.append((t2 - t1) * 1000)
                point.loaded_rows = len(ctx.messages)
                point.kept_turns = len(entry.clone.history.history_vecs)
                cache.evict(sid)
            # the naive replay is quadratic: repeat while it stays under a few seconds
            spent = 0.0
            for _ in range(naive_repeats if n <= naive_max else 0):
                if spent > NAIVE_BUDGET_S:
                    break
                t0 = time.perf_counter()
                ctx = await store.load_context(sid, tail=None)
                _naive_replay(agent, ctx.persona, [(m.role, m.text) for m in ctx.messages])
                point.naive_ms.append((time.perf_counter() - t0) * 1000)
                spent += point.naive_ms[-1] / 1000
            points.append(point)
            s = point.summary()
            print(
                f"  {backend:10s} {n:5d} messages: {s['total_ms_median']:.2f} ms "
                f"(naive {s['naive_ms_median']:.1f} ms)",
                flush=True,
            )
    finally:
        await engine.dispose()
    return points


def _sqlite(agent: Any, sizes: list[int], repeats: int, naive: int, naive_max: int) -> list[Point]:
    from bot.db.migrate import upgrade

    with tempfile.TemporaryDirectory(prefix="bench-rehydrate-") as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'bench.sqlite3'}"
        upgrade(url)
        return asyncio.run(measure_backend("sqlite", url, agent, sizes, repeats, naive, naive_max))


def _postgres(
    agent: Any, sizes: list[int], repeats: int, naive: int, naive_max: int
) -> list[Point] | str:
    from bot.db.migrate import upgrade
    from tests.support import dbutil

    why = dbutil.postgres_unavailable()
    if why is not None:
        return f"PostgreSQL skipped: not reachable at {dbutil.PG_URL} ({why})"
    url = dbutil.create_pg_database()
    try:
        upgrade(url)
        return asyncio.run(
            measure_backend("postgresql", url, agent, sizes, repeats, naive, naive_max)
        )
    finally:
        dbutil.drop_pg_database(url)


def main() -> None:
    """Measure, print the table, RESULT lines, JSON and PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--naive-repeats", type=int, default=5)
    parser.add_argument(
        "--naive-max", type=int, default=1000, help="no naive replay beyond this many messages"
    )
    parser.add_argument(
        "--quick", action="store_true", help="5 repeats, naive replay only up to 100 messages"
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.naive_repeats, args.naive_max = 5, 1, 100
    sizes = [int(s) for s in args.sizes.split(",")]

    model_file = common.build_bench_model()
    agent = common.load_agent(model_file)
    print(
        f"rehydrate: histories of {sizes} messages, {args.repeats} rebuilds and up to "
        f"{args.naive_repeats} naive replays ({NAIVE_BUDGET_S:.0f} s budget) each; "
        f"text_truncate={agent.text_truncate}",
        flush=True,
    )
    points = _sqlite(agent, sizes, args.repeats, args.naive_repeats, args.naive_max)
    pg = _postgres(agent, sizes, args.repeats, args.naive_repeats, args.naive_max)
    notes: list[str] = []
    if isinstance(pg, str):
        notes.append(pg)
        print(pg, flush=True)
    else:
        points += pg

    summaries = [p.summary() for p in points]
    common.print_table(
        "Rebuilding a conversation's agent from the database (median ms)",
        [
            "backend",
            "messages",
            "rows read",
            "load",
            "rebuild",
            "total",
            "p95",
            "naive replay",
            "x",
        ],
        [
            (
                s["backend"],
                s["messages"],
                s["loaded_rows"],
                s["load_ms_median"],
                s["rebuild_ms_median"],
                s["total_ms_median"],
                s["total_ms_p95"],
                s["naive_ms_median"],
                "-"
                if math.isnan(s["naive_ms_median"])
                else f"{s['naive_ms_median'] / s['total_ms_median']:.0f}x",
            )
            for s in summaries
        ],
    )
    print(
        "load = ConversationStore.load_context(tail=cache.tail_limit), "
        "rebuild = AgentCache.rebuild; "
        "naive = load every message + replay through observe()/self_observe()"
    )
    for note in notes:
        print(note)
    sqlite = {s["messages"]: s for s in summaries if s["backend"] == "sqlite"}
    common.write_json(
        "rehydrate",
        {
            "points": summaries,
            "raw": [p.__dict__ for p in points],
            "notes": notes,
            "quick": args.quick,
        },
    )
    fig, axes = common.new_figure()
    ax = axes[0][0]
    for backend, style, colors in (
        ("sqlite", "-", ("tab:blue", "tab:red")),
        ("postgresql", "--", ("tab:cyan", "tab:purple")),
    ):
        rows = [s for s in summaries if s["backend"] == backend]
        if not rows:
            continue
        xs = [s["messages"] for s in rows]
        ax.plot(
            xs,
            [s["total_ms_median"] for s in rows],
            style,
            marker="o",
            color=colors[0],
            label=f"service, {backend}",
        )
        naive = [(s["messages"], s["naive_ms_median"]) for s in rows if s["naive_repeats"]]
        ax.plot(
            [x for x, _ in naive],
            [y for _, y in naive],
            style,
            marker="x",
            color=colors[1],
            label=f"naive replay, {backend}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages in the conversation")
    ax.set_ylabel("time to rebuild the agent (ms, median)")
    ax.set_title("Rehydration from the database")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    common.save_figure("rehydrate", fig)
    results = {}
    for n in (100, 1000):
        if n in sqlite:
            results[f"rehydrate_ms_{n}"] = float(sqlite[n]["total_ms_median"])
    common.emit_results(results)


if __name__ == "__main__":
    main()
