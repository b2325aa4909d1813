"""Dashboard page render times on a large database: 10,000 conversations, 200,000 messages.

    python -m bench.dashboard [--conversations 10000] [--messages 200000] [--requests 50]
                              [--postgres URL | --no-postgres] [--quick]

Seeds an SQLite file (and, where one answers, a fresh PostgreSQL database) by bulk insert: the
conversations spread over 30 days, each with its user messages and bot replies (latency, model
time, variant, delivery), the outbox and inbox rows they leave, votes, ratings, assignments,
chat leases and two replicas' heartbeats. Then it serves the real dashboard (bot.dashboard:
start_dashboard, the read-only connection, a real aiohttp server on loopback), logs in, and
times `--requests` sequential GETs of each page (after three warm-up requests) from an
aiohttp client: the whole answer, database, rendering and HTTP. PostgreSQL reads through a
role made by `db readonly-role`, as ADMIN_DATABASE_URL would.

The old way, in the same run: `admin sessions --limit 50` (bot.reports.admin.list_sessions),
which counts the messages of every conversation to show fifty; the conversations page counts
only the page's.

And the schema before migration 0006 (the dashboard's indexes), on SQLite: the overview, a
transcript and the variants report without them.

The wall times depend on what else the machine runs; each table gives the load average, and
the CPU time this process spent per request (server, client and SQLite's threads, not
PostgreSQL's server), which a busy machine does not inflate.

Output: a table per backend, `RESULT page_<name>_p50_ms=...` / `_p95_ms` / `_cpu_ms` lines (SQLite;
PostgreSQL lines are `pg_page_<name>_...`, SQLite before 0006 `no0006_page_<name>_...`),
bench/results/dashboard.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import emit_results, percentile, print_table, write_json

DAYS = 30
VARIANTS = ("beam", "nucleus")
PASSWORD = "bench-password"
TARGET_P50_MS = 100.0


@dataclass
class Rows:
    """Every table's rows, as tuples in the column order of COLUMNS."""

    tables: dict[str, list[tuple[Any, ...]]]


