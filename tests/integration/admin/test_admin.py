"""Admin commands against a seeded database, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import String, select, update

from bot.admin import sql as admin_sql
from bot.admin.cli import admin, run_admin
from bot.admin.parsers import add_admin_parser
from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.db import outbox
from bot.db.conversations import ReplyFacts
from bot.db.engine import make_engine, make_sessionmaker
from bot.db.inbox import UpdateRef
from bot.db.models import Base, Message, Session, utcnow
from bot.reports import admin as reports
from bot.reports import stats as service_stats
from tests.support.cli import cli_env, run_cli
from tests.support.store_rows import finish_update, ingest

CATS, PIRATE = "i love cats.", "i am a pirate."


@dataclass(frozen=True)
class Seed:
    """What `seed` stored: session ids and the UTC days it used."""

    today: datetime  # midnight UTC of the seeding day
    s1: int  # chat 1001, done, 3 days ago, persona CATS, 3 turns (latency 100, 200, 300)
    s2: int  # chat 1001, active, today, persona PIRATE, 1 turn (400; given up on delivery)
    s3: int  # chat 1002, active, today, persona PIRATE, 2 turns (500, 600; the last queued)
    s4: int  # chat 1003, done, 2 days ago, no persona, 1 turn (1000)

    def day(self, days_ago: int) -> str:
        """A UTC day as YYYY-MM-DD."""
        return (self.today - timedelta(days=days_ago)).date().isoformat()


async def _ingest(store: ConversationStore, update_id: int, chat_id: int, user_id: int) -> None:
    payload = {"update_id": update_id, "message": {"chat": {"id": chat_id}, "from": user_id}}
    await ingest(
        store,
        update_id=update_id,
        chat_id=chat_id,
        user_id=user_id,
        kind="message",
        payload=json.dumps(payload),
    )


async def _turn(
    store: ConversationStore,
    session_id: int,
    chat_id: int,
    user_id: int,
    update_id: int,
    *texts: Any,
) -> None:
    await _ingest(store, update_id, chat_id, user_id)
    user_text, reply, latency = texts
    await store.record_turn(
        session_id,
        chat_id,
        user_text,
        reply,
        facts=ReplyFacts(latency_ms=latency),
        update=UpdateRef(update_id),
    )


async def _backdate(store: ConversationStore, session_id: int, start: datetime) -> None:
    """Move a conversation into the past (use cases always stamp the current time)."""
    async with store.sessionmaker.begin() as db:
        ids = list(
            await db.scalars(
                select(Message.id).where(Message.session_id == session_id).order_by(Message.id)
            )
        )
        for k, message_id in enumerate(ids):
            at = start + timedelta(seconds=k)
            await db.execute(update(Message).where(Message.id == message_id).values(created_at=at))
            await db.execute(
                update(Message)
                .where(Message.id == message_id, Message.delivered_at.is_not(None))
                .values(delivered_at=at + timedelta(milliseconds=500))
            )
        end = start + timedelta(seconds=len(ids))
        await db.execute(
            update(Session)
            .where(Session.id == session_id)
            .values(created_at=start, updated_at=end, ended_at=end)
        )


async def seed(store: ConversationStore) -> Seed:
    """Three private chats (user id = chat id), four conversations, fourteen messages, some
    delivery trouble and failed updates."""
    now = utcnow()
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)

    await _ingest(store, 1, 1001, 1001)
    s1 = (await store.set_persona(1001, 1001, CATS, notice="Persona set.", update=UpdateRef(1))).id
    await _turn(store, s1, 1001, 1001, 2, "hi", "hello there", 100.0)
    await _turn(store, s1, 1001, 1001, 3, "do you like cats?", "i love cats.", 200.0)
    await _turn(store, s1, 1001, 1001, 4, "bye", "goodbye", 300.0)
    await _ingest(store, 5, 1001, 1001)
    await store.end_session(1001, notice="Conversation ended.", update=UpdateRef(5))
    await _ingest(store, 6, 1001, 1001)
    s2 = (
        await store.set_persona(1001, 1001, PIRATE, notice="Persona set.", update=UpdateRef(6))
    ).id
    await _turn(store, s2, 1001, 1001, 7, "ahoy", "arr matey", 400.0)

    await _ingest(store, 8, 1002, 1002)
    s3 = (
        await store.set_persona(1002, 1002, PIRATE, notice="Persona set.", update=UpdateRef(8))
    ).id
    await _turn(store, s3, 1002, 1002, 9, "hello", "arr", 500.0)
    await _turn(store, s3, 1002, 1002, 10, "where is the treasure?", "buried", 600.0)

    s4 = (await store.active_session(1003, 1003)).id
    await _turn(store, s4, 1003, 1003, 11, "hey", "hi!", 1000.0)
    await _ingest(store, 12, 1003, 1003)
    await store.end_session(1003, notice="Conversation ended.", update=UpdateRef(12))

    # Inbox trouble: two updates failed, one still pending.
    await _ingest(store, 13, 1002, 1002)
    await finish_update(store, UpdateRef(13), status="failed", error="model crashed")
    await _ingest(store, 14, 1003, 1003)
    await _ingest(store, 15, 1001, 1001)
    await finish_update(store, UpdateRef(15), status="failed", error="boom")

    # Delivery: everything went out except two replies.
    async with store.sessionmaker.begin() as db:
        for row in await outbox.pending(db):
            if row.text == "arr matey":  # the user blocked the bot
                for attempt in range(5):
                    await outbox.attempt_failed(
                        db, row.id, "Forbidden: bot was blocked by the user", give_up=attempt == 4
                    )
            elif row.text == "buried":  # still being retried
                for _ in range(2):
                    await outbox.attempt_failed(db, row.id, "Timed out")
            else:
                await outbox.sent(db, row.id, telegram_message_id=5000 + row.id)

    # Past conversations: old enough to fall outside the 24 h latency window.
    await _backdate(store, s1, today - timedelta(days=3) + timedelta(hours=10))
    await _backdate(store, s4, today - timedelta(days=2) + timedelta(hours=10))
    return Seed(today, s1, s2, s3, s4)


def parse_admin(*argv: str) -> argparse.Namespace:
    """Parse `admin ...` with the real argument parser."""
    parser = argparse.ArgumentParser()
    add_admin_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["admin", *argv])


async def run(db_url: str, *argv: str) -> tuple[int, str]:
    """Run an admin subcommand in this process; returns (status, stdout)."""
    out = io.StringIO()
    status = await admin(db_url, parse_admin(*argv), out)
    return status, out.getvalue()


async def snapshot(store: ConversationStore) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table."""
    async with store.sessionmaker() as db:
        return {
            name: [
                tuple(r)
                for r in await db.execute(select(table).order_by(*table.primary_key.columns))
            ]
            for name, table in Base.metadata.tables.items()
        }


