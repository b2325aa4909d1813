"""Secrets: DEBUG-level runs of the real process with forced errors; the token, the webhook
secret and the database password appear nowhere in the output."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.botprocess import SECRET, bot_process, free_port
from tests.support.fakebotapi import FakeBotAPI, Fault
from tests.support.pgserver import private_postgres
from tests.support.procs import (
    PASSWORD,
    TOKEN,
    assert_clean,
    bot_env,
    run_against_unreachable_database,
)


async def test_unreachable_database_at_debug_level_leaks_nothing(
    tmp_path: Path, tiny_model_file: str
) -> None:
    done = await run_against_unreachable_database(tmp_path, tiny_model_file)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "127.0.0.1" in output  # it did say what it could not reach ...
    assert_clean(output)  # ... without the password


@pytest.mark.slow
async def test_debug_run_with_database_outage_and_api_faults_leaks_nothing(
    tmp_path: Path, tiny_model_file: str
) -> None:
    port = free_port()
    async with private_postgres(password=PASSWORD) as pg, FakeBotAPI(TOKEN) as api:
        api.inject(
            Fault("sendMessage", status=500, times=2),
            Fault("sendMessage", status=429, retry_after=1, times=2),
            Fault("sendMessage", status=403, chat_id=7099, times=10),
            Fault("setWebhook", status=502, times=1),
        )
        env = bot_env(
            tmp_path, api, tiny_model_file, DATABASE_URL=pg.url,
            WEBHOOK_URL=f"http://127.0.0.1:{port}/tg", WEBHOOK_SECRET=SECRET,
            WEBHOOK_LISTEN="127.0.0.1", WEBHOOK_PORT=str(port), LOG_LEVEL="DEBUG",
        )  # fmt: skip
        async with bot_process(env, tmp_path, api, ready="setWebhook") as bot:
            await api.wait_for(lambda: api.webhook.url != "", 90, "setWebhook")
            api.user_message(7001, "hello how are you")
            api.user_message(7099, "hello from a chat that blocked the bot")
            await api.wait_for_texts(7001, 1, timeout_s=60)
            await asyncio.to_thread(pg.stop)  # the database goes away under traffic
            api.user_message(7001, "are you still there")
            await asyncio.sleep(3.0)
            await asyncio.to_thread(pg.start)
            await api.wait_for_texts(7001, 2, timeout_s=60)
            assert await bot.stop() == 0
        output = bot.output()
    assert "DEBUG" in output and "WARNING" in output  # it logged at DEBUG, errors included
    assert_clean(output)


async def test_token_from_the_systemd_credential_is_used_and_never_logged(
    tmp_path: Path, tiny_model_file: str
) -> None:
    """deploy/systemd/telegram-bot@.service passes the token as a credential: no
    TELEGRAM_BOT_TOKEN, the file $CREDENTIALS_DIRECTORY/telegram-bot-token instead. The
    service talks to the Bot API with it (the loopback API answers only that token) and logs
    it nowhere, at DEBUG level, JSON lines included."""
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "telegram-bot-token").write_text(TOKEN + "\n")
    async with FakeBotAPI(TOKEN) as api:
        env = bot_env(tmp_path, api, tiny_model_file, LOG_LEVEL="DEBUG", LOG_FORMAT="json")
        del env["TELEGRAM_BOT_TOKEN"]
        env["CREDENTIALS_DIRECTORY"] = str(credentials)
        async with bot_process(env, tmp_path, api) as bot:
            api.user_message(7301, "hello with a credential")
            await api.wait_for_texts(7301, 1, timeout_s=60)
            assert await bot.stop() == 0
        output = bot.output()
    assert '"level": "DEBUG"' in output
    assert_clean(output)
