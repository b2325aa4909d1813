"""Database round trips of one turn: what the service's own time at load is made of.

    python -m bench.roundtrips [--turns 20] [--before DIR]

At 50 users the time outside the model is a chain of database waits that queue for the one
SQLite connection (docs/benchmarks.md), and `bench.e2e`'s latencies move by hundreds of ms from
run to run. This counts the chain itself, which does not move: the service runs in-process on
an SQLite file against the loopback Bot API with a responder that answers at once
(tests/support/service_harness.py's EchoResponder), and SQLAlchemy's events count connection
checkouts (one round trip each: every database call takes the connection), statements and
commits, and how long the connection was checked out (`held_ms`: what the turns of a burst queue
for), from a user's message until the bench saw its reply at the Bot API (so the "sent"
commit that follows the request is mostly in), and for the whole turn until
the service is idle again (the lease releases and rescans after the reply; the 1-second polls
that fall into a turn are counted too, so the medians are given). Each turn is a new chat's
first message (it starts a conversation), one at a time.

`--before DIR` counts another checkout's code first (`git worktree add /tmp/before REV`), in a
process of its own, for a before/after in one run. RESULT lines: `db_checkouts_to_reply`,
`db_statements_to_reply`, `db_commits_to_reply`, `db_held_ms_to_reply`, the same `_per_turn`,
and all of them again with `_before`. `db_delivery_bookkeeping_ms` (median of 480) is the
Python one delivery's database steps cost, each in its own session as delivery takes them (the
lease, the read, the "sent" mark, the read that finds none left, the lease given back): the
held times above move by 15% from run to run, this by a few percent. `db_turn_store_ms`
(median of 480) is the same for a text turn's store calls: the chat's conversation, then the
turn's one transaction (user message, reply, outbox row, the update closed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("checkouts", "statements", "commits", "held_ms")


async def count(turns: int) -> dict[str, list[dict[str, float]]]:
    """Per turn: the counts until the reply was sent ("to_reply") and for the whole turn."""
    from sqlalchemy import event

    from tests.support.fakebotapi import FakeBotAPI
    from tests.support.service_harness import (
        TOKEN,
        EchoResponder,
        make_settings,
        running_service,
        settled,
    )

    counts: dict[str, float] = dict.fromkeys(KINDS, 0)

    def bump(kind: str) -> Any:
        def listener(*_args: object) -> None:
            counts[kind] += 1

        return listener

    def checked_out(_dbapi: object, record: Any, _proxy: object) -> None:
        record.info["checked_out_at"] = time.perf_counter()

    def checked_in(_dbapi: object, record: Any) -> None:
        at = record.info.pop("checked_out_at", None)
        if at is not None:
            counts["held_ms"] += (time.perf_counter() - at) * 1000

    to_reply: list[dict[str, float]] = []
    whole: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'bot.sqlite3'}"
        async with FakeBotAPI(TOKEN) as api:
            settings = make_settings(url, api, Path(tmp), log_level="WARNING")
            async with running_service(settings, EchoResponder()) as service:
                engine = service.db_engine.sync_engine
                event.listen(engine.pool, "checkout", bump("checkouts"))
                event.listen(engine.pool, "checkout", checked_out)
                event.listen(engine.pool, "checkin", checked_in)
                event.listen(engine, "before_cursor_execute", bump("statements"))
                event.listen(engine, "commit", bump("commits"))
                await settled(service, api)
                await asyncio.sleep(1.5)  # what start-up left (lease releases) is done
                for i in range(turns):
                    chat = 1000 + i
                    start = dict(counts)
                    api.user_message(chat, f"hello {i}")
                    await api.wait_for_texts(chat, 1)
                    to_reply.append({k: counts[k] - start[k] for k in KINDS})
                    await settled(service, api)
                    await asyncio.sleep(1.2)  # the leases are released after LINGER_S (1 s)
                    whole.append({k: counts[k] - start[k] for k in KINDS})
    return {
        "to_reply": to_reply,
        "whole": whole,
        "bookkeeping_ms": await bookkeeping(),
        "turn_store_ms": await turn_store(),
    }


async def bookkeeping(rounds: int = 600) -> list[float]:
    """ms of one delivery's database bookkeeping, each step in its own session as delivery
    takes them: the outbox lease, the chat's texts, the "sent" mark, the read that finds none
    left, the lease given back (the service's own functions, on an SQLite file of their own)."""
    from bot.db import leases, migrate, outbox
    from bot.db.engine import make_engine, make_sessionmaker
    from bot.db.models import OutboxKind

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'bookkeeping.sqlite3'}"
        await asyncio.to_thread(migrate.upgrade, url)
        engine = make_engine(url)
        sm = make_sessionmaker(engine)
        times = []
        try:
            for i in range(rounds):
                chat = 1000 + i
                async with sm.begin() as db:
                    await outbox.enqueue(db, chat_id=chat, kind=OutboxKind.NOTICE, text="hi")
                started = time.perf_counter()
                async with sm.begin() as db:
                    written = await leases.take(db, chat, "outbox", "bench", 60.0)
                async with sm() as db:
                    rows = await outbox.pending(db, chat)
                async with sm.begin() as db:
                    await outbox.sent(db, rows[0].id, 1)
                async with sm() as db:
                    await outbox.pending(db, chat)
                async with sm.begin() as db:
                    assert written is not None
                    await leases.give_back_many(db, {chat: written}, "outbox", "bench")
                times.append((time.perf_counter() - started) * 1000)
        finally:
            await engine.dispose()
    return times[rounds // 5 :]  # the first fifth warms the caches up


async def turn_store(rounds: int = 600) -> list[float]:
    """ms of a text turn's database steps as the inbox worker takes them (bot/conversations/
    chat.py): the chat's active conversation, then the user's message, the reply, the outbox
    row and the update closed in one transaction (ConversationStore.record_turn), on an SQLite
    file of their own; every round in a chat with a conversation and an update waiting."""
    from bot.conversations.store import ConversationStore
    from bot.db import inbox, migrate
    from bot.db.engine import make_engine, make_sessionmaker
    from bot.db.inbox import UpdateRef

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'turns.sqlite3'}"
        await asyncio.to_thread(migrate.upgrade, url)
        engine = make_engine(url)
        sm = make_sessionmaker(engine)
        store = ConversationStore(sm)
        times = []
        try:
            for i in range(rounds):
                chat = 1000 + i % 50
                async with sm.begin() as db:
                    await inbox.insert(
                        db, update_id=i, chat_id=chat, user_id=chat, kind="message", payload="{}"
                    )
                started = time.perf_counter()
                session = await store.active_session(chat, chat)
                await store.record_turn(
                    session.id,
                    chat,
                    f"hello {i}",
                    f"hi there {i}",
                    update=UpdateRef(i, None),
                    telegram_message_id=i,
                )
                times.append((time.perf_counter() - started) * 1000)
        finally:
            await engine.dispose()
    return times[rounds // 5 :]


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def summary(raw: dict[str, list[dict[str, float]]]) -> dict[str, float]:
    """Medians: `<kind>_to_reply` and `<kind>_per_turn`."""
    out = {f"{k}_to_reply": median([t[k] for t in raw["to_reply"]]) for k in KINDS}
    out.update({f"{k}_per_turn": median([t[k] for t in raw["whole"]]) for k in KINDS})
    rounded = {k: round(v, 1) for k, v in out.items()}
    rounded["delivery_bookkeeping_ms"] = round(median(raw["bookkeeping_ms"]), 2)
    rounded["turn_store_ms"] = round(median(raw["turn_store_ms"]), 2)
    return rounded


def measure_tree(root: Path, turns: int) -> dict[str, float]:
    """The counts of the code in `root`, in a process of its own: this file runs as a script
    with `root` first on the path, so `bot` and `tests.support` are that tree's."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--count", str(turns)],
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("ROUNDTRIPS ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"counting the code in {root} failed:\n{done.stderr[-3000:]}")
    return summary(json.loads(lines[-1].removeprefix("ROUNDTRIPS ")))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20, help="turns counted (default 20)")
    parser.add_argument("--before", type=Path, help="another checkout, counted first")
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)  # measure_tree's worker
    args = parser.parse_args(argv)
    if args.count is not None:
        print("ROUNDTRIPS " + json.dumps(asyncio.run(count(args.count))))
        return
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    if args.before is not None and not (args.before / "bot").is_dir():
        parser.error(f"--before {args.before}: not a checkout of this project (no bot/)")
    before = measure_tree(args.before.resolve(), args.turns) if args.before else None
    after = measure_tree(ROOT, args.turns)
    print(f"Database round trips of one turn (median of {args.turns} turns, SQLite)")
    header = f"{'':<34}{'before':>8}{'now':>8}" if before else f"{'':<34}{'now':>8}"
    print(header)
    for key in after:
        label = key.replace("_to_reply", " until the reply is sent").replace("_", " ")
        label = label.replace("held ms", "ms the connection was held")
        label = label.replace("delivery bookkeeping ms", "ms of a delivery's bookkeeping")
        label = label.replace("turn store ms", "ms of a turn's store calls")
        row = f"{label:<34}"
        if before:
            row += f"{before[key]:>8g}"
        print(row + f"{after[key]:>8g}")
    for key, value in after.items():
        print(f"RESULT db_{key}={value:g}")
    if before:
        for key, value in before.items():
            print(f"RESULT db_{key}_before={value:g}")


if __name__ == "__main__":
    main()