# --- stats -------------------------------------------------------------------------------------


async def test_stats_numbers_match_the_seed(store: ConversationStore) -> None:
    await seed(store)
    got = await service_stats.stats(store.sessionmaker, now=utcnow())
    assert (got.chats, got.sessions_active, got.sessions_ended) == (3, 2, 2)
    assert (got.messages_today, got.messages_total) == (6, 14)
    # Only today's replies (400, 500, 600 ms) are inside the 24 h window; nearest rank.
    assert (got.latency_samples, got.latency_p50_ms, got.latency_p95_ms) == (3, 500.0, 600.0)
    assert (got.undelivered_replies, got.replies_given_up) == (2, 1)
    assert (got.inbox_pending, got.inbox_failed) == (1, 2)

    everything = await service_stats.stats(store.sessionmaker, latency_window=timedelta(days=30))
    # 100..600 and 1000: rank ceil(0.5 * 7) = 4 is 400, rank ceil(0.95 * 7) = 7 is 1000.
    assert (everything.latency_samples, everything.latency_p50_ms) == (7, 400.0)
    assert everything.latency_p95_ms == 1000.0


async def test_stats_on_an_empty_database(store: ConversationStore) -> None:
    got = await service_stats.stats(store.sessionmaker)
    assert (got.chats, got.messages_total, got.latency_samples) == (0, 0, 0)
    assert got.latency_p50_ms is None
    text = service_stats.format_stats(got)
    assert "p50 n/a" in text


async def test_stats_json_from_the_cli(store: ConversationStore, db_url: str) -> None:
    await seed(store)
    status, out = await run(db_url, "stats", "--json")
    assert status == 0
    data = json.loads(out)
    assert data["messages_total"] == 14
    assert data["undelivered_replies"] == 2
    assert datetime.fromisoformat(data["generated_at"]).tzinfo is not None


# --- sessions, show, export --------------------------------------------------------------------


async def test_sessions_most_recent_first_with_filters(
    store: ConversationStore, db_url: str
) -> None:
    s = await seed(store)
    rows = await reports.list_sessions(store.sessionmaker)
    assert [(r.id, r.messages) for r in rows] == [(s.s3, 4), (s.s2, 2), (s.s4, 2), (s.s1, 6)]
    active = await reports.list_sessions(store.sessionmaker, active_only=True, limit=1)
    assert [r.id for r in active] == [s.s3]

    status, out = await run(db_url, "sessions", "--active")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "id",
        "chat_id",
        "user_id",
        "status",
        "messages",
        "last_active",
        "persona",
    ]
    assert len(lines) == 4  # header, rule, two active sessions
    assert PIRATE in lines[2]
    status, out = await run(db_url, "sessions", "--limit", "2", "--json")
    assert [r["id"] for r in json.loads(out)] == [s.s3, s.s2]


