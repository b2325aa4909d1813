"""On the loop's SQLite a session's connection, its statements on that connection and its end
are plain calls, not SQLAlchemy's greenlets (bot/db/engine.py: LoopSession.direct, run_now),
and what must wait for another writer still waits (a busy prepared statement:
tests/integration/db/test_sqlite_inline.py)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, event, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.util.concurrency import in_greenlet

from bot.db.engine import Prepared, core, make_engine, make_sessionmaker


class Base(DeclarativeBase):
    pass


class Row(Base):
    __tablename__ = "t"
    id: Mapped[int] = mapped_column(primary_key=True)
    v: Mapped[str]


INSERT = Prepared(lambda dialect: insert(Row).values(v=bindparam("p_v")))


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    yield engine
    await engine.dispose()


@pytest.fixture
def sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return make_sessionmaker(engine)


def greenlets_seen(engine: AsyncEngine) -> list[tuple[str, bool]]:
    """(what, whether it ran inside one of SQLAlchemy's greenlets) for every statement and
    commit on `engine` from now on."""
    seen: list[tuple[str, bool]] = []

    def statement(_conn: Any, _cursor: Any, sql: str, *_args: Any) -> None:
        seen.append((sql.split()[0], in_greenlet()))

    def commit(_conn: Any) -> None:
        seen.append(("COMMIT", in_greenlet()))

    event.listen(engine.sync_engine, "before_cursor_execute", statement)
    event.listen(engine.sync_engine, "commit", commit)
    return seen


def other_writer(tmp_path: Path) -> sqlite3.Connection:
    """Another connection to the file (as another process), holding the write lock."""
    conn = sqlite3.connect(tmp_path / "db.sqlite3", isolation_level=None, timeout=0)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t (v) VALUES ('theirs')")
    return conn


async def values(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return list((await conn.execute(text("SELECT v FROM t ORDER BY id"))).scalars())


async def test_a_prepared_statement_and_its_commit_need_no_greenlet(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    async with sessions() as db:
        await core(db)  # the pool's connection opened (that one awaits)
    seen = greenlets_seen(engine)
    async with sessions.begin() as db:
        await INSERT.execute(db, {"p_v": "a"})
        await INSERT.execute(db, {"p_v": "b"})
    assert seen == [("INSERT", False), ("INSERT", False), ("COMMIT", False)]
    # The session's ORM calls still go through SQLAlchemy's greenlet, and work the same.
    async with sessions() as db:
        assert list((await db.scalars(select(Row.v).order_by(Row.id))).all()) == ["a", "b"]
    assert seen[-1] == ("SELECT", True)


async def test_a_session_ending_with_objects_to_flush_waits_for_the_other_writer(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    """The flush at commit may have to wait: that end goes through the greenlet."""
    theirs = other_writer(tmp_path)
    asyncio.get_running_loop().call_later(0.2, theirs.commit)
    try:
        async with sessions.begin() as db:
            db.add(Row(v="ours"))
    finally:
        theirs.close()
    assert await values(engine) == ["theirs", "ours"]


async def test_a_session_waits_for_the_pools_one_connection(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The loop's SQLite has one pooled connection: a second session's statement waits for
    the first session to end, then runs."""
    holding = asyncio.Event()
    release = asyncio.Event()

    async def first() -> None:
        async with sessions.begin() as db:
            await INSERT.execute(db, {"p_v": "first"})
            holding.set()
            await release.wait()

    async def second() -> None:
        await holding.wait()
        async with sessions.begin() as db:
            await INSERT.execute(db, {"p_v": "second"})

    one = asyncio.create_task(first())
    two = asyncio.create_task(second())
    await holding.wait()
    await asyncio.sleep(0.05)
    assert not two.done()  # waiting for the connection, not failed
    release.set()
    await asyncio.wait_for(asyncio.gather(one, two), 5)
    assert await values(engine) == ["first", "second"]


async def test_a_failed_body_rolls_back_its_direct_statements(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    with pytest.raises(RuntimeError):
        async with sessions.begin() as db:
            await INSERT.execute(db, {"p_v": "lost"})
            raise RuntimeError("the turn failed")
    async with sessions.begin() as db:
        await INSERT.execute(db, {"p_v": "kept"})
    assert await values(engine) == ["kept"]
