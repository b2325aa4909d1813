"""What one SQLite transaction costs through each way of calling the driver.

    python -m bench.sqlite_driver [--rounds 300]

The same engine settings (WAL, foreign keys, one pooled connection) and the same statements,
on a file in a temporary folder, one transaction at a time:

- `thread`: SQLAlchemy's aiosqlite dialect as aiosqlite ships it (every call made on a worker
  thread and handed back through the event loop): the service before bot/db/sqlite_inline.py,
  and its background jobs' engine now (`make_engine(..., on_loop=False)`);
- `inline`: the service's engine (bot.db.engine.make_engine): the same aiosqlite connection with
  its calls made on the event loop's thread;
- `sync`: SQLAlchemy's synchronous pysqlite engine, the floor.

A "turn" is four statements and a commit (an insert, a count, an update, a read); a "read" is
one select with no commit. RESULT lines: `sqlite_turn_ms_p50_<way>`, `sqlite_read_ms_p50_<way>`,
and `sqlite_turn_inline_speedup` (thread over inline).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.db.engine import _sqlite_pragmas, make_engine, make_sessionmaker

CREATE = "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"
TURN = (
    ("INSERT INTO t (v) VALUES (:v)", {"v": "x" * 100}),
    ("SELECT count(*) FROM t WHERE id < 10", {}),
    ("UPDATE t SET v = 'y' WHERE id = :i", {"i": 1}),
    ("SELECT v FROM t WHERE id = :i", {"i": 1}),
)
READ = ("SELECT v FROM t WHERE id = :i", {"i": 1})


def _ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def _async_way(engine: AsyncEngine, rounds: int) -> tuple[float, float]:
    sessions = make_sessionmaker(engine)
    async with engine.begin() as conn:
        await conn.execute(text(CREATE))
    turns, reads = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        async with sessions.begin() as db:
            for sql, params in TURN:
                result = await db.execute(text(sql), params)
                if sql.startswith("SELECT"):
                    result.all()
        turns.append(time.perf_counter() - started)
    for _ in range(rounds):
        started = time.perf_counter()
        async with sessions() as db:
            (await db.execute(text(READ[0]), READ[1])).all()
        reads.append(time.perf_counter() - started)
    await engine.dispose()
    return _ms(turns), _ms(reads)


def _sync_way(url: str, rounds: int) -> tuple[float, float]:
    engine = create_engine(url, pool_size=1, max_overflow=0)
    event.listen(engine, "connect", _sqlite_pragmas)
    with engine.begin() as conn:
        conn.execute(text(CREATE))
    turns, reads = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        with engine.begin() as conn:
            for sql, params in TURN:
                result = conn.execute(text(sql), params)
                if sql.startswith("SELECT"):
                    result.all()
        turns.append(time.perf_counter() - started)
    for _ in range(rounds):
        started = time.perf_counter()
        with engine.connect() as conn:
            conn.execute(text(READ[0]), READ[1]).all()
        reads.append(time.perf_counter() - started)
    engine.dispose()
    return _ms(turns), _ms(reads)


def measure(rounds: int) -> dict[str, tuple[float, float]]:
    """Way -> (turn ms p50, read ms p50)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)

        def url(name: str) -> str:
            return f"sqlite+aiosqlite:///{folder / name}"

        def thread_engine() -> AsyncEngine:
            return make_engine(url("thread.db"), on_loop=False)

        ways: dict[str, Callable[[], Any]] = {
            "thread": lambda: asyncio.run(_async_way(thread_engine(), rounds)),
            "inline": lambda: asyncio.run(_async_way(make_engine(url("inline.db")), rounds)),
            "sync": lambda: _sync_way(f"sqlite:///{folder / 'sync.db'}", rounds),
        }
        return {name: way() for name, way in ways.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300, help="transactions of each kind")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    results = measure(args.rounds)
    print(f"SQLite through each way of calling the driver (ms, median of {args.rounds})")
    print(f"{'way':<8}{'turn':>8}{'read':>8}")
    for name, (turn, read) in results.items():
        print(f"{name:<8}{turn:>8.3f}{read:>8.3f}")
    for name, (turn, read) in results.items():
        print(f"RESULT sqlite_turn_ms_p50_{name}={turn:.3f}")
        print(f"RESULT sqlite_read_ms_p50_{name}={read:.3f}")
    speedup = results["thread"][0] / results["inline"][0]
    print(f"RESULT sqlite_turn_inline_speedup={speedup:.2f}")


if __name__ == "__main__":
    main()