async def test_show_prints_every_conversation_with_its_persona(
    store: ConversationStore, db_url: str
) -> None:
    s = await seed(store)
    status, out = await run(db_url, "show", "1001")
    assert status == 0
    assert f"session {s.s1} · ended" in out
    assert f"session {s.s2} · active (current)" in out
    assert out.index(f"session {s.s1}") < out.index(f"session {s.s2}")  # past ones first
    assert f"persona: {CATS}" in out and f"persona: {PIRATE}" in out
    # Above the first reply of each, the persona the model read for it.
    assert out.count(f"-- the model reads: {CATS}") == 1
    assert out.count(f"-- the model reads: {PIRATE}") == 1
    for text in ("hi", "hello there", "do you like cats?", "goodbye", "ahoy"):
        assert f"  {text}" in out
    assert "arr matey  [400 ms, not delivered]" in out
    assert "1002" not in out and "treasure" not in out  # another chat's conversation

    status, out = await run(db_url, "show", "1001", "--json")
    data = json.loads(out)
    assert [t["session"]["persona"] for t in data] == [CATS, PIRATE]
    assert [m["text"] for m in data[0]["messages"]] == [
        "hi",
        "hello there",
        "do you like cats?",
        CATS,
        "bye",
        "goodbye",
    ]
    assert (await run(db_url, "show", "424242"))[0] == 1


async def test_export_jsonl_and_csv(store: ConversationStore, db_url: str, tmp_path: Path) -> None:
    s = await seed(store)
    status, out = await run(db_url, "export", "1002")
    assert status == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["session_id"], r["role"], r["text"]) for r in records] == [
        (s.s3, "user", "hello"),
        (s.s3, "bot", "arr"),
        (s.s3, "user", "where is the treasure?"),
        (s.s3, "bot", "buried"),
    ]
    assert {r["persona"] for r in records} == {PIRATE}
    assert [r["reply_persona"] for r in records] == [None, PIRATE, None, PIRATE]
    assert records[1]["latency_ms"] == 500.0 and records[1]["delivered_at"] is not None
    assert records[3]["delivered_at"] is None

    target = tmp_path / "all.csv"
    status, out = await run(db_url, "export", "--format", "csv", "-o", str(target))
    assert status == 0 and out == ""
    with target.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 14
    assert list(rows[0]) == list(reports.EXPORT_COLUMNS)
    assert {r["chat_id"] for r in rows} == {"1001", "1002", "1003"}
    assert datetime.fromisoformat(rows[0]["created_at"]).tzinfo is not None


# --- forget ------------------------------------------------------------------------------------


def _mentions(table_name: str, row: tuple[Any, ...], chat_id: int) -> bool:
    """True if any id column holds the chat id or any text holds it (inbox payloads do)."""
    table = Base.metadata.tables[table_name]
    for column, value in zip(table.columns, row, strict=True):
        if column.name in ("chat_id", "user_id") and value == chat_id:
            return True
        if isinstance(column.type, String) and str(chat_id) in (value or ""):
            return True
    return False


