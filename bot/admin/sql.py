"""Read-only ad-hoc SQL for admins (`python -m bot admin sql`; later the dashboard).

Read-only rests on the database, not on parsing the SQL: see readonly_sql and
docs/administration.md.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.reports.admin import AdminError


class SqlRefused(AdminError):
    """`admin sql` refused a statement (a write, or more than one statement)."""


# --- read-only SQL -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SqlResult:
    """Rows of an ad-hoc query."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool


def sqlite_path(url: str) -> Path:
    """The database file of an SQLite URL; AdminError if it is in memory or missing."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        raise AdminError(f"cannot inspect SQLite database {database or ':memory:'!r}")
    path = Path(database).expanduser().resolve()
    if not path.is_file():
        raise AdminError(
            f"no database at {path}: check DATABASE_URL / DATA_DIR, "
            "or create it with `python -m bot db upgrade`"
        )
    return path


READ_ONLY_MESSAGE = "refused: admin sql is read-only, use it for SELECT queries ({reason})"
ONE_STATEMENT_MESSAGE = "refused: admin sql runs exactly one statement ({reason})"
QUERY_ONLY_MESSAGE = (
    "refused: admin sql is read-only and runs queries only, statements that return rows "
    "(SELECT, WITH, VALUES, TABLE, SHOW, EXPLAIN); {reason}"
)
ROLE_MESSAGE = (
    "refused: admin sql runs only as a read-only PostgreSQL role, and {role!r} {problems}. "
    "Create one with `python -m bot db readonly-role bot_readonly` (run with a superuser's "
    "DATABASE_URL) and set ADMIN_DATABASE_URL to the URL it prints"
)

# --- SQLite: mode=ro, no ATTACH, and an authorizer that lets through only what a query needs.

# Switched off: fts3_tokenizer() hands out and takes raw memory pointers (a crash or worse);
# load_extension() runs native code (sqlite3 disables it already).
_SQLITE_DENIED_FUNCTIONS = frozenset({"fts3_tokenizer", "load_extension"})
# PRAGMAs that only report; with an argument only those whose argument names what to report on.
_SQLITE_READ_PRAGMAS = frozenset(
    {
        "application_id", "collation_list", "compile_options", "data_version", "database_list",
        "encoding", "foreign_key_check", "foreign_key_list", "foreign_keys", "freelist_count",
        "function_list", "index_info", "index_list", "index_xinfo", "integrity_check",
        "journal_mode", "module_list", "page_count", "page_size", "pragma_list", "quick_check",
        "read_uncommitted",  # read by SQLAlchemy when it connects (readonly_engine)
        "schema_version", "table_info", "table_list", "table_xinfo", "user_version",
    }
)  # fmt: skip
_SQLITE_PRAGMAS_WITH_ARGUMENT = frozenset(
    {
        "foreign_key_check", "foreign_key_list", "index_info", "index_list", "index_xinfo",
        "integrity_check", "quick_check", "table_info", "table_list", "table_xinfo",
    }
)  # fmt: skip
_SQLITE_ACTIONS = {
    getattr(sqlite3, name): name.removeprefix("SQLITE_").replace("_", " ")
    for name in (
        "SQLITE_CREATE_INDEX", "SQLITE_CREATE_TABLE", "SQLITE_CREATE_TEMP_INDEX",
        "SQLITE_CREATE_TEMP_TABLE", "SQLITE_CREATE_TEMP_TRIGGER", "SQLITE_CREATE_TEMP_VIEW",
        "SQLITE_CREATE_TRIGGER", "SQLITE_CREATE_VIEW", "SQLITE_DELETE", "SQLITE_DROP_INDEX",
        "SQLITE_DROP_TABLE", "SQLITE_DROP_TEMP_INDEX", "SQLITE_DROP_TEMP_TABLE",
        "SQLITE_DROP_TEMP_TRIGGER", "SQLITE_DROP_TEMP_VIEW", "SQLITE_DROP_TRIGGER",
        "SQLITE_DROP_VIEW", "SQLITE_INSERT", "SQLITE_TRANSACTION", "SQLITE_UPDATE",
        "SQLITE_ATTACH", "SQLITE_DETACH", "SQLITE_ALTER_TABLE", "SQLITE_REINDEX",
        "SQLITE_ANALYZE", "SQLITE_CREATE_VTABLE", "SQLITE_DROP_VTABLE", "SQLITE_SAVEPOINT",
    )
    if hasattr(sqlite3, name)
}  # fmt: skip


class _SqliteGuard:
    """The authorizer: allows reading and harmless functions, and says what it denied."""

    def __init__(self) -> None:
        self.denied: str | None = None

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, _db: str | None, _src: str | None
    ) -> int:
        reason = self._check(action, arg1, arg2)
        if reason is None:
            return sqlite3.SQLITE_OK
        self.denied = self.denied or reason
        return sqlite3.SQLITE_DENY

    @staticmethod
    def _check(action: int, arg1: str | None, arg2: str | None) -> str | None:
        if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE):
            return None
        if action == sqlite3.SQLITE_FUNCTION:
            name = (arg2 or "").lower()
            if name in _SQLITE_DENIED_FUNCTIONS:
                return f"{name}() is switched off"
            return None
        if action == sqlite3.SQLITE_PRAGMA:
            name = (arg1 or "").lower()
            if name in _SQLITE_READ_PRAGMAS and (
                arg2 is None or name in _SQLITE_PRAGMAS_WITH_ARGUMENT
            ):
                return None
            shown = f"PRAGMA {name}" + ("" if arg2 is None else f" = {arg2}")
            return f"{shown} is not a read-only PRAGMA"
        if action == sqlite3.SQLITE_UPDATE and arg1 in ("sqlite_master", "sqlite_schema"):
            # Table-valued PRAGMA functions (SELECT * FROM pragma_table_info('messages')) ask
            # for this while SQLite sets them up; a real write of the schema table is refused
            # by mode=ro regardless.
            return None
        what = _SQLITE_ACTIONS.get(action, f"action {action}")
        return f"{what}{f' on {arg1}' if arg1 else ''} is not a read"


class _Undecodable(bytes):
    """A TEXT value that is not valid UTF-8 (kept as bytes, reported by column)."""


def _sqlite_text(raw: bytes) -> str | bytes:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return _Undecodable(raw)


def _sqlite_readonly(path: Path, sql: str, max_rows: int, timeout_s: float) -> SqlResult:
    # mode=ro makes SQLite itself refuse every write; no ATTACH either, because attaching
    # creates the named file even on a read-only connection. The authorizer refuses, before
    # anything runs, every statement that is not a query and the functions that are unsafe
    # even in one (fts3_tokenizer).
    uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=timeout_s)
    except sqlite3.Error as err:
        raise AdminError(f"cannot open {path} read-only: {err}") from err
    try:
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        guard = _SqliteGuard()
        conn.set_authorizer(guard)
        # Text that is not UTF-8 becomes a clean error naming its column, not a traceback.
        conn.text_factory = _sqlite_text
        deadline = time.monotonic() + timeout_s
        # A runaway query is interrupted, like statement_timeout on PostgreSQL.
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            cur = conn.execute(sql)
            rows = cur.fetchmany(max_rows + 1)
        except sqlite3.ProgrammingError as err:
            if "one statement" in str(err):
                raise SqlRefused(ONE_STATEMENT_MESSAGE.format(reason=err)) from err
            raise AdminError(f"SQL failed: {err}") from err
        except sqlite3.DatabaseError as err:
            text = str(err)
            if guard.denied is not None:  # "not authorized", "authorization denied"
                raise SqlRefused(READ_ONLY_MESSAGE.format(reason=guard.denied)) from err
            if "readonly" in text or "read-only" in text or "attached databases" in text:
                raise SqlRefused(READ_ONLY_MESSAGE.format(reason=text)) from err
            if text == "interrupted":
                raise AdminError(f"SQL took longer than {timeout_s:g} s and was stopped") from err
            raise AdminError(f"SQL failed: {text}") from err
        except sqlite3.Error as err:
            raise AdminError(f"SQL failed: {err}") from err
        except UnicodeDecodeError as err:  # a column name that is not UTF-8
            raise AdminError(f"SQL failed: a result column name is not UTF-8 ({err})") from err
        columns = [d[0] for d in cur.description or ()]
        result = [tuple(r) for r in rows[:max_rows]]
        for row in result:
            for name, value in zip(columns, row, strict=True):
                if isinstance(value, _Undecodable):
                    raise AdminError(
                        f"column {name!r} holds text that is not valid UTF-8 "
                        f"(e.g. {bytes(value[:16])!r}); select hex({name}) to see its bytes"
                    )
        return SqlResult(columns, result, len(rows) > max_rows)
    finally:
        conn.rollback()
        conn.close()


# --- PostgreSQL: a role that can only read, in a READ ONLY transaction, queries only. ----------


def _asyncpg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _postgres_readonly(url: str, sql: str, max_rows: int, timeout_s: float) -> SqlResult:
    import asyncpg

    from bot.admin.pgrole import role_problems

    try:
        conn = await asyncpg.connect(
            _asyncpg_dsn(url),
            timeout=min(timeout_s, 30),
            # Every transaction of this session is read-only, not just the one opened below.
            server_settings={
                "default_transaction_read_only": "on",
                "statement_timeout": str(int(timeout_s * 1000)),
                # CURRENT_DATE and printed timestamps in UTC, as on SQLite.
                "TimeZone": "UTC",
            },
        )
    except (OSError, asyncpg.PostgresError, TimeoutError) as err:
        raise AdminError(f"cannot connect to PostgreSQL: {err}") from err
    tr = conn.transaction(readonly=True)
    try:
        await tr.start()
        # Checked inside the READ ONLY transaction: this query also takes its snapshot, after
        # which the server refuses SET TRANSACTION READ WRITE.
        role = await conn.fetchval("SELECT current_user::text")
        problems = await role_problems(conn, role)
        if problems:
            raise SqlRefused(ROLE_MESSAGE.format(role=role, problems="; ".join(problems)))
        # A prepared statement holds exactly one command; the server refuses more. Preparing
        # runs nothing, and tells whether the statement returns rows.
        stmt = await conn.prepare(sql)
        columns = [a.name for a in stmt.get_attributes()]
        if not columns:
            words = sql.split(None, 1)
            verb = words[0].upper() if words and words[0].isalpha() else "this statement"
            raise SqlRefused(QUERY_ONLY_MESSAGE.format(reason=f"{verb} returns none"))
        rows: list[tuple[Any, ...]] = []
        async for record in stmt.cursor():
            rows.append(tuple(record))
            if len(rows) > max_rows:
                break
    except asyncpg.ReadOnlySQLTransactionError as err:
        raise SqlRefused(READ_ONLY_MESSAGE.format(reason=err)) from err
    except asyncpg.InsufficientPrivilegeError as err:
        raise SqlRefused(READ_ONLY_MESSAGE.format(reason=err)) from err
    except asyncpg.PostgresSyntaxError as err:
        if "multiple commands" in str(err):
            raise SqlRefused(ONE_STATEMENT_MESSAGE.format(reason=err)) from err
        raise AdminError(f"SQL failed: {err}") from err
    except asyncpg.QueryCanceledError as err:
        raise AdminError(f"SQL took longer than {timeout_s:g} s and was stopped") from err
    except asyncpg.PostgresError as err:
        raise AdminError(f"SQL failed: {err}") from err
    finally:
        # Nothing to keep: roll back whatever the statement did (there should be nothing).
        try:
            if not conn.is_closed():
                await tr.rollback()
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            pass
        await conn.close()
    return SqlResult(columns, rows[:max_rows], len(rows) > max_rows)


async def readonly_sql(
    url: str, sql: str, *, max_rows: int = 1000, timeout_s: float = 60.0
) -> SqlResult:
    """Run one query on a connection the database itself keeps read-only.

    SQLite opens the file with mode=ro, and an authorizer refuses, before anything runs, what is
    not a query (and fts3_tokenizer()). PostgreSQL refuses to run as a role that could do more
    than read (bot/admin/pgrole.py: a superuser, a member of pg_execute_server_program, a table
    owner, a role that may create large objects, ...), then runs the statement in a READ ONLY
    transaction of a read-only session (time zone UTC), and only if it returns rows. Nothing
    parses the SQL: the databases judge it, and single-statement execution (sqlite3's execute,
    a PostgreSQL prepared statement) refuses a second statement.
    """
    if not sql.strip():
        raise AdminError("no SQL given")
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        path = sqlite_path(url)
        return await asyncio.to_thread(_sqlite_readonly, path, sql, max_rows, timeout_s)
    if backend == "postgresql":
        return await _postgres_readonly(url, sql, max_rows, timeout_s)
    raise AdminError(f"admin sql does not support {backend} databases")


# --- the same read-only connection as an engine, for the dashboard ----------------------------


def readonly_engine(url: str, *, timeout_s: float = 30.0) -> AsyncEngine:
    """An async engine whose every connection is read-only the way `admin sql`'s is.

    For the dashboard (bot/dashboard), which reads through SQLAlchemy queries rather than SQL
    text: SQLite connections open the file with mode=ro, no ATTACH and the same authorizer;
    PostgreSQL sessions are default_transaction_read_only (UTC, statement_timeout), and every new
    connection first checks its role with role_problems and refuses one that could do more than
    read (so ADMIN_DATABASE_URL must name a role made by `db readonly-role`). A refused
    connection raises SqlRefused when a query first needs it.
    """
    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "sqlite":
        return _sqlite_readonly_engine(u, timeout_s)
    if backend != "postgresql":
        raise AdminError(f"the dashboard does not support {backend} databases")
    return _pg_readonly_engine(u, timeout_s)


def _sqlite_readonly_engine(u: URL, timeout_s: float) -> AsyncEngine:
    """SQLite: each connection opens the file with mode=ro, no ATTACH, the authorizer."""
    from sqlalchemy.ext.asyncio import create_async_engine

    database = u.database

    async def connect() -> Any:
        import aiosqlite

        # The file is checked at connect time, not now: `run` starts the dashboard before
        # its migration has created a fresh database.
        path = sqlite_path(str(u))

        def connector() -> sqlite3.Connection:
            conn = sqlite3.connect(
                f"file:{urllib.parse.quote(str(path))}?mode=ro",
                uri=True,
                timeout=timeout_s,
                check_same_thread=False,
            )
            conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            conn.set_authorizer(_SqliteGuard())
            return conn

        return await aiosqlite.Connection(connector, iter_chunk_size=256)

    if not database or database == ":memory:":
        raise AdminError(f"cannot read SQLite database {database or ':memory:'!r}")
    from sqlalchemy.pool import AsyncAdaptedQueuePool

    # Readers do not block each other (WAL): a few connections serve concurrent pages.
    return create_async_engine(
        "sqlite+aiosqlite://",
        async_creator=connect,
        poolclass=AsyncAdaptedQueuePool,
        pool_size=4,
        hide_parameters=True,
    )


def _pg_readonly_engine(u: URL, timeout_s: float) -> AsyncEngine:
    """PostgreSQL: read-only sessions, and every new connection's role checked first."""
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(
        u.set(drivername="postgresql+asyncpg"),
        hide_parameters=True,
        pool_pre_ping=True,
        pool_recycle=300,  # the role is checked again on every new connection
        connect_args={
            "timeout": min(timeout_s, 30),
            "server_settings": {
                "default_transaction_read_only": "on",
                "statement_timeout": str(int(timeout_s * 1000)),
                "TimeZone": "UTC",
            },
        },
    )

    def check_role(dbapi_conn: Any, _record: Any) -> None:
        from bot.admin.pgrole import role_problems

        async def problems(conn: Any) -> tuple[str, list[str]]:
            role = str(await conn.fetchval("SELECT current_user::text"))
            return role, await role_problems(conn, role)

        role, found = dbapi_conn.run_async(problems)
        if found:
            message = ROLE_MESSAGE.replace("admin sql runs", "the dashboard reads")
            raise SqlRefused(message.format(role=role, problems="; ".join(found)))

    event.listen(engine.sync_engine, "connect", check_role)
    return engine
