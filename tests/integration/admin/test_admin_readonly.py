"""`admin sql` is read-only whatever the statement and whatever role DATABASE_URL has.

docs/guarantees.md, invariant 9. On PostgreSQL a READ ONLY transaction is not enough: as a superuser
(what the tests' own TEST_DATABASE_URL is, and what DATABASE_URL often is) the statements below run
a shell command, write a file, create and delete large objects, terminate a session, reload the
configuration, read a server file and send notifications from inside one; as any role, by default,
they still create large objects and send notifications. So admin sql refuses to run as a role that
could do more than read, and `python -m bot db readonly-role` makes one that cannot. On SQLite an
authorizer refuses what mode=ro lets through (fts3_tokenizer)."""

from __future__ import annotations

import asyncio
import base64
import sqlite3
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from bot.admin import sql as admin_sql
from bot.admin.pgrole import RoleError, ensure_readonly_role, role_problems, scram_sha256_verifier
from bot.conversations.store import ConversationStore
from bot.db import migrate
from bot.db.engine import make_engine, make_sessionmaker
from bot.reports import admin as reports
from tests.integration.admin.test_admin import seed, snapshot
from tests.support.cli import cli_env, run_cli
from tests.support.dbutil import (
    create_pg_database,
    drop_pg_database,
    drop_pg_role,
    make_readonly_role,
)
from tests.support.waits import until


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _as_role(url: str, role: str) -> str:
    return make_url(url).set(username=role, password=None).render_as_string(hide_password=False)