async def test_forget_leaves_no_row_mentioning_the_chat(
    store: ConversationStore, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed(store)
    before = await snapshot(store)
    assert any(_mentions(t, r, 1001) for t, rows in before.items() for r in rows)

    # Not a terminal and no --yes: refuse, delete nothing.
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with pytest.raises(reports.AdminError, match="--yes") as refusal:
        await run(db_url, "forget", "1001")
    refused = await snapshot(store)
    assert len(refused.pop("audit_log")) == 1  # the refusal is recorded (without the chat)
    assert refused == {k: v for k, v in before.items() if k != "audit_log"}

    status, out = await run(db_url, "forget", "1001", "--yes")
    assert status == 0
    assert "forgot chat 1001: deleted 2 session(s), 8 message(s)" in out
    after = await snapshot(store)
    leftovers = [(t, r) for t, rows in after.items() for r in rows if _mentions(t, r, 1001)]
    assert leftovers == []  # the audit log's rows of both forgets included
    shown = str(refusal.value)
    assert "chat 1001 has" in shown
    assert [r[-1] for r in after["audit_log"]] == [
        "error: " + shown.replace("1001", "<chat_id>"),
        "ok",
    ]
    # The other chats are untouched.
    for name in ("sessions", "messages", "outbox", "inbox"):
        others = [r for r in before[name] if not _mentions(name, r, 1001)]
        assert after[name] == others, name
    assert (await run(db_url, "forget", "1001", "--yes"))[1].startswith("nothing stored")


# --- read-only SQL -----------------------------------------------------------------------------


@pytest.fixture
def sql_url(readonly_url: str) -> str:
    """Where `admin sql` connects (tests/support/fixtures.py's readonly_url)."""
    return readonly_url


WRITES = [
    "INSERT INTO inbox (update_id, kind, payload, status, attempts, received_at) "
    "VALUES (999, 'message', '{}', 'pending', 0, CURRENT_TIMESTAMP)",
    "UPDATE sessions SET persona = 'hacked'",
    "DELETE FROM messages",
    "DROP TABLE messages",
    "CREATE TABLE intruder (id INTEGER)",
    "SELECT 1; DELETE FROM messages",
    "DELETE FROM messages; SELECT 1",
    "SELECT COUNT(*) FROM messages; SELECT COUNT(*) FROM sessions",
]


async def test_sql_refuses_writes_and_multiple_statements(
    store: ConversationStore, sql_url: str
) -> None:
    await seed(store)
    before = await snapshot(store)
    for sql in WRITES:
        with pytest.raises(admin_sql.SqlRefused) as caught:
            await admin_sql.readonly_sql(sql_url, sql)
        message = str(caught.value)
        assert message.startswith("refused: admin sql "), (sql, message)
        if sql.startswith("DELETE") and ";" in sql and sql_url.startswith("sqlite"):
            # SQLite's authorizer refuses the DELETE before the second statement is seen.
            assert "read-only" in message, (sql, message)
        elif ";" in sql:
            assert "exactly one statement" in message, (sql, message)
        else:
            assert "read-only" in message, (sql, message)
        assert await snapshot(store) == before, sql


async def test_sql_refusal_is_one_clear_line_and_status_1(
    store: ConversationStore, db_url: str, sql_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await seed(store)
    settings = Settings(database_url=SecretStr(db_url), admin_database_url=SecretStr(sql_url))
    for sql, words in (("DELETE FROM messages", "read-only"), ("SELECT 1; SELECT 2", "one")):
        status = await asyncio.to_thread(run_admin, settings, parse_admin("sql", sql))
        err = capsys.readouterr().err
        assert status == 1
        assert err.startswith("error: refused: admin sql") and words in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert len((await snapshot(store))["messages"]) == 14


async def test_sql_select_prints_a_table_and_json(store: ConversationStore, sql_url: str) -> None:
    await seed(store)
    status, out = await run(
        sql_url, "sql", "SELECT chat_id, COUNT(*) AS n FROM messages GROUP BY chat_id ORDER BY 1"
    )
    assert status == 0
    assert out.splitlines()[2:] == ["   1001  8", "   1002  4", "   1003  2", "(3 rows)"]
    status, out = await run(
        sql_url, "sql", "SELECT id FROM messages ORDER BY id", "--json", "--max-rows", "3"
    )
    data = json.loads(out)
    assert data["columns"] == ["id"] and len(data["rows"]) == 3 and data["truncated"] is True
    with pytest.raises(reports.AdminError, match="SQL failed"):
        await run(sql_url, "sql", "SELECT * FROM no_such_table")


# --- the real command line ---------------------------------------------------------------------


async def test_cli_subprocess_stats_json_and_refused_write(sqlite_url: str, tmp_path: Path) -> None:
    engine = make_engine(sqlite_url)
    store = ConversationStore(make_sessionmaker(engine))
    try:
        await seed(store)
    finally:
        await engine.dispose()
    env = cli_env(tmp_path, DATABASE_URL=sqlite_url)

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return run_cli("admin", *argv, cwd=tmp_path, env=env)

    proc = await asyncio.to_thread(cli, "stats", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert {k: data[k] for k in ("chats", "sessions_active", "sessions_ended")} == {
        "chats": 3,
        "sessions_active": 2,
        "sessions_ended": 2,
    }
    assert (data["messages_today"], data["messages_total"]) == (6, 14)
    assert (data["latency_p50_ms"], data["latency_p95_ms"]) == (500.0, 600.0)
    assert (data["undelivered_replies"], data["inbox_failed"]) == (2, 2)

    proc = await asyncio.to_thread(cli, "sql", "DELETE FROM messages")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: refused: admin sql is read-only")
    proc = await asyncio.to_thread(cli, "sql", "SELECT COUNT(*) AS n FROM messages", "--json")
    assert json.loads(proc.stdout)["rows"] == [[14]]


def test_cli_on_a_missing_sqlite_file_says_so_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nope.sqlite3"
    settings = Settings(database_url=SecretStr(f"sqlite+aiosqlite:///{missing}"))
    for argv in (("stats",), ("sql", "SELECT 1")):
        assert run_admin(settings, parse_admin(*argv)) == 1
    assert not missing.exists()