COLUMNS = {
    "sessions": ("id", "chat_id", "user_id", "persona", "status", "created_at", "updated_at",
                 "ended_at"),
    "messages": ("id", "session_id", "chat_id", "role", "text", "update_id", "created_at",
                 "delivered_at", "latency_ms", "variant", "model_ms", "safety"),
    "outbox": ("id", "chat_id", "kind", "text", "message_id", "parts_sent", "attempts",
               "created_at", "sent_at", "failed_at", "last_error"),
    "inbox": ("id", "update_id", "chat_id", "user_id", "kind", "payload", "status", "attempts",
              "received_at", "processed_at"),
    "assignments": ("chat_id", "experiment", "variant", "source", "assigned_at"),
    "votes": ("id", "chat_id", "message_id", "user_id", "value", "source", "variant",
              "created_at", "updated_at"),
    "ratings": ("id", "chat_id", "session_id", "user_id", "value", "variant", "created_at"),
    "chat_leases": ("id", "chat_id", "kind", "owner", "lease_until"),
}  # fmt: skip
WORDS = (  # noqa: SIM905 - a sentence is easier to read than 28 quoted words
    "hello how are you today i love hiking and my dog likes the beach what about you do you "
    "have pets music books travel coffee pizza weekend work school family movies games"
).split()


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def make_rows(conversations: int, messages: int, now: datetime, seed: int = 7) -> Rows:
    """Synthetic rows: `conversations` sessions of about messages/conversations messages."""
    rng = random.Random(seed)
    per = max(2, messages // conversations)
    chats = max(1, int(conversations * 0.8))  # some chats have had several conversations
    start = now - timedelta(days=DAYS)
    t: dict[str, list[tuple[Any, ...]]] = {name: [] for name in COLUMNS}
    for chat in range(1, chats + 1):
        variant = VARIANTS[chat % 2]
        t["assignments"].append((chat, "bench", variant, "hash", start))
    mid = oid = iid = vid = rid = 0
    update_id = 1000
    for sid in range(1, conversations + 1):
        chat = (sid - 1) % chats + 1
        variant = VARIANTS[chat % 2]
        begun = start + timedelta(seconds=rng.uniform(0, DAYS * 86400 - per * 60))
        at = begun
        active = sid > conversations - chats  # each chat's last conversation is active
        persona = f"my name is user{chat}. i like {rng.choice(WORDS)} and {rng.choice(WORDS)}."
        for k in range(per):
            mid += 1
            update_id += 1
            at += timedelta(seconds=rng.uniform(5, 60))
            if k % 2 == 0:
                t["messages"].append(
                    (mid, sid, chat, "user", _sentence(rng, 8), update_id, at,
                     None, None, None, None, None)
                )  # fmt: skip
                iid += 1
                t["inbox"].append((iid, update_id, chat, chat, "message", "{}", "done", 1, at, at))
            else:
                latency = rng.lognormvariate(6.0, 0.5)
                delivered = at + timedelta(milliseconds=latency + 80)
                undelivered = rng.random() < 0.002
                t["messages"].append(
                    (mid, sid, chat, "bot", _sentence(rng, 12), update_id, at,
                     None if undelivered else delivered, latency, variant, latency * 0.7,
                     "flagged" if rng.random() < 0.001 else None)
                )  # fmt: skip
                oid += 1
                t["outbox"].append(
                    (oid, chat, "reply", "", mid, 0 if undelivered else 1,
                     3 if undelivered else 1, at, None if undelivered else delivered, None,
                     "Timed out" if undelivered else None)
                )  # fmt: skip
                if rng.random() < 0.1:
                    vid += 1
                    value = 1 if rng.random() < (0.7 if variant == "beam" else 0.6) else -1
                    t["votes"].append((vid, chat, mid, chat, value, "button", variant, at, at))
        t["sessions"].append(
            (sid, chat, chat, persona, "active" if active else "done", begun, at,
             None if active else at)
        )  # fmt: skip
        if not active and rng.random() < 0.2:
            rid += 1
            t["ratings"].append((rid, chat, sid, chat, rng.randint(1, 5), variant, at))
    for i in range(1, 201):
        owner = "benchA:1:aa" if i % 2 else "benchB:2:bb"
        t["chat_leases"].append((i, i, "inbox" if i % 3 else "outbox", owner, now))
    return Rows(t)


# --- loading ---------------------------------------------------------------------------------


def _sqlite_value(value: Any) -> Any:
    if isinstance(value, datetime):
        # what SQLAlchemy's SQLite DATETIME stores (UTC, naive text with microseconds)
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return value


def load_sqlite(path: Path, rows: Rows) -> None:
    """Bulk insert with the sqlite3 module: one transaction, executemany per table."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA synchronous=OFF")
        with conn:
            for name, cols in COLUMNS.items():
                marks = ", ".join("?" for _ in cols)
                conn.executemany(
                    f"INSERT INTO {name} ({', '.join(cols)}) VALUES ({marks})",
                    ([_sqlite_value(v) for v in r] for r in rows.tables[name]),
                )
    finally:
        conn.close()


async def load_postgres(url: str, rows: Rows) -> None:
    """Bulk insert with COPY (asyncpg), then VACUUM ANALYZE, as autovacuum would after a big
    load (statistics, and the visibility map that lets index-only scans skip the table)."""
    import asyncpg
    from sqlalchemy.engine import make_url

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)
    try:
        for name, cols in COLUMNS.items():
            await conn.copy_records_to_table(name, records=rows.tables[name], columns=cols)
            if "id" in cols:  # identities continue after the copied ids
                await conn.execute(
                    f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), "
                    f"(SELECT max(id) FROM {name}))"
                )
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def add_replicas(url: str, now: datetime) -> None:
    """Two replicas' heartbeats."""
    import json

    from sqlalchemy import insert

    from bot.db.engine import make_engine
    from bot.db.models import Replica

    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            cache = {"cached": 900, "hits": 9000, "misses": 1000, "evictions": 5}
            worker = {"variant": "beam", "pid": 1, "alive": True, "restarts": 0, "cache": cache}
            info = {"mode": "polling", "poller": True, "ready": True, "problems": []}
            info["workers"] = [worker]
            for owner in ("benchA:1:aa", "benchB:2:bb"):
                await conn.execute(
                    insert(Replica).values(
                        owner=owner, host=owner.split(":")[0], pid=1, started_at=now,
                        heartbeat_at=now + timedelta(hours=1), info=json.dumps(info),
                    )
                )  # fmt: skip
    finally:
        await engine.dispose()


# --- measuring -------------------------------------------------------------------------------


def pages(rows: Rows) -> dict[str, str]:
    """The pages timed, by name."""
    sessions = rows.tables["sessions"]
    newest = max(sessions, key=lambda s: (s[6], s[0]))
    middle = sessions[len(sessions) // 2]
    deep_at = sorted(sessions, key=lambda s: (s[6], s[0]), reverse=True)[len(sessions) // 2]
    from urllib.parse import urlencode

    deep = urlencode({"before": f"{deep_at[6].isoformat()}|{deep_at[0]}"})
    day = (middle[5]).date().isoformat()
    return {
        "overview": "/",
        "overview_30d": "/?days=30",
        "conversations": "/conversations",
        "conversations_deep": f"/conversations?{deep}",
        "search_chat": f"/conversations?chat_id={middle[1]}",
        "search_persona": "/conversations?persona=hiking",
        "search_date": f"/conversations?on={day}",
        "transcript": f"/conversations/{newest[0]}",
        "variants": "/variants",
        "health": "/health",
    }


async def time_pages(base: str, paths: dict[str, str], requests: int) -> dict[str, list[float]]:
    """Log in, then `requests` timed GETs of every page (after three warm-up ones)."""
    import aiohttp

    timings: dict[str, list[float]] = {}
    # unsafe=True: keep cookies for an IP address (127.0.0.1), which aiohttp does not by default
    async with aiohttp.ClientSession(base, cookie_jar=aiohttp.CookieJar(unsafe=True)) as client:
        async with client.post(
            "/login", data={"password": PASSWORD, "next": "/"}, allow_redirects=False
        ) as r:
            assert r.status == 303, r.status
        for name, path in paths.items():
            times = []
            for i in range(requests + 3):
                if i == 3:
                    cpu0 = time.process_time()
                t0 = time.perf_counter()
                async with client.get(path, allow_redirects=False) as r:
                    body = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{path}: {r.status} {body[:300]!r}")
                if i >= 3:
                    times.append((time.perf_counter() - t0) * 1000)
            timings[name] = times
            # CPU of this process per request (server, client and SQLite's threads; not the
            # PostgreSQL server's): what a busy machine cannot inflate, unlike the wall time
            timings[f"{name}_cpu"] = [(time.process_time() - cpu0) * 1000 / requests]
    return timings


async def old_way(url: str, requests: int) -> list[float]:
    """`admin sessions --limit 50`: counts the messages of every conversation."""
    from bot.admin.sql import readonly_engine
    from bot.db.engine import make_sessionmaker
    from bot.reports import admin as reports

    engine = readonly_engine(url)
    sm = make_sessionmaker(engine)
    times = []
    try:
        for i in range(min(requests, 20) + 3):
            t0 = time.perf_counter()
            await reports.list_sessions(sm, limit=50)
            if i >= 3:
                times.append((time.perf_counter() - t0) * 1000)
    finally:
        await engine.dispose()
    return times


async def measure(
    db_url: str,
    readonly_url: str,
    rows: Rows,
    requests: int,
    tmp: Path,
    only: tuple[str, ...] | None = None,
) -> dict[str, list[float]]:
    """Serve the dashboard over the database and time its pages (`only` these, if given)."""
    from pydantic import SecretStr

    from bot.config import Settings
    from bot.dashboard.server import start_dashboard

    variants = tmp / "variants.toml"
    variants.write_text(
        'experiment = "bench"\n'
        + "".join(
            f'[[variants]]\nname = "{v}"\nmodel = "zoo:blender/blender_90M/model"\n'
            f"control = {'true' if v == 'beam' else 'false'}\n"
            for v in VARIANTS
        ),
        encoding="utf-8",
    )
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=tmp,
        database_url=SecretStr(db_url),
        admin_database_url=SecretStr(readonly_url) if readonly_url != db_url else None,
        variants_file=variants,
        dashboard_password=SecretStr(PASSWORD),
    )
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    running = await start_dashboard(settings, listen="127.0.0.1", port=port)
    try:
        base = running.url.rstrip("/")
        chosen = {k: v for k, v in pages(rows).items() if only is None or k in only}
        timings = await time_pages(base, chosen, requests)
        # the caches off (TtlCache): the variants report and the overview's completed days
        # computed for every request, as on the first visit after their TTL
        from bot.dashboard.app import DASHBOARD

        dash = running.runner.app[DASHBOARD]
        dash.variants.ttl_s = dash.past_days.ttl_s = 0
        cold = {"overview_cold": "/", "variants_cold": "/variants"}
        chosen = {k: v for k, v in cold.items() if only is None or k in only}
        timings |= await time_pages(base, chosen, requests)
    finally:
        await running.close()
    if only is None:
        timings["old_admin_sessions"] = await old_way(readonly_url, requests)
    return timings


def report(label: str, prefix: str, timings: dict[str, list[float]]) -> dict[str, float]:
    """Print the table; the RESULT values."""
    results: dict[str, float] = {}
    rows = []
    cpu = {k.removesuffix("_cpu"): v[0] for k, v in timings.items() if k.endswith("_cpu")}
    for name, times in timings.items():
        if name.endswith("_cpu"):
            continue
        p50, p95 = percentile(times, 50), percentile(times, 95)
        key = name if name.startswith("old_") else f"page_{name}"
        results[f"{prefix}{key}_p50_ms"] = round(p50, 1)
        results[f"{prefix}{key}_p95_ms"] = round(p95, 1)
        ok = "" if name.startswith("old_") else ("yes" if p50 < TARGET_P50_MS else "NO")
        if name in cpu:
            results[f"{prefix}{key}_cpu_ms"] = round(cpu[name], 1)
        cpu_ms = round(cpu[name], 1) if name in cpu else ""
        rows.append((name, len(times), round(p50, 1), round(p95, 1), cpu_ms, ok))
    print_table(
        f"{label}: render time per page, ms (load average {os.getloadavg()[0]:.1f})",
        ["page", "n", "p50", "p95", "CPU/request", "p50 < 100"],
        rows,
    )
    return results


@dataclass
class Postgres:
    """A fresh database on the server at `base`, and a read-only role for it."""

    url: str
    readonly: str


def _pg_open(base: str) -> Postgres | None:
    from sqlalchemy.engine import make_url

    from bot.admin.pgrole import ensure_readonly_role
    from bot.db import migrate

    async def create(name: str) -> None:
        import asyncpg

        dsn = make_url(base).set(drivername="postgresql").render_as_string(hide_password=False)
        conn = await asyncpg.connect(dsn, timeout=3)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    name = f"bench_dashboard_{uuid.uuid4().hex[:8]}"
    try:
        asyncio.run(create(name))
    except Exception as err:  # noqa: BLE001 - no server: SQLite only
        print(f"PostgreSQL at {make_url(base).render_as_string(True)} not used: {err}")
        return None
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    migrate.upgrade(url)
    role = f"bench_ro_{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_readonly_role(url, role))
    return Postgres(url, make_url(url).set(username=role, password=None).render_as_string(False))


def _pg_close(base: str, pg: Postgres) -> None:
    from sqlalchemy.engine import make_url

    async def drop() -> None:
        import asyncpg

        dsn = make_url(base).set(drivername="postgresql").render_as_string(hide_password=False)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                f'DROP DATABASE IF EXISTS "{make_url(pg.url).database}" WITH (FORCE)'
            )
            role = make_url(pg.readonly).username
            await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        finally:
            await conn.close()

    asyncio.run(drop())


def _tmpdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as d:
        yield Path(d)


def main() -> None:
    """Seed, serve, time, report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument(
        "--postgres", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--quick", action="store_true", help="1,000 / 20,000, 10 requests")
    args = parser.parse_args()
    if args.quick:
        args.conversations, args.messages, args.requests = 1000, 20_000, 10

    from bot.db import migrate

    now = datetime.now(UTC)
    t0 = time.perf_counter()
    rows = make_rows(args.conversations, args.messages, now)
    made_s = time.perf_counter() - t0
    print(
        f"{len(rows.tables['sessions']):,} conversations, {len(rows.tables['messages']):,} "
        f"messages, {len(rows.tables['votes']):,} votes made in {made_s:.1f} s"
    )
    results: dict[str, float] = {}
    payload: dict[str, Any] = {"args": vars(args)}
    for tmp in _tmpdir():
        path = tmp / "bot.sqlite3"
        url = f"sqlite+aiosqlite:///{path}"
        migrate.upgrade(url)
        t0 = time.perf_counter()
        load_sqlite(path, rows)
        load_s = time.perf_counter() - t0
        asyncio.run(add_replicas(url, now))
        print(f"SQLite: loaded in {load_s:.1f} s ({path.stat().st_size / 1e6:.0f} MB)")
        results["sqlite_load_s"] = round(load_s, 2)
        timings = asyncio.run(measure(url, url, rows, args.requests, tmp))
        results |= report("SQLite", "", timings)
        payload["sqlite"] = timings

        # The old way, in the same run: the schema before migration 0006 (no dashboard indexes)
        before = tmp / "before-0006.sqlite3"
        before_url = f"sqlite+aiosqlite:///{before}"
        migrate.upgrade(before_url, "0005")
        load_sqlite(before, rows)
        asyncio.run(add_replicas(before_url, now))
        slow = ("overview_cold", "transcript", "variants_cold")
        timings = asyncio.run(measure(before_url, before_url, rows, args.requests, tmp, slow))
        results |= report("SQLite without migration 0006's indexes", "no0006_", timings)
        payload["sqlite_before_0006"] = timings

        pg = None if args.no_postgres else _pg_open(args.postgres)
        if pg is not None:
            try:
                t0 = time.perf_counter()
                asyncio.run(load_postgres(pg.url, rows))
                load_s = time.perf_counter() - t0
                asyncio.run(add_replicas(pg.url, now))
                print(f"PostgreSQL: loaded in {load_s:.1f} s")
                results["pg_load_s"] = round(load_s, 2)
                timings = asyncio.run(measure(pg.url, pg.readonly, rows, args.requests, tmp))
                results |= report("PostgreSQL", "pg_", timings)
                payload["postgresql"] = timings
            finally:
                _pg_close(args.postgres, pg)
    emit_results(results)
    write_json("dashboard-quick" if args.quick else "dashboard", payload)


if __name__ == "__main__":
    main()
