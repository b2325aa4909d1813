"""SQLite statements run on the event loop's thread, and waiting for another writer neither
blocks the loop nor outlasts the busy timeout (bot/db/sqlite_inline.py)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.db.engine import Prepared, make_engine, make_sessionmaker
from bot.db.sqlite_inline import InlineConnection


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"))
    yield engine
    await engine.dispose()


def other_writer(tmp_path: Path) -> sqlite3.Connection:
    """Another connection to the same file (as another process would be), holding the write
    lock."""
    conn = sqlite3.connect(tmp_path / "db.sqlite3", isolation_level=None, timeout=0)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t (v) VALUES ('theirs')")
    return conn


async def test_statements_run_on_the_loops_thread_with_no_worker_thread(
    engine: AsyncEngine,
) -> None:
    threads_before = threading.active_count()
    async with engine.connect() as conn:
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        assert isinstance(driver, InlineConnection)
        await driver.create_function("thread_id", 0, threading.get_ident)
        ran_on = (await conn.execute(text("SELECT thread_id()"))).scalar_one()
    assert ran_on == threading.get_ident()
    assert threading.active_count() == threads_before


async def test_an_engine_for_long_reads_runs_them_on_aiosqlites_thread(tmp_path: Path) -> None:
    """`on_loop=False` (retention, the autopilot): the statements leave the loop's thread."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}", on_loop=False)
    try:
        async with engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            assert not isinstance(driver, InlineConnection)
            await driver.create_function("thread_id", 0, threading.get_ident)
            ran_on = (await conn.execute(text("SELECT thread_id()"))).scalar_one()
        assert ran_on != threading.get_ident()
    finally:
        await engine.dispose()


INSERT_OURS = Prepared(lambda dialect: text("INSERT INTO t (v) VALUES ('ours')"))


async def write_on_a_connection(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("INSERT INTO t (v) VALUES ('ours')"))


async def write_in_a_session(engine: AsyncEngine) -> None:
    """A prepared statement in a session: outside SQLAlchemy's greenlet until it finds the
    database busy (bot/db/engine.py: run_now)."""
    async with make_sessionmaker(engine).begin() as db:
        await INSERT_OURS.execute(db, {})


@pytest.mark.parametrize("write", [write_on_a_connection, write_in_a_session])
async def test_a_write_waits_for_another_writer_without_blocking_the_loop(
    engine: AsyncEngine, tmp_path: Path, write: Callable[[AsyncEngine], Awaitable[None]]
) -> None:
    theirs = other_writer(tmp_path)
    loop = asyncio.get_running_loop()
    # The other writer commits 0.2 s from now, from this loop: a wait that held the loop's
    # thread (SQLite's busy handler) would never let it, and the write would time out.
    loop.call_later(0.2, theirs.commit)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    try:
        await write(engine)
    finally:
        ticker.cancel()
        theirs.close()
    waited = time.monotonic() - started
    assert waited >= 0.19
    assert ticks >= 10  # the loop ran on while the write waited
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT v FROM t ORDER BY id"))).scalars().all()
    assert rows == ["theirs", "ours"]


async def test_a_write_gives_up_after_the_busy_timeout(engine: AsyncEngine, tmp_path: Path) -> None:
    theirs = other_writer(tmp_path)
    try:
        async with engine.connect() as conn:
            (await conn.get_raw_connection()).driver_connection.busy_timeout_s = 0.3
            started = time.monotonic()
            with pytest.raises(OperationalError, match="locked"):
                await conn.execute(text("INSERT INTO t (v) VALUES ('ours')"))
            waited = time.monotonic() - started
    finally:
        theirs.rollback()
        theirs.close()
    assert 0.29 <= waited < 1.0


async def test_an_overtaken_read_transaction_fails_at_once(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    """SQLITE_BUSY_SNAPSHOT: our transaction read, another writer committed since; waiting
    cannot help, so it is raised at once (the caller retries the whole transaction)."""
    async with engine.connect() as conn:
        await conn.exec_driver_sql("BEGIN")  # (pysqlite begins by itself only before a write)
        await conn.execute(text("SELECT count(*) FROM t"))  # our snapshot
        theirs = sqlite3.connect(tmp_path / "db.sqlite3", isolation_level=None, timeout=0)
        theirs.execute("INSERT INTO t (v) VALUES ('theirs')")
        theirs.close()
        started = time.monotonic()
        with pytest.raises(OperationalError) as caught:
            await conn.execute(text("INSERT INTO t (v) VALUES ('ours')"))
        assert getattr(caught.value.orig, "sqlite_errorcode", None) == 517  # BUSY_SNAPSHOT
        assert time.monotonic() - started < 1.0  # not the 15 s busy timeout
        await conn.rollback()
