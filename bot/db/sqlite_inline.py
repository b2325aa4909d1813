"""SQLite statements run on the event loop's own thread, not through aiosqlite's worker thread.

aiosqlite runs every call (cursor, execute, fetch, close, commit) on a thread of its own and
hands the result back through the event loop: a thread hop and a loop wake-up per call. On a
local SQLite file the hops cost more than the statements: a turn of four statements and a commit
took 3.0 ms through the thread, 0.64 ms with the calls made here and 0.20 ms through SQLAlchemy's
synchronous engine (`python -m bench.sqlite_driver`; docs/benchmarks.md, "third pass"). At 50
users the replies of one model batch finish together and their turns queue for the one
connection (bot/db/engine.py), so what each of them holds it for is what the last one waits.

`InlineConnection` is aiosqlite's `Connection` (SQLAlchemy's aiosqlite dialect drives it, through
`create_async_engine(..., async_creator=...)`) with its calls made on the calling thread. What
that changes:

- *Waiting for another writer does not block the loop.* The connection is opened with a busy
  timeout of 0, so SQLite never sleeps in its busy handler on this thread; a statement that finds
  the database locked (SQLITE_BUSY) is tried again after an `asyncio.sleep`, 1 ms doubling to
  50 ms, until `busy_timeout_s` has passed, which is what SQLite's own handler would have done
  on aiosqlite's thread. That matters inside one process too: the heartbeat has an engine of its
  own (bot/app.py), and a busy handler sleeping on the loop's thread would keep the other
  engine's transaction, which holds the lock, from ever finishing. SQLITE_BUSY_SNAPSHOT (a
  read transaction that another writer overtook) cannot be cured by waiting and is raised at
  once, as SQLite does; so is a busy `executescript`, which may have run part of its script.
- *A statement holds the loop for its length.* The service's own statements take well under a
  millisecond. Background jobs whose work grows with the database are kept off the loop:
  retention and the autopilot (which reads every vote and the guard figures of the experiment at
  each check; the variants report over 200,000 messages takes 183 ms, docs/benchmarks.md "Admin
  dashboard") run on an engine of their own made with `make_engine(..., on_loop=False)`, on
  aiosqlite's thread (bot/runtime.py); the dashboard and `admin sql` read through their own
  read-only engine (bot/admin/sql.py).

SQLAlchemy's adapter for aiosqlite still awaited every driver call (the cursor, the statement,
its rows, the cursor closed, the commit) through a greenlet switch and a coroutine each, none of
which waits here. `InlineCursor` and `InlineAdaptedConnection` (the engine's DBAPI module:
`inline_dbapi`) make those calls directly, and only a busy statement goes through SQLAlchemy's
greenlet to wait; outside a greenlet it raises `WouldWait` instead, and bot/db/engine.py makes it
again the asynchronous way. So a session's connection, its prepared statements and its end can be
plain calls (bot/db/engine.py: `LoopSession.direct`, `run_now`): a lease taken in a session of its
own 0.262 -> 0.156 ms (docs/benchmarks.md, "eighth pass").

PostgreSQL (asyncpg) is not touched: it is a network client, and its calls are asynchronous.
"""

from __future__ import annotations

import asyncio
import collections
import sqlite3
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

import aiosqlite
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
    AsyncAdapt_aiosqlite_dbapi,
)
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import URL
from sqlalchemy.util import EMPTY_DICT
from sqlalchemy.util.concurrency import await_, in_greenlet

T = TypeVar("T")

# sqlite3's extended result codes (sqlite3.Error.sqlite_errorcode) that waiting can cure.
SQLITE_BUSY = 5
SQLITE_BUSY_RECOVERY = 5 | (1 << 8)  # another connection is recovering the WAL
SQLITE_BUSY_TIMEOUT = 5 | (3 << 8)
RETRYABLE = frozenset({SQLITE_BUSY, SQLITE_BUSY_RECOVERY, SQLITE_BUSY_TIMEOUT})
FIRST_WAIT_S = 0.001
LONGEST_WAIT_S = 0.05


class InlineConnection(aiosqlite.Connection):
    """aiosqlite's connection, its calls made on the caller's thread (no worker thread)."""

    def __init__(self, connector: Callable[[], sqlite3.Connection], busy_timeout_s: float):
        super().__init__(connector, iter_chunk_size=64)
        self.busy_timeout_s = busy_timeout_s

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self._running or not self._connection:
            raise ValueError("Connection closed")
        wait_s = FIRST_WAIT_S
        deadline: float | None = None
        while True:
            try:
                return fn(*args, **kwargs)
            except sqlite3.OperationalError as err:
                if getattr(err, "sqlite_errorcode", None) not in RETRYABLE or _partial(fn):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.busy_timeout_s
                if now >= deadline:
                    raise
                await asyncio.sleep(min(wait_s, deadline - now))
                wait_s = min(wait_s * 2, LONGEST_WAIT_S)

    async def _connect(self) -> InlineConnection:
        if self._connection is None:
            self._connection = self._connector()
        return self

    def __await__(self) -> Generator[Any, None, InlineConnection]:
        return self._connect().__await__()  # (no thread to start)

    def stop(self) -> None:  # type: ignore[override]
        """Close the sqlite3 connection (aiosqlite's stops its thread; there is none)."""
        self._running = False
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def close(self) -> None:
        self.stop()


def _partial(fn: Callable[..., Any]) -> bool:
    """True for a call that may have done part of its work before SQLITE_BUSY (a script)."""
    return getattr(fn, "__name__", "") == "executescript"


