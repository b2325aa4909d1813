"""The real `python -m bot run` process against the loopback Bot API, with the tiny model."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from bot.texts import ENGLISH
from tests.support.botprocess import (
    SECRET,
    TOKEN,
    bot_env,
    bot_process,
    db_rows,
    free_port,
    settled_on_disk,
)
from tests.support.fakebotapi import FakeBotAPI
from tests.support.procs import three_from_a_one_from_b


async def conversation(api: FakeBotAPI, chat: int, tmp_path: Path) -> None:
    """/start, /persona, several turns, /done, /forget, checking replies and the database."""
    sent = 0

    async def say(text: str) -> str:
        nonlocal sent
        api.user_message(chat, text)
        sent += 1
        texts = await api.wait_for_texts(chat, sent, timeout_s=30)
        return texts[sent - 1]

    assert (await say("/start")).startswith("Hi! ")
    assert await say("/persona My name is Sarah. I love hiking.") == (
        "Got it. From now on: My name is Sarah. I love hiking."
    )
    for text in ("hello how are you", "what do you like", "tell me about your dog"):
        reply = await say(text)
        assert reply.strip() and not reply.startswith(("Sorry", "Hi! "))
    assert (await say("/done")).startswith("Conversation ended")
    sent += 1  # the 1-5 rating of the conversation follows
    assert (await api.wait_for_texts(chat, sent, timeout_s=30))[-1] == ENGLISH.RATE_PROMPT
    ((status, persona, count),) = db_rows(
        tmp_path,
        f"SELECT s.status, s.persona, count(m.id) FROM sessions s JOIN messages m "
        f"ON m.session_id = s.id WHERE s.chat_id = {chat} GROUP BY s.id",
    )
    assert (status, persona, count) == ("done", "My name is Sarah. I love hiking.", 6)
    assert (await say("/persona")).startswith("My persona: My name is Sarah.")
    assert (await say("/forget")).startswith("Done: I deleted everything")
    assert db_rows(tmp_path, f"SELECT id FROM sessions WHERE chat_id = {chat}") == []
    assert db_rows(tmp_path, f"SELECT id FROM messages WHERE chat_id = {chat}") == []
    assert all(s.parse_mode is None for s in api.sent)


async def test_polling_end_to_end_at_debug_level_without_leaking_the_token(
    tmp_path: Path, tiny_model_file: str
) -> None:
    async with FakeBotAPI(TOKEN) as api:
        env = bot_env(tmp_path, api, tiny_model_file, LOG_LEVEL="DEBUG")
        async with bot_process(env, tmp_path, api) as bot:
            assert [c["command"] for c in api.commands] == [
                "start", "help", "persona", "done", "forget", "context", "privacy", "lang",
            ]  # fmt: skip
            assert api.calls_to("deleteWebhook")
            await conversation(api, 42, tmp_path)
            assert await bot.stop() == 0
        output = bot.output()
    assert "DEBUG" in output and "getUpdates" in output  # it really logged at DEBUG
    assert TOKEN not in output
    assert TOKEN.split(":")[1] not in output
    assert "Traceback" not in output


async def test_webhook_end_to_end_and_forged_posts_get_403(
    tmp_path: Path, tiny_model_file: str
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/tg/webhook"
    async with FakeBotAPI(TOKEN) as api:
        env = bot_env(
            tmp_path, api, tiny_model_file,
            WEBHOOK_URL=url, WEBHOOK_SECRET=SECRET,
            WEBHOOK_LISTEN="127.0.0.1", WEBHOOK_PORT=str(port), LOG_LEVEL="DEBUG",
        )  # fmt: skip
        async with bot_process(env, tmp_path, api, ready="setWebhook") as bot:
            assert api.webhook.url == url and api.webhook.secret == SECRET
            forged = {
                "update_id": 1,
                "message": {"message_id": 1, "date": 0, "text": "/forget",
                            "chat": {"id": 43, "type": "private"}},
            }  # fmt: skip
            assert await api.post_to_webhook(forged, secret=None, url=url) == 403
            assert await api.post_to_webhook(forged, secret="guess", url=url) == 403
            assert db_rows(tmp_path, "SELECT update_id FROM inbox") == []
            await conversation(api, 43, tmp_path)
            assert api.calls_to("getUpdates") == []
            assert await bot.stop() == 0
        output = bot.output()
    assert "setWebhook" in output  # logged (at DEBUG, with its parameters) ...
    assert SECRET not in output and TOKEN.split(":")[1] not in output  # ... but redacted


async def test_kill_9_while_generating_then_restart_answers_everything_exactly_once(
    tmp_path: Path, tiny_model_file: str
) -> None:
    a, b = 51, 52
    async with FakeBotAPI(TOKEN) as api:
        slow = bot_env(tmp_path, api, tiny_model_file, FAULT_GENERATION_DELAY_MS="1500")
        async with bot_process(slow, tmp_path, api) as bot:
            three_from_a_one_from_b(api, a, b)
            await api.wait_for_texts(a, 1, timeout_s=30)
            # a's second message is generating now (1.5 s): pull the plug.
            await asyncio.sleep(0.4)
            assert await bot.kill_9() == -signal.SIGKILL
        assert len(api.texts(a)) < 3
        # The crash left work behind: an update taken from Telegram but not yet answered.
        assert db_rows(tmp_path, "SELECT count(*) FROM inbox WHERE status = 'pending'") >= [(1,)]
        fast = bot_env(tmp_path, api, tiny_model_file)
        async with bot_process(fast, tmp_path, api) as bot:
            await api.wait_for_texts(a, 3, timeout_s=30)
            await api.wait_for_texts(b, 1, timeout_s=30)
            await settled_on_disk(api, tmp_path)  # a duplicate would be pending or queued
            assert await bot.stop() == 0
    assert len(api.texts(a)) == 3 and len(api.texts(b)) == 1
    assert db_rows(tmp_path, "SELECT DISTINCT status FROM inbox") == [("done",)]
    assert db_rows(tmp_path, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [(0,)]
    for chat, count in ((a, 3), (b, 1)):
        history = db_rows(
            tmp_path,
            f"SELECT role, update_id, text FROM messages WHERE chat_id = {chat} ORDER BY id",
        )
        roles = [r for r, _, _ in history]
        assert roles == ["user", "bot"] * count  # no duplicate, no orphan
        user_updates = [u for r, u, _ in history if r == "user"]
        assert len(set(user_updates)) == count
    sent = [s.text for s in api.sent if s.chat_id == a]
    delivered = db_rows(
        tmp_path,
        f"SELECT text FROM messages WHERE chat_id = {a} AND role = 'bot' ORDER BY id",
    )
    assert sent == [t for (t,) in delivered]


@pytest.mark.slow
async def test_polling_survives_a_flaky_bot_api(tmp_path: Path, tiny_model_file: str) -> None:
    from tests.support.fakebotapi import Fault

    async with FakeBotAPI(TOKEN) as api:
        api.inject(
            Fault("getUpdates", status=409, times=2),
            Fault("getUpdates", status=502, times=2),
            Fault("sendMessage", status=429, retry_after=2, times=2),
            Fault("sendMessage", status=500, times=2),
        )
        env = bot_env(tmp_path, api, tiny_model_file)
        async with bot_process(env, tmp_path, api) as bot:
            for i in range(3):
                api.user_message(60 + i, "hello how are you")
            for i in range(3):
                await api.wait_for_texts(60 + i, 1, timeout_s=60)
            bot.proc.send_signal(signal.SIGINT)
            assert await bot.wait(30) == 0
