"""Hostile input: odd personas and texts are stored verbatim or refused with a clear reply.

Empty and 10,000-character personas, control, zero-width and right-to-left-override characters,
exactly 4,096-character messages, Markdown/HTML metacharacters and SQL-injection strings in the
persona, the text and the admin CLI's arguments. The schema stays intact and replies go out as
plain text (no parse_mode), so Telegram never fails to parse them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.dbutil import TABLES, table_names
from tests.support.fakebotapi import FakeBotAPI, utf16_len
from tests.support.fixtures import StartService
from tests.support.service_harness import TOKEN, EchoResponder, make_settings, rows, running_service

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = [
    "ctl\x01\x07\x1b[31mred\x7f tab\there",
    "zero\u200bwidth\u200d\ufeffjoin",
    "rtl \u202eevil.exe\u202c end",
    "*bold* _it_ `code` [link](http://x) <b>html</b> &amp; <script>alert(1)</script>",
    "Robert'); DROP TABLE sessions;--",
    "' OR '1'='1",
    "1; DELETE FROM messages WHERE 1=1; --",
    "emoji 😀 and surrogates 𝕏",
]


async def test_hostile_personas_and_texts(db_url: str, tmp_path: Path) -> None:
    chat = 5001
    async with FakeBotAPI(TOKEN) as api:
        # Not a flood test: its 20-odd commands and texts in a row stay under the limit.
        settings = make_settings(
            db_url, api, tmp_path, log_level="INFO", message_max_chars=4096, flood_max_messages=100
        )
        async with running_service(settings, EchoResponder()) as svc:
            n = 0

            async def say(text: str) -> list[str]:
                nonlocal n
                before = len(api.texts(chat))
                api.user_message(chat, text)
                n += 1
                await api.wait_for_texts(chat, before + 1, timeout_s=20)
                await api.wait_for(lambda: svc.inbox_worker.busy == 0, 20, "idle")
                await svc.delivery.pool.scan()
                await api.wait_for(lambda: svc.delivery.busy == 0, 20, "sent")
                return api.texts(chat)[before:]

            for hostile in HOSTILE:
                (reply,) = await say(f"/persona {hostile}")
                assert reply == f"Got it. From now on: {hostile.strip()}"
                stored = await rows(
                    svc, "SELECT persona FROM sessions WHERE chat_id = :c AND status = 'active'",
                    c=chat,
                )  # fmt: skip
                assert stored == [(hostile.strip(),)]
                (reply,) = await say(hostile)
                assert reply == f"echo {chat}: {hostile.strip()}"
                last_user = await rows(
                    svc, "SELECT text FROM messages WHERE chat_id = :c AND role = 'user' "
                    "ORDER BY id DESC LIMIT 1", c=chat,
                )  # fmt: skip
                assert last_user == [(hostile.strip(),)]
            # Empty persona: shows the current one; 10,000 characters: refused, unchanged.
            (reply,) = await say("/persona")
            assert reply.startswith(f"My persona: {HOSTILE[-1]}")
            (reply,) = await say("/persona " + "x" * 10_000)
            assert "10000 characters" in reply and "unchanged" in reply
            assert await rows(
                svc, "SELECT persona FROM sessions WHERE chat_id = :c AND status = 'active'", c=chat
            ) == [(HOSTILE[-1],)]
            # Exactly 4,096 characters (the most Telegram sends): answered; the longer reply is
            # split into parts Telegram accepts.
            exact = ("abcd efgh " * 410)[:4096]
            assert utf16_len(exact) == 4096
            parts = await say(exact)
            assert "".join(parts).replace(" ", "") == f"echo {chat}: {exact}".replace(" ", "")
            assert all(utf16_len(p) <= 4096 for p in parts) and len(parts) == 2
            # One character over the configured limit: a clear refusal.
            (reply,) = await say("y" * 4097)
            assert reply.startswith("Your message is 4097 characters long")
        assert all(s.parse_mode is None for s in api.sent)
        assert not [c for c in api.calls_to("sendMessage") if c.status != 200]
    assert await table_names(db_url) >= TABLES


async def test_nul_characters_are_dropped_on_both_backends(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    """Regression (issue 11.9): U+0000 could not be stored on PostgreSQL, so the turn was
    generated three times and ended in an apology. It is dropped, everything else kept."""
    chat = 5002
    settings = make_settings(db_url, api, tmp_path, log_level="INFO")
    responder = EchoResponder()
    svc = await start_service(settings, responder)
    api.user_message(chat, "/persona I am\x00 Sarah\x00.")
    api.user_message(chat, "hel\x00lo\x00 there")
    api.user_message(chat, "/persona \x00\x00")
    api.user_message(chat, "\x00")
    texts = await api.wait_for_texts(chat, 4, timeout_s=20)
    assert texts == [
        "Got it. From now on: I am Sarah.",
        f"echo {chat}: hello there",
        "That persona has no text I can use. Your current persona is unchanged; "
        "send /persona followed by a few words about me.",
        "Say something and I'll answer.",
    ]
    assert responder.calls == [(chat, "hello there")]  # generated once, no apology
    assert await rows(svc, "SELECT persona FROM sessions WHERE chat_id = :c", c=chat) == [
        ("I am Sarah.",)
    ]
    assert await rows(
        svc, "SELECT role, text FROM messages WHERE chat_id = :c ORDER BY id", c=chat
    ) == [("user", "hello there"), ("bot", f"echo {chat}: hello there")]
    assert await rows(svc, "SELECT status, count(*) FROM inbox GROUP BY status") == [("done", 4)]


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "1; DROP TABLE sessions"],
        ["forget", "1 OR 1=1", "--yes"],
        ["export", "' OR '1'='1"],
        ["sql", "DROP TABLE sessions"],
        ["sql", "DELETE FROM messages"],
        ["sql", "SELECT 1; DROP TABLE inbox"],
    ],
)
async def test_sql_injection_in_admin_arguments_changes_nothing(
    sqlite_url: str, tmp_path: Path, argv: list[str]
) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "DATABASE_URL": sqlite_url,
           "DATA_DIR": str(tmp_path), "TELEGRAM_BOT_TOKEN": TOKEN}  # fmt: skip
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "bot", "admin", *argv],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr + done.stdout
    assert await table_names(sqlite_url) >= TABLES


def _unreadable(api: FakeBotAPI, chat: int) -> dict[str, object]:
    """A message python-telegram-bot cannot parse (a sticker without its required fields)."""
    return {
        "message": {
            "message_id": 999, "date": 0, "chat": {"id": chat, "type": "private"},
            "from": {"id": chat, "is_bot": False, "first_name": "X"},
            "sticker": {"file_id": "x"},
        }
    }  # fmt: skip


async def test_an_unparseable_update_does_not_stop_polling(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    """Regression: PTB raised TypeError from getUpdates, polling died with a traceback, and
    every restart fetched the same update and died again."""
    chat = 5101
    settings = make_settings(sqlite_url, api, tmp_path)
    svc = await start_service(settings, EchoResponder())
    poison = api.add_update(_unreadable(api, chat))
    api.user_message(chat, "still there?")
    assert await api.wait_for_texts(chat, 1) == [f"echo {chat}: still there?"]
    assert await rows(svc, "SELECT status FROM inbox WHERE update_id = :u", u=poison) == [
        ("ignored",)
    ]
    assert svc.ingest.done is not None and not svc.ingest.done.done()


async def test_an_unparseable_update_is_acknowledged_on_the_webhook(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    from tests.support.botprocess import SECRET, free_port

    chat = 5102
    port = free_port()
    settings = make_settings(
        sqlite_url, api, tmp_path, webhook_url=f"http://127.0.0.1:{port}/hook",
        webhook_secret=SECRET, webhook_listen="127.0.0.1", webhook_port=port,
    )  # fmt: skip
    svc = await start_service(settings, EchoResponder())
    await api.wait_for(lambda: api.webhook.url != "", 10, "setWebhook")
    poison = api.add_update(_unreadable(api, chat))
    api.user_message(chat, "still there?")
    assert await api.wait_for_texts(chat, 1) == [f"echo {chat}: still there?"]
    assert (poison, 200) in api.webhook_posts
    assert await rows(svc, "SELECT status FROM inbox WHERE update_id = :u", u=poison) == [
        ("ignored",)
    ]
