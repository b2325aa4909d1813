"""`admin backup` / `admin restore` on SQLite and PostgreSQL: every table round-trips row for
row; restore refuses a database a service is using, a backup of a newer schema, and migrates
an older one up; SQLite's copy is the committed database while a writer holds a transaction
open; a missing pg_dump says what to install; the password appears nowhere."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from pydantic import SecretStr
from sqlalchemy import insert, select, text
from sqlalchemy.engine import make_url

from bot.admin.backup import manifest_path
from bot.admin.cli import run_admin
from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.db import leases, migrate, replicas
from bot.db.engine import make_engine, make_sessionmaker
from bot.db.models import (
    AccessRefusal,
    AccessRule,
    ArenaMatch,
    Assignment,
    AuditEntry,
    AutopilotDecision,
    ChatLease,
    ChatSetting,
    Counter,
    ExperimentRow,
    Message,
    QuotaCounter,
    Rating,
    Replica,
    UserQuota,
    VariantRow,
    VariantVersion,
    Vote,
    utcnow,
)
from tests.integration.admin.test_admin import parse_admin, seed
from tests.support.dbutil import (
    TABLES,
    create_pg_database,
    drop_pg_database,
    drop_pg_role,
    make_readonly_role,
    table_names,
)

HEAD = ScriptDirectory.from_config(migrate.alembic_config("sqlite://")).get_current_head()


async def fill_every_table(url: str) -> None:
    """Conversations through the store (tests/integration/admin/test_admin.py's seed), then one
    row or more in every other table with the ORM's tables; heartbeats and leases old, as a
    stopped service leaves them."""
    engine = make_engine(url)
    try:
        await seed(ConversationStore(make_sessionmaker(engine)))
        now = utcnow()
        old = now - timedelta(hours=2)
        async with engine.begin() as db:
            bot = (
                await db.execute(
                    select(Message.id, Message.session_id, Message.chat_id)
                    .where(Message.role == "bot")
                    .order_by(Message.id)
                )
            ).first()
            assert bot is not None
            mid, sid, chat = bot
            rows: list[tuple[Any, dict[str, Any]]] = [
                (ExperimentRow, {"name": "exp", "created_at": now, "updated_at": now}),
                (
                    VariantRow,
                    {
                        "experiment": "exp", "name": "a", "position": 1, "model": None,
                        "weight": 0.75, "is_control": True, "options": '{"topp": 0.9}',
                        "created_at": now, "updated_at": now,
                    },
                ),
                (VariantVersion, {"experiment": "exp", "name": "a", "model": "zoo:x"}),
                (
                    Assignment,
                    {
                        "chat_id": chat, "experiment": "exp", "variant": "a", "source": "hash",
                        "probability": 0.5, "allocation": '{"by": "weights"}',
                    },
                ),
                (
                    Vote,
                    {
                        "chat_id": chat, "message_id": mid, "user_id": chat, "value": 1,
                        "source": "button", "variant": "a", "updated_at": now,
                    },
                ),
                (Rating, {"chat_id": chat, "session_id": sid, "value": 4, "variant": "a"}),
                (
                    ArenaMatch,
                    {
                        "chat_id": chat, "session_id": sid, "user_message_id": mid,
                        "variant_a": "a", "text_a": "x", "variant_b": "b", "text_b": "y",
                        "winner": "tie",
                    },
                ),
                (Counter, {"name": "sent", "value": 42, "updated_at": now}),
                (
                    Replica,
                    {
                        "owner": "host:1:99:abc", "host": "host", "pid": 99, "started_at": old,
                        "heartbeat_at": old, "info": "{}",
                    },
                ),
                (
                    ChatLease,
                    {"chat_id": chat, "kind": "inbox", "owner": "host:1:99:abc",
                     "lease_until": old},
                ),
                (ChatSetting, {"chat_id": chat, "language": "de", "updated_at": now}),
                (
                    AuditEntry,
                    {
                        "at": old, "actor": "alice", "source": "cli", "action": "variants weight",
                        "target": "a", "details": '{"weight": 0.75}', "result": "ok",
                    },
                ),
                (
                    AutopilotDecision,
                    {
                        "experiment": "exp", "based_on": 1, "variant": "b", "control": "a",
                        "action": "promote", "reason": "won", "figures": "{}",
                        "decided_by": "host:1:99:abc", "created_at": now,
                    },
                ),
                (AccessRule, {"subject": "user:7", "rule": "deny", "created_at": now}),
                (AccessRefusal, {"chat_id": chat, "refused_at": old}),
                (UserQuota, {"user_id": 7, "per_day": 5, "per_minute": None, "updated_at": now}),
                (
                    QuotaCounter,
                    {"user_id": 7, "span": "day", "start": old, "replies": 5, "refused": 2},
                ),
            ]  # fmt: skip
            for model, values in rows:
                await db.execute(insert(model.__table__).values(**values))
    finally:
        await engine.dispose()


async def every_row(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of TABLES, in a fixed order; but the audit rows of restores,
    which a restore adds after it ran (see `restores`)."""
    engine = make_engine(url)
    try:
        async with engine.connect() as db:
            found = {}
            for table in sorted(TABLES):
                where = " WHERE action <> 'restore'" if table == "audit_log" else ""
                result = await db.execute(text(f"SELECT * FROM {table}{where}"))
                found[table] = sorted((tuple(r) for r in result), key=repr)
            return found
    finally:
        await engine.dispose()


async def restores(url: str) -> list[tuple[str, str]]:
    """The audit log's restore rows, oldest first: (target, result)."""
    engine = make_engine(url)
    try:
        async with engine.connect() as db:
            rows = await db.execute(
                select(AuditEntry.target, AuditEntry.result)
                .where(AuditEntry.action == "restore")
                .order_by(AuditEntry.id)
            )
            return [(str(t), str(r)) for t, r in rows]
    finally:
        await engine.dispose()


def cli(url: str, *argv: str) -> int:
    return run_admin(Settings(database_url=SecretStr(url)), parse_admin(*argv))


def fresh_like(url: str, tmp_path: Path, name: str) -> str:
    """An empty database of the same kind as `url` (dropped by the caller on PostgreSQL)."""
    if make_url(url).get_backend_name() == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / name}"
    return create_pg_database()


