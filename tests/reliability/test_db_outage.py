"""Database outages: PostgreSQL stopped during traffic, SQLite held by a long write transaction.

Outcome: every message is answered exactly once (late, but answered: an update that cannot be
stored is not acknowledged, so Telegram keeps it), no partial rows, recovery without a restart,
and nothing technical ever reaches a user.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections import Counter
from pathlib import Path

import pytest

from bot.db import engine as db_engine
from tests.support.fakebotapi import FakeBotAPI
from tests.support.pgserver import PrivatePostgres
from tests.support.service_harness import (
    TOKEN,
    EchoResponder,
    make_settings,
    rows,
    running_service,
    settled,
    sqlite_file,
)
from tests.support.waits import until

CHATS = list(range(2001, 2006))
TECHNICAL = ("Traceback", "Error", "Exception", "sqlalchemy", "asyncpg", "sqlite")


def assert_user_facing(api: FakeBotAPI) -> None:
    """Nothing technical in what users got."""
    for sent in api.sent:
        assert not any(word.lower() in sent.text.lower() for word in TECHNICAL), sent.text


async def assert_each_once(svc: object, api: FakeBotAPI, rounds: int) -> None:
    counts = Counter(s.chat_id for s in api.sent)
    assert {c: counts[c] for c in CHATS} == {c: rounds for c in CHATS}
    assert await rows(svc, "SELECT count(*) FROM inbox WHERE status <> 'done'") == [(0,)]  # type: ignore[arg-type]
    assert await rows(svc, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [(0,)]  # type: ignore[arg-type]
    for chat in CHATS:
        roles = await rows(
            svc,  # type: ignore[arg-type]
            "SELECT role FROM messages WHERE chat_id = :c ORDER BY id",
            c=chat,
        )
        # No partial turn: a user message always has its reply right after it.
        assert [r for (r,) in roles] == ["user", "bot"] * rounds


async def test_postgres_stopped_during_traffic_then_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pg = PrivatePostgres()
    try:
        async with FakeBotAPI(TOKEN) as api:
            # Replies take a while, so the server goes down in the middle of turns too.
            responder = EchoResponder(delay_s=0.3)
            settings = make_settings(pg.url, api, tmp_path, log_level="INFO")
            async with running_service(settings, responder) as svc:
                for chat in CHATS:
                    api.user_message(chat, "before the outage")
                await until(lambda: responder.in_progress > 0, what="turns generating")
                await asyncio.to_thread(pg.stop)
                during = [api.user_message(chat, "during the outage") for chat in CHATS]
                # The outage reached ingest: storing an update failed (it is retried).
                await until(
                    lambda: "storing update" in caplog.text, within_s=30, what="a failed store"
                )
                # Nothing could be stored, so nothing was acknowledged: Telegram still has them.
                assert {u["update_id"] for u in api.updates} >= set(during)
                assert all(len(api.texts(chat)) <= 1 for chat in CHATS)
                await asyncio.to_thread(pg.start)
                for chat in CHATS:
                    await api.wait_for_texts(chat, 2, timeout_s=30)
                await settled(svc, api)  # nothing queued any more: a duplicate would be out
                for chat in CHATS:
                    texts = api.texts(chat)
                    # Turns cut by the outage stayed pending (retried, or past their retries
                    # with no apology written either) and were answered after recovery.
                    assert len(texts) == 2
                    assert texts[0] == f"echo {chat}: before the outage"
                    assert texts[1] == f"echo {chat}: during the outage"
                assert await rows(svc, "SELECT count(*) FROM inbox WHERE status = 'pending'") == [
                    (0,)
                ]
                assert await rows(svc, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [
                    (0,)
                ]
                partial = await rows(
                    svc,
                    "SELECT i.update_id FROM inbox i "
                    "WHERE i.status = 'done' AND i.kind = 'message' "
                    "AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.update_id = i.update_id)",
                )
                assert partial == []
            assert_user_facing(api)
    finally:
        await asyncio.to_thread(pg.close)


async def test_sqlite_held_by_a_long_write_transaction_delays_but_loses_nothing(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with FakeBotAPI(TOKEN) as api:
        responder = EchoResponder()
        async with running_service(make_settings(sqlite_url, api, tmp_path), responder) as svc:
            for chat in CHATS:
                api.user_message(chat, "first")
            for chat in CHATS:
                await api.wait_for_texts(chat, 1)
            locked = threading.Event()
            release = threading.Event()

            def hold_the_write_lock() -> None:
                # Another program (an admin's sqlite3 shell, a backup) writes for a second.
                conn = sqlite3.connect(sqlite_file(sqlite_url), timeout=30)
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute("UPDATE sessions SET updated_at = updated_at")
                    locked.set()
                    release.wait(10)
                    conn.commit()
                finally:
                    conn.close()

            holder = threading.Thread(target=hold_the_write_lock)
            holder.start()
            await asyncio.to_thread(locked.wait, 10)
            for chat in CHATS:
                api.user_message(chat, "second")
            # The service's writes wait in SQLite's busy handler (15 s), so nothing fails or
            # logs: this is the lock's duration, not a wait for something. A second is ample for
            # the updates to be fetched and their storing to block.
            await asyncio.sleep(1.0)
            assert all(len(api.texts(c)) == 1 for c in CHATS)  # nothing could be written yet
            release.set()
            await asyncio.to_thread(holder.join, 10)
            for chat in CHATS:
                await api.wait_for_texts(chat, 2, timeout_s=30)
            await settled(svc, api)  # nothing queued any more: a duplicate would be out
            await assert_each_once(svc, api, 2)
        assert_user_facing(api)
    with sqlite3.connect(sqlite_file(sqlite_url)) as conn:
        assert list(conn.execute("PRAGMA integrity_check")) == [("ok",)]


async def _take_write_lock(conn: sqlite3.Connection) -> None:
    """BEGIN IMMEDIATE, waiting while the service itself writes.

    `conn` must have a busy timeout of 0: this runs on the service's event loop, and a
    transaction the service has begun needs that loop to commit, so waiting inside SQLite's
    busy handler here would hold both for the whole timeout (a 30 s stall, seen in CI, after
    which the replica had fenced itself). A locked database raises at once instead, and the
    wait is an asyncio sleep."""
    for _ in range(200):
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE sessions SET updated_at = updated_at")
            return
        except sqlite3.OperationalError:
            await asyncio.sleep(0.05)
    raise AssertionError("could not take SQLite's write lock")


async def test_user_text_stays_out_of_logs_and_stored_errors_while_sqlite_is_locked(
    sqlite_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    api: FakeBotAPI,
) -> None:
    # Issue 11.6: SQLAlchemy's error text carries bound parameters, so "storing update ...
    # failed" printed the message text and the user's first name at WARNING, and a failed
    # turn logged (and stored in inbox.error) the text and its reply.
    monkeypatch.setattr(db_engine, "SQLITE_BUSY_TIMEOUT_MS", 200)
    text, name, late = "canary text 5821", "Canaryfirstname", "late canary 7315"
    chat = 9300
    responder = EchoResponder(delay_s=lambda _chat, t: 1.0 if t == late else 0.0)
    settings = make_settings(sqlite_url, api, tmp_path, log_level="INFO")
    caplog.set_level(logging.INFO)
    async with running_service(settings, responder) as svc:
        api.user_message(chat, "first")
        await api.wait_for_texts(chat, 1)
        conn = sqlite3.connect(sqlite_file(sqlite_url), timeout=0)  # see _take_write_lock
        try:
            # 1. Locked while the update is being stored.
            await _take_write_lock(conn)
            canary = api.user_message(
                chat, text, extra={"from": {"id": chat, "is_bot": False, "first_name": name}}
            )
            await until(  # storing the update fails, and is retried
                lambda: f"storing update {canary} failed" in caplog.text,
                within_s=30,
                what="storing the update failing",
            )
            conn.commit()
            await api.wait_for_texts(chat, 2, timeout_s=30)
            # 2. Locked while its turn is generated: committing the turn fails.
            late_update = api.user_message(chat, late)
            await api.wait_for(lambda: (chat, late) in responder.calls, what="the late turn")
            await _take_write_lock(conn)
            await until(
                lambda: f"update {late_update} failed (attempt" in caplog.text,
                within_s=30,
                what="committing the turn failing",
            )
            conn.commit()
        finally:
            conn.close()
        await api.wait_for_texts(chat, 3, timeout_s=30)
        errors = await rows(svc, "SELECT error FROM inbox WHERE error IS NOT NULL")
    failures = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(failures) >= 2, "the locks caused no warnings: the test tested nothing"
    for secret in (text, name, late):
        assert secret not in caplog.text  # tracebacks included
        assert all(secret not in e for (e,) in errors)