def cli(env_update: dict[str, str], *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m bot ...` in a clean environment plus `env_update`."""
    return run_cli(*argv, cwd=cwd, env=cli_env(cwd, **env_update))


def assert_one_clean_line(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit status 1, and one `error: ...` line on stderr holding `words`, no traceback."""
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for word in words:
        assert word in proc.stderr, (word, proc.stderr)


# --- PostgreSQL ----------------------------------------------------------------------------------


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database; its URL is the superuser's (TEST_DATABASE_URL)."""
    url = create_pg_database()
    try:
        migrate.upgrade(url)
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[ConversationStore]:
    """The seeded bot tables of `pg_url`."""
    engine = make_engine(pg_url)
    store = ConversationStore(make_sessionmaker(engine))
    await seed(store)
    yield store
    await engine.dispose()


@pytest.fixture
def ro_url(pg_url: str) -> Iterator[str]:
    """A role made by `db readonly-role` for `pg_url`."""
    url = make_readonly_role(pg_url)
    yield url
    drop_pg_role(url)


@pytest.fixture
def extra_roles() -> Iterator[list[str]]:
    """URLs of roles a test made; dropped afterwards."""
    made: list[str] = []
    yield made
    for url in made:
        drop_pg_role(url)


@dataclass
class World:
    """What the hostile statements could touch, and how to tell that nothing was touched."""

    superuser: Any  # asyncpg connection (the test's own, superuser)
    victims: list[Any]  # connections the statements try to terminate
    lo: int  # a large object made by the superuser
    files: list[str]  # files COPY may try to create on the server
    channel: str
    notified: list[str]
    conf_loaded: Any
    objects: list[int]

    def statements(self) -> list[str]:
        """The statements of issue 11, item 1 (and a few more of the same kind)."""
        prog, file = self.files
        pids = [v.get_server_pid() for v in self.victims]
        return [
            f"COPY (SELECT 1) TO PROGRAM 'cat > {prog}'",
            f"COPY (SELECT 1) TO '{file}'",
            "SELECT lo_from_bytea(0, 'x')",
            "SELECT lo_create(0)",
            "SELECT lo_creat(-1)",
            f"SELECT lo_unlink({self.lo})",
            f"SELECT lo_put({self.lo}, 0, 'zz')",
            "SELECT lo_import('/etc/hostname')",
            *(f"SELECT pg_terminate_backend({pid})" for pid in pids),
            *(f"SELECT pg_cancel_backend({pid})" for pid in pids),
            "SELECT pg_reload_conf()",
            "SELECT pg_read_file('/etc/hostname')",
            "SELECT pg_read_file('PG_VERSION')",
            "SELECT query_to_xml('SELECT pg_read_file(''PG_VERSION'')', true, true, '')",
            f"NOTIFY {self.channel}",
            f"SELECT pg_notify('{self.channel}', 'y')",
            "SET TRANSACTION READ WRITE",
            "SELECT pg_logical_emit_message(false, 'bot', 'x')",
            "SELECT nextval('messages_id_seq')",
            "SELECT * FROM sessions FOR UPDATE",
        ]

    async def assert_untouched(self) -> None:
        """No file, no new or changed or deleted large object, every victim alive, no
        notification, no configuration reload."""
        for path in self.files:
            assert await self.superuser.fetchval("SELECT pg_stat_file($1, true)", path) is None
        assert await self._objects() == self.objects
        assert await self.superuser.fetchval("SELECT lo_get($1)", self.lo) == b"keep"
        for victim in self.victims:
            assert await victim.fetchval("SELECT 1") == 1
        # Notifications arrive in the order their transactions committed: once a marker sent
        # now is here, one that a statement above sent would be here too, before it.
        await self.superuser.execute(f"SELECT pg_notify('{self.channel}', 'marker')")
        await until(lambda: bool(self.notified), within_s=5, what="the marker notification")
        assert self.notified == ["marker"]
        self.notified.clear()
        assert await self.superuser.fetchval("SELECT pg_conf_load_time()") == self.conf_loaded

    async def _objects(self) -> list[int]:
        rows = await self.superuser.fetch("SELECT oid FROM pg_largeobject_metadata ORDER BY oid")
        return [r["oid"] for r in rows]


@pytest.fixture
async def world(pg_url: str) -> AsyncIterator[World]:
    """A large object, a listener, and connections to terminate, on `pg_url`."""
    superuser = await asyncpg.connect(_dsn(pg_url))
    victims = [await asyncpg.connect(_dsn(pg_url))]
    tag = uuid.uuid4().hex[:12]
    notified: list[str] = []
    channel = f"bot_ro_{tag}"
    await superuser.add_listener(channel, lambda *args: notified.append(str(args[-1])))
    lo = await superuser.fetchval("SELECT lo_from_bytea(0, 'keep')")
    w = World(
        superuser=superuser,
        victims=victims,
        lo=lo,
        files=[f"/tmp/bot_ro_{tag}_program", f"/tmp/bot_ro_{tag}_file"],
        channel=channel,
        notified=notified,
        conf_loaded=await superuser.fetchval("SELECT pg_conf_load_time()"),
        objects=[],
    )
    w.objects = await w._objects()
    yield w
    for path in w.files:  # only if a test failed; the server's OS user made them
        await superuser.execute(f"COPY (SELECT 1) TO PROGRAM 'cat > /dev/null; rm -f {path}'")
    for conn in [*w.victims, superuser]:
        await conn.close()


async def test_a_read_only_transaction_alone_stops_none_of_this(pg_url: str, world: World) -> None:
    """Why admin sql checks the role: what the old code relied on lets these through."""
    prog = world.files[0]
    victim = world.victims[0]
    conn = await asyncpg.connect(
        _dsn(pg_url), server_settings={"default_transaction_read_only": "on"}
    )
    try:
        async with conn.transaction(readonly=True):
            await conn.execute(f"COPY (SELECT 1) TO PROGRAM 'cat > {prog}'")
            await conn.fetchval("SELECT lo_from_bytea(0, 'x')")
            await conn.fetchval(f"SELECT pg_notify('{world.channel}', 'y')")
            assert await conn.fetchval(f"SELECT pg_terminate_backend({victim.get_server_pid()})")
    finally:
        await conn.close()
    assert await world.superuser.fetchval("SELECT pg_stat_file($1, true)", prog) is not None
    assert len(await world._objects()) == len(world.objects) + 1
    await until(lambda: bool(world.notified), within_s=5, what="the notification")
    assert world.notified == ["y"]
    world.victims.remove(victim)  # terminated
    victim.terminate()


async def test_any_role_may_create_large_objects_and_notify_unless_revoked(
    pg_url: str, extra_roles: list[str], world: World
) -> None:
    """Why `db readonly-role` revokes from PUBLIC: a role granted nothing but SELECT can."""
    name = f"bot_test_plain_{uuid.uuid4().hex[:8]}"
    await world.superuser.execute(f'CREATE ROLE "{name}" LOGIN')
    extra_roles.append(_as_role(pg_url, name))
    conn = await asyncpg.connect(_dsn(_as_role(pg_url, name)))
    try:
        async with conn.transaction(readonly=True):
            await conn.fetchval("SELECT lo_create(0)")
            await conn.fetchval(f"SELECT pg_notify('{world.channel}', 'plain')")
    finally:
        await conn.close()
    assert len(await world._objects()) == len(world.objects) + 1
    await until(lambda: bool(world.notified), within_s=5, what="the notification")
    assert world.notified == ["plain"]


async def test_superuser_connection_is_refused_before_anything_runs(
    pg_url: str, pg_store: ConversationStore, world: World, tmp_path: Path
) -> None:
    before = await snapshot(pg_store)
    for sql in world.statements():
        with pytest.raises(admin_sql.SqlRefused) as caught:
            await admin_sql.readonly_sql(pg_url, sql)
        message = str(caught.value)
        assert "is a superuser" in message, (sql, message)
        assert "ADMIN_DATABASE_URL" in message and "db readonly-role" in message, message
    # The real command line, with DATABASE_URL a superuser's and no ADMIN_DATABASE_URL.
    proc = await asyncio.to_thread(
        cli, {"DATABASE_URL": pg_url}, "admin", "sql", world.statements()[0], cwd=tmp_path
    )
    assert_one_clean_line(proc, "refused: admin sql", "is a superuser", "ADMIN_DATABASE_URL")
    # ADMIN_DATABASE_URL naming the superuser is no better.
    proc = await asyncio.to_thread(
        cli,
        {"DATABASE_URL": pg_url, "ADMIN_DATABASE_URL": pg_url},
        "admin",
        "sql",
        "SELECT lo_from_bytea(0, 'x')",
        cwd=tmp_path,
    )
    assert_one_clean_line(proc, "is a superuser")
    await world.assert_untouched()
    assert await snapshot(pg_store) == before


async def test_the_read_only_role_is_refused_everything_by_the_database(
    pg_url: str, pg_store: ConversationStore, ro_url: str, world: World, tmp_path: Path
) -> None:
    role = make_url(ro_url).username
    assert await role_problems(world.superuser, str(role)) == []  # admin sql's checks pass
    ro_victim = await asyncpg.connect(_dsn(ro_url))  # its own role's session, too
    world.victims.append(ro_victim)
    before = await snapshot(pg_store)

    # Through admin sql: every statement refused.
    for sql in world.statements():
        with pytest.raises(admin_sql.SqlRefused) as caught:
            await admin_sql.readonly_sql(ro_url, sql)
        assert str(caught.value).startswith("refused: admin sql "), sql

    # Straight to the database as that role, without admin sql's query-only check, in a READ
    # ONLY transaction that has run a query (as admin sql's does): the server refuses each.
    # (Not NOTIFY: PostgreSQL allows it in a read-only transaction; admin sql refuses it as a
    # statement that returns no rows, and this rolls back, which drops it.)
    for sql in world.statements():
        if sql.startswith("NOTIFY"):
            continue
        conn = await asyncpg.connect(_dsn(ro_url))
        try:
            # The role's own default is read-only, whatever the client asks for.
            assert await conn.fetchval("SHOW default_transaction_read_only") == "on"
            tr = conn.transaction(readonly=True)
            await tr.start()
            await conn.fetchval("SELECT 1")
            with pytest.raises(asyncpg.PostgresError) as refused:
                await conn.execute(sql)
            assert isinstance(
                refused.value,
                asyncpg.InsufficientPrivilegeError
                | asyncpg.ReadOnlySQLTransactionError
                | asyncpg.ActiveSQLTransactionError,
            ), (sql, refused.value)
            await tr.rollback()
        finally:
            await conn.close()

    # Ordinary queries work, through the real command line too.
    result = await admin_sql.readonly_sql(
        ro_url, "SELECT chat_id, COUNT(*) FROM messages GROUP BY chat_id ORDER BY chat_id"
    )
    assert result.rows == [(1001, 8), (1002, 4), (1003, 2)]
    result = await admin_sql.readonly_sql(
        ro_url,
        "SELECT s.persona, COUNT(m.id) FROM sessions s JOIN messages m "
        "ON m.session_id = s.id WHERE s.chat_id = 1003 GROUP BY s.persona",
    )
    assert result.rows == [("", 2)]
    env = {"DATABASE_URL": pg_url, "ADMIN_DATABASE_URL": ro_url}
    proc = await asyncio.to_thread(
        cli, env, "admin", "sql", "SELECT COUNT(*) AS n FROM inbox", "--json", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert '"n"' in proc.stdout
    proc = await asyncio.to_thread(
        cli, env, "admin", "sql", f"SELECT lo_unlink({world.lo})", cwd=tmp_path
    )
    assert_one_clean_line(proc, "refused: admin sql", "permission denied for function lo_unlink")

    await world.assert_untouched()
    assert await snapshot(pg_store) == before

    # A table a later migration makes (as the tables' owner) is readable without a new grant.
    await world.superuser.execute(
        "CREATE TABLE later_migration (id int); INSERT INTO later_migration VALUES (7)"
    )
    assert (await admin_sql.readonly_sql(ro_url, "SELECT id FROM later_migration")).rows == [(7,)]


async def test_a_role_that_can_do_more_than_read_is_refused_with_what_to_do(
    pg_url: str, pg_store: ConversationStore, world: World, extra_roles: list[str], tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    setups = {
        # A role granted SELECT by hand: PUBLIC still has lo_create, pg_notify, ...
        "select_only": ("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {r}", "may run lo_creat"),
        "writer": ("GRANT SELECT, INSERT ON messages TO {r}", "owns or may write messages"),
        "owner": ("ALTER TABLE inbox OWNER TO {r}", "owns or may write inbox"),
        "files": ("GRANT pg_write_server_files TO {r}", "is a member of pg_write_server_files"),
        "program": ("GRANT pg_execute_server_program TO {r}", "pg_execute_server_program"),
        "signal": ("GRANT pg_signal_backend TO {r}", "is a member of pg_signal_backend"),
        "all_data": ("GRANT pg_write_all_data TO {r}", "is a member of pg_write_all_data"),
        "createrole": ("ALTER ROLE {r} CREATEROLE", "has CREATEROLE"),
        "creator": ("GRANT CREATE ON SCHEMA public TO {r}", "may CREATE in schema public"),
    }
    for kind, (grant, words) in setups.items():
        name = f"bot_test_{kind}_{tag}"
        await world.superuser.execute(f'CREATE ROLE "{name}" LOGIN')
        url = _as_role(pg_url, name)
        extra_roles.append(url)
        await world.superuser.execute(grant.format(r=f'"{name}"'))
        for sql in ("SELECT 1", world.statements()[2]):
            with pytest.raises(admin_sql.SqlRefused) as caught:
                await admin_sql.readonly_sql(url, sql)
            message = str(caught.value)
            assert message.startswith(
                f"refused: admin sql runs only as a read-only PostgreSQL role, and {name!r} "
            ), message
            assert words in message, (kind, message)
            assert "ADMIN_DATABASE_URL" in message and "db readonly-role" in message, message
    proc = await asyncio.to_thread(
        cli,
        {"DATABASE_URL": pg_url, "ADMIN_DATABASE_URL": extra_roles[1]},
        "admin",
        "sql",
        "SELECT COUNT(*) FROM messages",
        cwd=tmp_path,
    )
    assert_one_clean_line(proc, "owns or may write messages", "db readonly-role")
    await world.assert_untouched()


async def test_db_readonly_role_command(
    pg_url: str, extra_roles: list[str], tmp_path: Path
) -> None:
    name = f"bot_test_cmd_{uuid.uuid4().hex[:8]}"
    extra_roles.append(_as_role(pg_url, name))
    env = {"DATABASE_URL": pg_url, "BOT_TEST_RO_PASSWORD": "correct horse-battery"}
    proc = await asyncio.to_thread(
        cli,
        env,
        "db",
        "readonly-role",
        name,
        "--password-env",
        "BOT_TEST_RO_PASSWORD",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"role {name} created" in proc.stdout
    assert "correct horse" not in proc.stdout + proc.stderr
    url_line = next(
        line for line in proc.stdout.splitlines() if line.startswith("ADMIN_DATABASE_URL=")
    )
    shown = make_url(url_line.removeprefix("ADMIN_DATABASE_URL="))
    target = make_url(pg_url)
    assert (shown.username, shown.host, shown.port, shown.database) == (
        name,
        target.host,
        target.port,
        target.database,
    )
    assert "***" in url_line
    # Idempotent; the password stays what it was.
    conn = await asyncpg.connect(_dsn(pg_url))
    try:
        stored = await conn.fetchval("SELECT rolpassword FROM pg_authid WHERE rolname = $1", name)
        iterations, salt = stored.split("$")[1].split(":")
        assert stored == scram_sha256_verifier(
            "correct horse-battery", salt=base64.b64decode(salt), iterations=int(iterations)
        )
        proc = await asyncio.to_thread(cli, env, "db", "readonly-role", name, cwd=tmp_path)
        assert proc.returncode == 0 and f"role {name} updated" in proc.stdout, proc.stderr
        assert (
            await conn.fetchval("SELECT rolpassword FROM pg_authid WHERE rolname = $1", name)
            == stored
        )
        assert await role_problems(conn, name) == []
        # The service's role (the tables' owner) still has what it had.
        assert await conn.fetchval(
            "SELECT has_function_privilege('postgres', 'lo_create(oid)', 'EXECUTE')"
        )
    finally:
        await conn.close()
    # Never the service's own role or a superuser.
    proc = await asyncio.to_thread(
        cli, env, "db", "readonly-role", str(target.username), cwd=tmp_path
    )
    assert_one_clean_line(proc, "pick a new name")
    # SQLite has nothing to set up.
    sqlite_url = f"sqlite+aiosqlite:///{tmp_path / 'x.sqlite3'}"
    proc = await asyncio.to_thread(
        cli, {"DATABASE_URL": sqlite_url}, "db", "readonly-role", "ro", cwd=tmp_path
    )
    assert_one_clean_line(proc, "for PostgreSQL")


async def test_db_readonly_role_with_a_service_role_that_is_no_superuser(
    extra_roles: list[str],
) -> None:
    """The production set-up: the service's role owns the database and may create roles.
    It cannot revoke from PUBLIC, so a superuser runs the command once; the service's role
    keeps what it had, and can rerun the command from then on."""
    tag = uuid.uuid4().hex[:8]
    owner, name = f"bot_test_service_{tag}", f"bot_test_ro_{tag}"
    url = await asyncio.to_thread(create_pg_database)
    try:
        su = await asyncpg.connect(_dsn(url))
        try:
            await su.execute(f'CREATE ROLE "{owner}" LOGIN CREATEROLE')
            extra_roles.extend([_as_role(url, name), _as_role(url, owner)])
            await su.execute(f'ALTER DATABASE "{make_url(url).database}" OWNER TO "{owner}"')
            owner_url = _as_role(url, owner)
            await asyncio.to_thread(migrate.upgrade, owner_url)

            with pytest.raises(RoleError, match="needs a superuser"):
                await ensure_readonly_role(owner_url, name)
            assert not await su.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", name)

            role = await ensure_readonly_role(url, name)
            assert (role.created, role.owner) == (True, owner)
            assert await role_problems(su, name) == []
            service_can = await su.fetchval(
                "SELECT has_function_privilege($1, 'lo_create(oid)', 'EXECUTE')"
                " AND has_function_privilege($1, 'pg_notify(text,text)', 'EXECUTE')"
                " AND has_schema_privilege($1, 'public', 'CREATE')",
                owner,
            )
            assert service_can
            assert not (await ensure_readonly_role(owner_url, name)).created
        finally:
            await su.close()
        # The service's role is refused as admin sql's role; the new one works.
        with pytest.raises(admin_sql.SqlRefused, match="may CREATE in the database"):
            await admin_sql.readonly_sql(owner_url, "SELECT 1")
        result = await admin_sql.readonly_sql(_as_role(url, name), "SELECT COUNT(*) FROM sessions")
        assert result.rows == [(0,)]
    finally:
        await asyncio.to_thread(drop_pg_database, url)


async def test_db_readonly_role_changes_nothing_when_the_role_would_not_be_read_only(
    pg_url: str, extra_roles: list[str]
) -> None:
    name = f"bot_test_member_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(_dsn(pg_url))
    try:
        await conn.execute(f'CREATE ROLE "{name}" LOGIN IN ROLE pg_signal_backend')
        extra_roles.append(_as_role(pg_url, name))
        with pytest.raises(RoleError) as caught:
            await ensure_readonly_role(pg_url, name)
        assert "nothing was changed" in str(caught.value)
        assert "is a member of pg_signal_backend" in str(caught.value)
        assert not await conn.fetchval("SELECT has_table_privilege($1, 'messages', 'SELECT')", name)
        assert await conn.fetchval(
            "SELECT has_function_privilege('public', 'lo_create(oid)', 'EXECUTE')"
        )
    finally:
        await conn.close()


async def test_scram_verifier_matches_the_servers_own(pg_url: str, extra_roles: list[str]) -> None:
    name = f"bot_test_scram_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(_dsn(pg_url))
    try:
        await conn.execute("SET password_encryption = 'scram-sha-256'")
        await conn.execute(f"CREATE ROLE \"{name}\" PASSWORD 'Tr0ub4dor&3 x''y'")
        extra_roles.append(_as_role(pg_url, name))
        stored = await conn.fetchval("SELECT rolpassword FROM pg_authid WHERE rolname = $1", name)
    finally:
        await conn.close()
    iterations, salt = stored.split("$")[1].split(":")
    mine = scram_sha256_verifier(
        "Tr0ub4dor&3 x'y", salt=base64.b64decode(salt), iterations=int(iterations)
    )
    assert mine == stored
    with pytest.raises(RoleError, match="ASCII"):
        scram_sha256_verifier("pässword")


# --- SQLite --------------------------------------------------------------------------------------


@pytest.fixture
def sqlite_file(sqlite_url: str) -> str:
    """The migrated SQLite database, with a row of text that is not UTF-8."""
    path = make_url(sqlite_url).database
    conn = sqlite3.connect(str(path))
    conn.execute("CREATE TABLE junk (id INTEGER PRIMARY KEY, t TEXT)")
    conn.execute("INSERT INTO junk (t) VALUES ('fine'), (CAST(x'ff41' AS TEXT))")
    conn.commit()
    conn.close()
    return sqlite_url


async def test_sqlite_fts3_tokenizer_is_refused_cleanly(sqlite_file: str, tmp_path: Path) -> None:
    sql = "SELECT fts3_tokenizer('simple', fts3_tokenizer('simple'))"
    with pytest.raises(admin_sql.SqlRefused, match=r"fts3_tokenizer\(\) is switched off"):
        await admin_sql.readonly_sql(sqlite_file, sql)
    with pytest.raises(admin_sql.SqlRefused, match="fts3_tokenizer"):
        await admin_sql.readonly_sql(sqlite_file, "SELECT hex(fts3_tokenizer('simple'))")
    proc = await asyncio.to_thread(
        cli, {"DATABASE_URL": sqlite_file}, "admin", "sql", sql, cwd=tmp_path
    )
    assert_one_clean_line(
        proc, "refused: admin sql is read-only", "fts3_tokenizer() is switched off"
    )


async def test_sqlite_undecodable_text_is_a_clean_error(sqlite_file: str, tmp_path: Path) -> None:
    for sql, column in (
        ("SELECT id, t FROM junk ORDER BY id", "t"),
        ("SELECT CAST(x'c328' AS TEXT) AS raw", "raw"),
    ):
        with pytest.raises(reports.AdminError) as caught:
            await admin_sql.readonly_sql(sqlite_file, sql)
        message = str(caught.value)
        assert f"column {column!r} holds text that is not valid UTF-8" in message, message
        assert f"select hex({column})" in message, message
    proc = await asyncio.to_thread(
        cli, {"DATABASE_URL": sqlite_file}, "admin", "sql", "SELECT t FROM junk", cwd=tmp_path
    )
    assert_one_clean_line(proc, "not valid UTF-8", "hex(t)")
    # As its bytes, the value is fine.
    result = await admin_sql.readonly_sql(sqlite_file, "SELECT hex(t) FROM junk ORDER BY id")
    assert result.rows == [("66696E65",), ("FF41",)]


async def test_sqlite_authorizer_lets_queries_through_and_nothing_else(sqlite_file: str) -> None:
    ok = {
        "PRAGMA table_info(messages)": None,
        "SELECT name FROM pragma_table_info('messages') WHERE name = 'text'": [("text",)],
        "PRAGMA user_version": None,
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3) "
        "SELECT COUNT(*) FROM n": [(3,)],
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'messages'": [(1,)],
        "EXPLAIN QUERY PLAN SELECT * FROM messages": None,
    }
    for sql, rows in ok.items():
        result = await admin_sql.readonly_sql(sqlite_file, sql)
        if rows is not None:
            assert result.rows == rows, sql
    refused = [
        "PRAGMA user_version = 3",
        "PRAGMA writable_schema = ON",
        "PRAGMA wal_checkpoint",
        "SELECT load_extension('/nonexistent')",
        "BEGIN",
        "ANALYZE",
        "VACUUM",
        "REINDEX",
    ]
    for sql in refused:
        with pytest.raises(admin_sql.SqlRefused, match="read-only"):
            await admin_sql.readonly_sql(sqlite_file, sql)
