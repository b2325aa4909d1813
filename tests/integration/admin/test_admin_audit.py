"""The audit log of admin changes (bot/db/audit.py): the real `python -m bot admin` command
line records who changed what and how it ended, a failed change is recorded as failed, reads
are not recorded, and no change is made whose record cannot be written."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from bot.db import audit, migrate
from bot.db.engine import make_engine, make_sessionmaker
from bot.db.models import AuditEntry, AuditSource, Session, VariantRow
from bot.reports.admin import AdminError
from tests.integration.admin.test_admin_variants import EXPERIMENT, VARIANTS_TOML, run
from tests.support.cli import FOREIGN, cli_env, run_cli


def _cli(tmp_path: Path, url: str, *argv: str, user: str) -> subprocess.CompletedProcess[str]:
    variants = tmp_path / "variants.toml"
    variants.write_text(VARIANTS_TOML, encoding="utf-8")
    env = cli_env(
        tmp_path, strip=(*FOREIGN, "SUDO_"), DATABASE_URL=url, VARIANTS_FILE=str(variants)
    )
    for name in ("USER", "LNAME", "USERNAME"):
        env.pop(name, None)
    env["LOGNAME"] = user  # what getpass.getuser() reads first
    return run_cli("admin", *argv, cwd=tmp_path, env=env)


def test_the_command_line_records_a_change_and_a_failed_one(
    sqlite_url: str, tmp_path: Path
) -> None:
    ok = _cli(tmp_path, sqlite_url, "variants", "weight", "nucleus", "0.25", user="alice")
    assert ok.returncode == 0, ok.stderr
    # The control cannot be removed: the change fails, and is recorded as failed.
    failed = _cli(tmp_path, sqlite_url, "variants", "remove", "beam", user="bob")
    assert failed.returncode == 2 and failed.stderr.startswith("error: "), failed.stderr
    # Reads are not recorded.
    for argv in (["variants", "list"], ["variants"], ["stats"], ["audit"]):
        assert _cli(tmp_path, sqlite_url, *argv, user="carol").returncode == 0

    listed = _cli(tmp_path, sqlite_url, "audit", "--json", user="carol")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["actor"], r["source"], r["action"], r["target"]) for r in rows] == [
        ("bob", "cli", "variants remove", "beam"),
        ("alice", "cli", "variants weight", "nucleus"),
    ]  # newest first
    assert rows[0]["result"] == "error: " + failed.stderr.removeprefix("error: ").strip()
    assert rows[1]["result"] == "ok"
    assert rows[1]["details"] == {"force": False, "name": "nucleus", "weight": 0.25}
    assert rows[0]["id"] > rows[1]["id"] and rows[0]["at"] >= rows[1]["at"]
    # The table form, and --limit.
    text = _cli(tmp_path, sqlite_url, "audit", "--limit", "1", user="carol").stdout
    lines = text.splitlines()
    assert lines[0].split() == [
        "id", "at", "actor", "source", "action", "target", "details", "result",
    ]  # fmt: skip
    assert len(lines) == 3 and "bob" in lines[2] and "variants remove" in lines[2]
    assert "alice" not in text


async def _count(url: str) -> int:
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as db:
            return len(await audit.recent(db, 1000))
    finally:
        await engine.dispose()


async def test_forget_and_assign_are_recorded_reads_are_not(db_url: str) -> None:
    engine = make_engine(db_url)
    sessionmaker = make_sessionmaker(engine)
    try:
        async with sessionmaker.begin() as db:
            db.add(Session(chat_id=77, user_id=7))
        for argv in (["variants", "list"], ["variants", "autopilot", "check"], ["stats"]):
            status, _ = await run(db_url, *argv)
            assert status == 0, argv
        assert await _count(db_url) == 0
        assert (await run(db_url, "assign", "77", "nucleus"))[0] == 0
        assert (await run(db_url, "forget", "77", "--yes"))[0] == 0
        async with sessionmaker() as db:
            assert await db.scalar(select(Session.id).where(Session.chat_id == 77)) is None
            rows = await audit.recent(db)
    finally:
        await engine.dispose()
    assert [(r.action, r.target, r.result, r.source) for r in rows] == [
        ("forget", None, "ok", "cli"),  # a forgotten chat is named nowhere
        ("assign", "77", "ok", "cli"),
    ]
    assert rows[0].details == {"yes": True}
    assert rows[1].details == {"chat_id": 77, "variant": "nucleus"}
    assert rows[0].actor == audit.os_actor()


def test_no_change_is_made_that_cannot_be_recorded(db_url: str) -> None:
    """Without the audit table (a database not upgraded), the change is refused before it is
    made, with what to do; the weight stays."""
    assert asyncio.run(run(db_url, "variants", "weight", "nucleus", "0.5"))[0] == 0
    migrate.downgrade(db_url, "0013")
    with pytest.raises(AdminError, match=r"audit_log.*python -m bot db upgrade"):
        asyncio.run(run(db_url, "variants", "weight", "nucleus", "0.1", experiment=EXPERIMENT))

    async def weight() -> float | None:
        engine = make_engine(db_url)
        try:
            async with make_sessionmaker(engine)() as db:
                return await db.scalar(
                    select(VariantRow.weight).where(VariantRow.name == "nucleus")
                )
        finally:
            await engine.dispose()

    assert asyncio.run(weight()) == 0.5
    migrate.upgrade(db_url)


async def test_a_result_is_kept_when_the_pending_row_is_gone(db_url: str) -> None:
    """A change that replaces the database (a restore) removes its own pending row: the row is
    written again with its result."""
    engine = make_engine(db_url)
    sessionmaker = make_sessionmaker(engine)
    try:
        pending = await audit.begin(
            sessionmaker,
            actor="alice",
            source=AuditSource.CLI,
            action="restore",
            target="backup.sqlite3",
            details={"path": "backup.sqlite3"},
        )
        async with sessionmaker() as db:
            assert [r.result for r in await audit.recent(db)] == ["pending"]
        async with sessionmaker.begin() as db:
            await db.execute(AuditEntry.__table__.delete())
        await audit.finish(sessionmaker, pending, "ok")
        async with sessionmaker() as db:
            [row] = await audit.recent(db)
    finally:
        await engine.dispose()
    assert (row.actor, row.action, row.target, row.result) == (
        "alice", "restore", "backup.sqlite3", "ok",
    )  # fmt: skip


def test_arguments_keep_plain_values_only_and_text_for_nan() -> None:
    from bot.config import Settings

    got = audit.arguments(
        {"name": "a", "weight": float("nan"), "top": float("-inf"), "force": False, "model": None,
         "settings": Settings.model_construct(), "ids": (1, 2), "json": True},
        leave_out=("json",),
    )  # fmt: skip
    assert got == {"force": False, "ids": [1, 2], "name": "a", "top": "-inf", "weight": "nan"}


async def test_a_refused_forget_is_recorded_without_its_chat_id(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chat 1 and a count of 1: the chat id is masked, the count is not."""
    engine = make_engine(db_url)
    try:
        async with make_sessionmaker(engine).begin() as db:
            db.add(Session(chat_id=1, user_id=5))
        monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal, no --yes
        with pytest.raises(AdminError, match="--yes") as refusal:
            await run(db_url, "forget", "1")
        async with make_sessionmaker(engine)() as db:
            [row] = await audit.recent(db)
    finally:
        await engine.dispose()
    assert str(refusal.value).startswith("chat 1 has 1 session(s), 0 message(s)")
    assert row.result == "error: " + str(refusal.value).replace("chat 1 ", "chat <chat_id> ", 1)
    assert (row.action, row.target, row.details) == ("forget", None, {"yes": False})
