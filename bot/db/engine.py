"""Engines and session factories; SQLite gets WAL, a busy timeout and foreign keys."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from sqlalchemy import Executable, event
from sqlalchemy.engine import URL, CursorResult, make_url
from sqlalchemy.exc import MissingGreenlet, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, SessionTransaction
from sqlalchemy.util import greenlet_spawn

from bot.db.sqlite_inline import InlineDBAPI, WouldWait, inline_creator, inline_dbapi
from bot.tasks import Resumed

SQLITE_BUSY_TIMEOUT_MS = 15_000

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S", bound=Executable)


def safe_url(url: str | URL) -> str:
    """The URL with its password masked, for logs and messages."""
    return make_url(url).render_as_string(hide_password=True)


def is_sqlite(url: str | URL) -> bool:
    """True for any SQLite URL."""
    return make_url(url).get_backend_name() == "sqlite"


def ensure_sqlite_dir(url: str | URL) -> None:
    """Create the folder of an SQLite file so a fresh checkout just works."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # The busy timeout is the connection's own (sqlite3.connect's `timeout`): 0 on the loop's
    # thread, which waits for other writers without blocking (bot/db/sqlite_inline.py).
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(url: str, *, on_loop: bool = True, **kwargs: Any) -> AsyncEngine:
    """An async engine for SQLite (aiosqlite's connection, its statements run on the loop's
    thread: bot/db/sqlite_inline.py) or PostgreSQL (asyncpg).

    `on_loop=False`: SQLite's statements run on aiosqlite's own thread instead, for the long
    reads of background jobs (the autopilot's report, retention), which must not hold the event
    loop; each such engine is one more connection.

    Bound parameters (message texts, personas, user names) never appear in SQLAlchemy's error
    messages, so a failed statement cannot carry user text into a log line or `inbox.error`.
    """
    kwargs.setdefault("hide_parameters", True)
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.drivername == "sqlite":
            u = u.set(drivername="sqlite+aiosqlite")
        ensure_sqlite_dir(u)
        if on_loop:
            kwargs.setdefault("async_creator", inline_creator(u, SQLITE_BUSY_TIMEOUT_MS / 1000))
            kwargs.setdefault("module", inline_dbapi())
        else:  # SQLite's busy handler waits for other writers, on aiosqlite's thread
            kwargs.setdefault("connect_args", {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        # SQLite has one writer at a time. Several pooled connections of one process only take
        # turns through waits for the lock (up to 50 ms a time); one connection queues the
        # process's statements instead, in order, with no sleeping. Other processes (and the
        # heartbeat's engine) on the same file are waited for (bot/db/sqlite_inline.py).
        kwargs.setdefault("pool_size", 1)
        kwargs.setdefault("max_overflow", 0)
        kwargs.setdefault("pool_timeout", 120)
    elif u.get_backend_name() == "postgresql":
        if u.drivername in ("postgresql", "postgres"):
            u = u.set(drivername="postgresql+asyncpg")
        kwargs.setdefault("pool_pre_ping", True)
    engine = create_async_engine(u, **kwargs)
    if u.get_backend_name() == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded values after commit (we never cache ORM objects anyway), and
    end without a task of their own where nothing waits (LoopSession)."""
    return LoopSessionmaker(engine, expire_on_commit=False, class_=LoopSession)


async def run_to_completion(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end even if the caller is cancelled meanwhile (the cancellation is
    raised once it has ended), as SQLAlchemy ends a session, but in the caller's task as far as
    it goes without waiting: a task of its own only once it waits.

    SQLAlchemy runs a session's commit and close in a task of their own, shielded, so that a
    cancellation cannot leave them half done: one task a session, two with `begin()`. On the
    loop's SQLite (bot/db/sqlite_inline.py) they never wait, unless SQLite is busy, and the
    tasks were 3.6 ms of the event loop's time a turn at 50 users, a tenth of it
    (`bench.e2e --loop-trace`, docs/benchmarks.md). A coroutine that completes in its first
    step cannot be cancelled part way; one that waits (PostgreSQL's I/O, SQLITE_BUSY) goes on
    in a task, shielded, as in SQLAlchemy.
    """
    try:
        waiting = coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except BaseException:
        coro.close()
        raise
    task: asyncio.Future[T] = asyncio.ensure_future(Resumed(coro, waiting))
    cancelled: BaseException | None = None
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError as err:
            if task.done():
                raise
            cancelled = err
        else:
            break
    if cancelled is not None:
        raise cancelled
    return result


class LoopSession(AsyncSession):
    """An AsyncSession that closes without a task where closing does not wait; on the loop's
    SQLite, it takes its connection and ends without a greenlet where it can (`direct`)."""

    @property
    def direct(self) -> bool:
        """Whether this session is on the loop's SQLite, whose driver calls make no awaits
        (bot/db/sqlite_inline.py: InlineDBAPI), so SQLAlchemy's synchronous session under it
        can be called directly. AsyncSession calls each of its methods in a greenlet of its
        own, switched into and out of: a lease taken in a session of its own (its connection,
        one statement, its commit) took 0.26 ms that way and 0.16 ms called directly
        (docs/benchmarks.md, "eighth pass")."""
        return _on_loop_sqlite(self.bind)

    async def __aexit__(self, type_: Any, value: Any, traceback: Any) -> None:
        if self.direct and not _flushes(self.sync_session):
            self.sync_session.close()  # a rollback at most, which never waits in WAL mode
            return
        await run_to_completion(self.close())


def _on_loop_sqlite(bind: Any) -> bool:
    dialect = getattr(bind, "dialect", None)
    return dialect is not None and isinstance(dialect.loaded_dbapi, InlineDBAPI)


def _flushes(sync: Session) -> bool:
    """Whether ending `sync`'s transaction would flush ORM changes first: statements that may
    have to wait for another writer, which only a greenlet can (bot/db/sqlite_inline.py)."""
    return bool(sync.new or sync.deleted or sync.dirty)


class _Begun:
    """`LoopSessionmaker.begin()`: a session and its transaction, committed (or rolled back)
    and closed at the end, as SQLAlchemy's begin() but through run_to_completion, and on the
    loop's SQLite without a greenlet where nothing is left to flush (`LoopSession.direct`)."""

    __slots__ = ("session", "sync_trans", "trans")

    def __init__(self, session: AsyncSession) -> None:
        self.session = session
        self.sync_trans: SessionTransaction | None = None

    async def __aenter__(self) -> AsyncSession:
        session = self.session
        if isinstance(session, LoopSession) and session.direct:
            # No I/O: the connection is taken by the first statement (`core`).
            self.sync_trans = session.sync_session.begin()
        else:
            self.trans = session.begin()
            await self.trans.__aenter__()
        return session

    async def __aexit__(self, type_: Any, value: Any, traceback: Any) -> None:
        session, sync_trans = self.session, self.sync_trans
        if sync_trans is not None:
            sync = session.sync_session
            if not _flushes(sync):
                # COMMIT never waits for another writer in WAL mode: the write lock was taken
                # by the transaction's first write (and a read transaction holds none).
                try:
                    sync_trans.__exit__(type_, value, traceback)
                finally:
                    sync.close()
                return

            async def end() -> None:
                try:
                    await greenlet_spawn(sync_trans.__exit__, type_, value, traceback)
                finally:
                    await session.close()

        else:

            async def end() -> None:
                await self.trans.__aexit__(type_, value, traceback)
                await session.close()

        await run_to_completion(end())


class LoopSessionmaker(async_sessionmaker[AsyncSession]):
    """async_sessionmaker whose begin() ends its session through run_to_completion."""

    def begin(self) -> _Begun:  # type: ignore[override]
        return _Begun(self())


def in_session(
    sessionmaker: async_sessionmaker[AsyncSession],
    query: Callable[Concatenate[AsyncSession, P], Awaitable[T]],
) -> Callable[P, Awaitable[T]]:
    """`query` as a function that opens a session of its own for each call (for reads:
    nothing is committed)."""

    async def read(*args: P.args, **kwargs: P.kwargs) -> T:
        async with sessionmaker() as db:
            return await query(db, *args, **kwargs)

    return read


async def core(db: AsyncSession) -> AsyncConnection:
    """The session's connection (its transaction begun), for a statement that needs nothing of
    the ORM: no objects loaded, none waiting to be flushed first (Session.execute autoflushes
    pending objects; a statement on the connection does not). About a third less Python per
    statement than Session.execute (an update, a select and their commit: 0.37 -> 0.26 ms on
    the event loop's SQLite). For the per-turn bookkeeping (leases, the inbox's and outbox's
    reads and marks), in sessions of their own or after their caller's last flush (the status
    read in bot.db.inbox.finish follows that function's own UPDATE). On the loop's SQLite it
    is taken without a greenlet (`LoopSession.direct`), unless the pool has none free now."""
    if isinstance(db, LoopSession) and db.direct:
        try:
            sync = db.sync_session.connection()
        except MissingGreenlet:
            pass  # the pool's one connection is in use (or not yet opened): wait for it
        else:
            return AsyncConnection._retrieve_proxy_for_target(sync)
    return await db.connection()


class Prepared(Generic[S]):
    """A statement built once per database dialect, its values given when it runs
    (`await STMT.execute(db, {"p_name": value, "column": value})`: its bindparams by name, and
    for an INSERT or UPDATE the columns it writes).

    Building a statement anew costs more than running it on the loop's SQLite: SQLAlchemy
    coerces every value into a bound parameter and keys the statement for its compiled cache
    each time. An INSERT of a message, in a probe: 0.26 ms built with `.values()` on the mapped
    class, 0.19 on the table, 0.06 built once; a turn's store calls 2.33 -> 0.74 ms
    (bench.roundtrips: `db_turn_store_ms`). For the statements every turn runs
    (docs/benchmarks.md, "seventh pass")."""

    def __init__(self, build: Callable[[str], S]) -> None:
        self._build = build
        self._by_dialect: dict[str, S] = {}

    def __call__(self, conn: AsyncConnection) -> S:
        name = conn.dialect.name
        statement = self._by_dialect.get(name)
        if statement is None:
            statement = self._by_dialect[name] = self._build(name)
        return statement

    async def execute(self, db: AsyncSession, values: dict[str, Any]) -> CursorResult[Any]:
        """Run it with `values` on the session's connection (`core`), at once where it can
        (`run_now`)."""
        conn = await core(db)
        return await run_now(conn, self(conn), values)


async def run_now(
    conn: AsyncConnection, statement: Executable, values: dict[str, Any]
) -> CursorResult[Any]:
    """`conn.execute(statement, values)`, on the loop's SQLite made as a plain call.

    SQLAlchemy runs every call of an AsyncConnection in a greenlet of its own, switched into
    and out of, which on the loop's SQLite costs more than the statement: its cursor makes no
    awaits (bot/db/sqlite_inline.py: InlineCursor), so the synchronous connection under `conn`
    runs it directly. A statement that finds the database busy raises WouldWait before it has
    done anything, and runs again the asynchronous way, which waits for the other writer."""
    sync = conn.sync_connection
    if sync is not None and _on_loop_sqlite(conn):
        try:
            return sync.execute(statement, values)  # type: ignore[return-value]
        except OperationalError as err:
            if not isinstance(err.orig, WouldWait):
                raise
    return await conn.execute(statement, values)


def on_commit(db: AsyncSession, callback: Callable[[], object]) -> None:
    """Run `callback` once `db`'s transaction commits; never if it rolls back. For what a
    caller learns only from a commit (an update closed, a text queued), with no read back."""
    sync = db.sync_session
    callbacks: list[Callable[[], object]] | None = sync.info.get("on_commit")
    if callbacks is None:
        callbacks = sync.info["on_commit"] = []
        event.listen(sync, "after_commit", _committed)
        event.listen(sync, "after_rollback", lambda s: s.info["on_commit"].clear())
    callbacks.append(callback)


def _committed(sync: Any) -> None:
    callbacks = sync.info["on_commit"]
    due, callbacks[:] = list(callbacks), []
    for callback in due:
        callback()