def drop(url: str) -> None:
    if make_url(url).get_backend_name() != "sqlite":
        drop_pg_database(url)


def test_every_table_round_trips_row_for_row(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(fill_every_table(db_url))
    before = asyncio.run(every_row(db_url))
    empty = sorted(t for t, rows in before.items() if not rows)
    assert not empty, f"tables the test leaves empty: {empty}"

    path = tmp_path / "bot.backup"
    assert cli(db_url, "backup", str(path), "--json") == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["revision"] == HEAD
    assert json.loads(manifest_path(path).read_text())["sha256"] == manifest["sha256"]

    # The database moves on: a chat forgotten, a row added, a table emptied.
    async def change() -> None:
        engine = make_engine(db_url)
        async with engine.begin() as db:
            await db.execute(text("DELETE FROM sessions"))
            await db.execute(text("DELETE FROM counters"))
            await db.execute(insert(ChatSetting.__table__).values(chat_id=7, updated_at=utcnow()))
        await engine.dispose()

    asyncio.run(change())
    assert asyncio.run(every_row(db_url)) != before
    assert cli(db_url, "restore", str(path)) == 0
    assert "restored" in capsys.readouterr().out
    assert asyncio.run(every_row(db_url)) == before
    # The restore is in the audit log of the restored database (admin audit reads it there).
    assert asyncio.run(restores(db_url)) == [(str(path), "ok")]

    # Into a database with no tables at all (a new host).
    other = fresh_like(db_url, tmp_path, "other.sqlite3")
    try:
        assert cli(other, "restore", str(path)) == 0
        assert asyncio.run(every_row(other)) == before

        # ... where the service's own code reads it: the counters and sequences carry on.
        async def next_ids() -> tuple[int, int]:
            engine = make_engine(other)
            async with engine.begin() as db:
                new = await db.execute(
                    insert(ChatSetting.__table__).values(chat_id=8, updated_at=utcnow())
                )
                sid = await db.execute(
                    insert(VariantVersion.__table__)
                    .values(experiment="exp", name="c")
                    .returning(VariantVersion.id)
                )
                del new
                vid = sid.scalar_one()
                biggest = await db.scalar(text("SELECT MAX(id) FROM variant_versions"))
            await engine.dispose()
            return vid, int(biggest)

        vid, biggest = asyncio.run(next_ids())
        assert vid == biggest and vid > 1
    finally:
        drop(other)


def test_restore_refuses_a_live_service_unless_forced(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bot.backup"
    assert cli(db_url, "backup", str(path)) == 0

    async def mark(heartbeat: bool) -> None:
        engine = make_engine(db_url)
        async with make_sessionmaker(engine).begin() as db:
            if heartbeat:
                await replicas.register(db, "live:1:2:3", "host", 2, "{}")
            else:  # a lease alone (its replica's heartbeat row already pruned)
                await leases.take(db, 5, "outbox", "live:1:2:3", 60.0)
        await engine.dispose()

    async def counters() -> int:
        engine = make_engine(db_url)
        async with engine.connect() as db:
            n = await db.scalar(text("SELECT COUNT(*) FROM counters"))
        await engine.dispose()
        return int(n)

    for heartbeat in (True, False):
        asyncio.run(mark(heartbeat))
        capsys.readouterr()
        assert cli(db_url, "restore", str(path)) == 2
        err = capsys.readouterr().err
        assert "a service is using" in err and "--force" in err
        # The refusal is recorded in the database it left alone.
        assert asyncio.run(restores(db_url))[-1][1].startswith("e")  # "exit 2" or "error: ..."
        # Nothing was restored: the replica's row (not in the backup) is still there.
        assert asyncio.run(every_row(db_url))["replicas" if heartbeat else "chat_leases"]
        assert cli(db_url, "restore", str(path), "--force") == 0
        assert asyncio.run(every_row(db_url))["replicas"] == []
        assert asyncio.run(every_row(db_url))["chat_leases"] == []
    assert asyncio.run(counters()) == 0


def test_restore_refuses_a_newer_schema_and_migrates_an_older_one_up(
    empty_db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = empty_db_url
    migrate.upgrade(url, "0012")
    older = tmp_path / "older.backup"
    assert cli(url, "backup", str(older), "--json") == 0
    assert json.loads(capsys.readouterr().out)["revision"] == "0012"

    async def set_revision(revision: str) -> None:
        engine = make_engine(url)
        async with engine.begin() as db:
            await db.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
        await engine.dispose()

    asyncio.run(set_revision("9999_from_the_future"))
    newer = tmp_path / "newer.backup"
    assert cli(url, "backup", str(newer)) == 0
    asyncio.run(set_revision("0012"))
    migrate.upgrade(url)  # the target is at head, with 0013's table holding a row
    asyncio.run(fill_every_table(url))
    before = asyncio.run(every_row(url))

    capsys.readouterr()
    assert cli(url, "restore", str(newer)) == 2
    err = capsys.readouterr().err
    assert "9999_from_the_future" in err and "newer release" in err
    assert asyncio.run(every_row(url)) == before  # untouched

    assert cli(url, "restore", str(older)) == 0
    assert f"migrated up to {HEAD}" in capsys.readouterr().out
    after = asyncio.run(every_row(url))
    assert after["alembic_version"] == [(HEAD,)]
    assert after["sessions"] == [] and after["autopilot_decisions"] == []


def test_a_changed_backup_or_one_of_the_other_database_is_refused(
    sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bot.backup"
    assert cli(sqlite_url, "backup", str(path)) == 0
    with path.open("ab") as f:
        f.write(b"\0")
    assert cli(sqlite_url, "restore", str(path)) == 2
    assert "SHA-256" in capsys.readouterr().err
    assert cli("postgresql+asyncpg://u:pw@127.0.0.1:1/x", "restore", str(path)) == 2
    assert "of its own kind" in capsys.readouterr().err
    junk = tmp_path / "notes.txt"
    junk.write_text("hello")
    assert cli(sqlite_url, "restore", str(junk)) == 2
    assert "neither an SQLite database" in capsys.readouterr().err


def test_sqlite_backup_is_the_committed_database_while_a_writer_holds_a_transaction(
    sqlite_url: str, tmp_path: Path
) -> None:
    """WAL: the backup API reads one snapshot; an open write transaction neither blocks it nor
    leaks into the copy."""
    asyncio.run(fill_every_table(sqlite_url))
    before = asyncio.run(every_row(sqlite_url))
    writer = sqlite3.connect(make_url(sqlite_url).database or "", isolation_level=None)
    try:
        assert writer.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("DELETE FROM messages")
        writer.execute("INSERT INTO counters (name, value, updated_at) VALUES ('x', 1, '2026')")
        path = tmp_path / "bot.backup"
        assert cli(sqlite_url, "backup", str(path)) == 0
    finally:
        writer.execute("COMMIT")
        writer.close()
    copy = sqlite3.connect(path)
    assert copy.execute("PRAGMA journal_mode").fetchone() == ("delete",)  # one file
    copy.close()
    restored = f"sqlite+aiosqlite:///{tmp_path / 'restored.sqlite3'}"
    assert cli(restored, "restore", str(path)) == 0
    assert asyncio.run(every_row(restored)) == before


@pytest.mark.postgres
def test_pg_without_pg_dump_says_what_to_install_and_never_shows_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = create_pg_database()
    try:
        migrate.upgrade(url)
        # The test server trusts local connections, so a password is accepted and ignored.
        secret = "s3cret-Pa55"
        with_password = make_url(url).set(password=secret).render_as_string(hide_password=False)
        path = tmp_path / "bot.backup"
        assert cli(with_password, "backup", str(path)) == 0
        out = capsys.readouterr()
        assert secret not in out.out + out.err
        assert secret not in manifest_path(path).read_text()
        gone = make_url(with_password).set(database="no_such_database_here")
        assert cli(gone.render_as_string(hide_password=False), "backup", str(path)) == 1
        out = capsys.readouterr()
        assert "no_such_database_here" in out.err and secret not in out.out + out.err

        monkeypatch.setenv("PATH", str(tmp_path))  # no pg_dump, no pg_restore
        assert cli(with_password, "backup", str(tmp_path / "x.backup")) == 2
        err = capsys.readouterr().err
        assert "pg_dump is not installed" in err and "postgresql-client" in err
        assert cli(with_password, "restore", str(path)) == 2
        assert "pg_restore is not installed" in capsys.readouterr().err
    finally:
        drop_pg_database(url)


def test_backup_into_a_directory_keeps_the_newest(
    sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "backups"
    folder.mkdir()
    old = [folder / f"bot-{year}0101T000000Z.sqlite3" for year in (2020, 2021, 2022)]
    for path in old:
        path.write_bytes(b"old")
        manifest_path(path).write_text("{}")
    others = [folder / "bot-20190101T000000Z.pgdump", folder / "notes.txt"]
    for path in others:
        path.write_bytes(b"keep me")

    assert cli(sqlite_url, "backup", str(folder), "--keep", "2", "--json") == 0
    written = json.loads(capsys.readouterr().out)
    new = Path(written["path"])
    assert new.parent == folder and new.name.startswith("bot-2") and new.suffix == ".sqlite3"
    assert sorted(written["pruned"]) == [str(old[0]), str(old[1])]
    left = sorted(p.name for p in folder.iterdir())
    expected = [old[2], manifest_path(old[2]), new, manifest_path(new), *others]
    assert left == sorted(p.name for p in expected)
    # The new file is a backup restore takes.
    restored = f"sqlite+aiosqlite:///{tmp_path / 'restored.sqlite3'}"
    assert cli(restored, "restore", str(new)) == 0
    assert asyncio.run(every_row(restored)) == asyncio.run(every_row(sqlite_url))

    assert cli(sqlite_url, "backup", str(tmp_path / "one.backup"), "--keep", "2") == 2
    assert "not one" in capsys.readouterr().err


@pytest.mark.postgres
def test_pg_grants_come_back_and_a_missing_role_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The backup carries the read-only role's grants: restored on the same server, admin sql
    works as that role; on a server without the role, pg_restore fails naming it and leaves the
    database as it was (one transaction)."""
    url, other = create_pg_database(), create_pg_database()
    role_url = None
    try:
        migrate.upgrade(url)
        role_url = make_readonly_role(url)
        path = tmp_path / "bot.backup"
        assert cli(url, "backup", str(path)) == 0
        assert cli(url, "restore", str(path)) == 0
        settings = Settings(database_url=SecretStr(url), admin_database_url=SecretStr(role_url))
        capsys.readouterr()
        assert run_admin(settings, parse_admin("sql", "SELECT COUNT(*) AS n FROM sessions")) == 0
        assert "(1 row)" in capsys.readouterr().out
        drop_pg_role(role_url)
        role_url = None
        role = "bot_test_ro_"
        assert cli(other, "restore", str(path)) == 1
        err = capsys.readouterr().err
        assert role in err and "create it first" in err and "db readonly-role" in err
        assert asyncio.run(table_names(other)) == set()
    finally:
        if role_url is not None:
            drop_pg_role(role_url)
        drop_pg_database(url)
        drop_pg_database(other)