def inline_creator(url: URL, busy_timeout_s: float) -> Callable[[], Awaitable[InlineConnection]]:
    """`create_async_engine`'s `async_creator` for the SQLite `url`: its file (or memory, or
    `?mode=ro` URI) opened as SQLAlchemy's pysqlite dialect would open it, with a busy timeout
    of 0 (the connection waits for other writers itself, without blocking the loop)."""
    args, kwargs = SQLiteDialect_pysqlite().create_connect_args(url)
    kwargs = {**kwargs, "timeout": 0, "check_same_thread": False}

    def connect() -> sqlite3.Connection:
        conn: sqlite3.Connection = sqlite3.connect(*args, **kwargs)  # type: ignore[call-overload]
        return conn

    async def create() -> InlineConnection:
        return await InlineConnection(connect, busy_timeout_s)

    return create


class WouldWait(sqlite3.OperationalError):
    """A statement made outside SQLAlchemy's greenlet (bot.db.engine.run_now) found SQLite
    busy: waiting needs the event loop, so the caller makes it again the asynchronous way,
    which waits. Not caught, it is the "database is locked" error a busy timeout would give."""


def _call(connection: InlineConnection, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the loop's thread; on SQLITE_BUSY, wait for the other writer as
    InlineConnection does, through SQLAlchemy's greenlet (outside it: WouldWait)."""
    try:
        return fn(*args)
    except sqlite3.OperationalError as err:
        if getattr(err, "sqlite_errorcode", None) not in RETRYABLE or _partial(fn):
            raise
        if not in_greenlet():
            busy = WouldWait(*err.args)
            busy.sqlite_errorcode = err.sqlite_errorcode
            busy.sqlite_errorname = err.sqlite_errorname
            raise busy from err
        return await_(connection._execute(fn, *args))  # type: ignore[no-any-return]


def _sqlite3(connection: InlineConnection) -> sqlite3.Connection:
    """The open sqlite3 connection, or SQLAlchemy's error for a closed one."""
    try:
        return connection._conn
    except ValueError as err:  # "no active connection"
        raise sqlite3.OperationalError(str(err)) from err


class _Ready:
    """An awaitable that is done at once."""

    def __await__(self) -> Generator[Any, None, None]:
        return iter(())  # type: ignore[return-value]


_READY = _Ready()


class InlineCursor(AsyncAdapt_aiosqlite_cursor):
    """SQLAlchemy's aiosqlite cursor, its calls made directly on sqlite3's cursor.

    SQLAlchemy's adapter awaits every driver call (the cursor opened, the statement, its rows,
    the cursor closed) through a greenlet switch and a coroutine each, which cost more than the
    statement on the loop's SQLite. Here they are plain calls; only a statement that finds the
    database busy goes through the greenlet, to wait (`_call`). With no awaits, a statement can
    also be made outside a greenlet (bot.db.engine: run_now, LoopSession.direct)."""

    __slots__ = ()
    _awaitable_cursor_close = False  # close() calls sqlite3's close

    def __init__(self, adapt_connection: AsyncAdapt_aiosqlite_connection) -> None:
        self._adapt_connection = adapt_connection
        self._connection = adapt_connection._connection
        self._cursor = _sqlite3(self._connection).cursor()  # type: ignore[arg-type,assignment]
        self._soft_closed_memoized = EMPTY_DICT
        self._rows = collections.deque()

    def execute(self, operation: Any, parameters: Any = None) -> Any:
        if in_greenlet():
            # AsyncConnection.execute insists on one await (AwaitRequired): one that is ready
            # at once, two greenlet switches instead of the adapter's four awaits.
            await_(_READY)
        cursor: Any = self._cursor
        connection: Any = self._connection
        _call(connection, cursor.execute, operation, () if parameters is None else parameters)
        if cursor.description:
            self._rows = collections.deque(_call(connection, cursor.fetchall))

    def executemany(self, operation: Any, seq_of_parameters: Any) -> Any:
        cursor: Any = self._cursor
        _call(self._connection, cursor.executemany, operation, seq_of_parameters)  # type: ignore[arg-type]


class InlineAdaptedConnection(AsyncAdapt_aiosqlite_connection):
    """SQLAlchemy's aiosqlite connection adapter with InlineCursor, and commit and rollback
    made directly (a busy one waits as a statement does)."""

    __slots__ = ()
    _cursor_cls = InlineCursor  # type: ignore[assignment]

    def commit(self) -> None:
        if self._connection._connection is not None:  # type: ignore[attr-defined]
            _call(self._connection, self._connection._connection.commit)  # type: ignore[arg-type,attr-defined]

    def rollback(self) -> None:
        if self._connection._connection is not None:  # type: ignore[attr-defined]
            _call(self._connection, self._connection._connection.rollback)  # type: ignore[arg-type,attr-defined]


class InlineDBAPI(AsyncAdapt_aiosqlite_dbapi):
    """The aiosqlite dialect's DBAPI module (`create_async_engine(..., module=...)`), its
    connections (from `inline_creator`) adapted by InlineAdaptedConnection."""

    def connect(self, *arg: Any, **kw: Any) -> InlineAdaptedConnection:
        creator_fn = kw.pop("async_creator_fn")
        return InlineAdaptedConnection(self, await_(creator_fn(*arg, **kw)))


def inline_dbapi() -> InlineDBAPI:
    """The DBAPI module for an engine whose connections come from `inline_creator`."""
    return InlineDBAPI(aiosqlite, sqlite3)
