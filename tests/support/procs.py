"""Helpers for the reliability suite: real `python -m bot run` processes (tests/e2e's), checks."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.support.botprocess import (
    ROOT,
    SECRET,
    START_TIMEOUT_S,
    TOKEN,
    BotProcess,
    bot_env,
    free_port,
)
from tests.support.cli import run_cli_async
from tests.support.fakebotapi import FakeBotAPI

__all__ = [
    "PASSWORD",
    "ROOT",
    "TOKEN",
    "BotProcess",
    "assert_clean",
    "bot_env",
    "check_database",
    "db_rows",
    "restart_until_answered",
    "run_against_unreachable_database",
    "start_bot",
    "three_from_a_one_from_b",
]

PASSWORD = "Pw-Db-Secret-4f9c2e"


def assert_clean(output: str, password: str = PASSWORD) -> None:
    """None of the secrets, in full or the token's secret half, is in `output`."""
    for secret in (TOKEN, TOKEN.split(":")[1], SECRET, password):
        assert secret not in output


async def run_against_unreachable_database(
    tmp_path: Path, model: str, **extra: str
) -> subprocess.CompletedProcess[str]:
    """`python -m bot run` with a webhook and a PostgreSQL URL (PASSWORD in it) on free ports
    nobody listens on, at DEBUG level plus `extra`: it must fail to start."""
    async with FakeBotAPI(TOKEN) as api:
        env = bot_env(
            tmp_path, api, model,
            DATABASE_URL=f"postgresql+asyncpg://bot:{PASSWORD}@127.0.0.1:{free_port()}/bot",
            WEBHOOK_URL=f"http://127.0.0.1:{free_port()}/hook", WEBHOOK_SECRET=SECRET,
            LOG_LEVEL="DEBUG", **extra,
        )  # fmt: skip
        return await run_cli_async("run", env=env, cwd=ROOT)


async def start_bot(
    env: dict[str, str], tmp_path: Path, api: FakeBotAPI, name: str = "bot"
) -> BotProcess:
    """Start `python -m bot run` (output in `<name>.log`) and wait until it polls anew."""
    before = len(api.calls_to("getUpdates"))
    bot = BotProcess(env, tmp_path, tmp_path / f"{name}.log")
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(api.calls_to("getUpdates")) <= before:
        if bot.proc.poll() is not None or time.monotonic() > deadline:
            bot.kill()
            raise AssertionError(f"bot did not start:\n{bot.output()[-3000:]}")
        await asyncio.sleep(0.05)
    return bot


async def restart_until_answered(
    tmp_path: Path,
    api: FakeBotAPI,
    model: str,
    name: str,
    answered: dict[int, int],
    *,
    within_s: float = 60.0,
) -> None:
    """Start the bot anew (output in `<name>.log`), wait until each chat has its number of
    texts, give a duplicate a second to show up, then stop it: it must exit 0."""
    bot = await start_bot(bot_env(tmp_path, api, model), tmp_path, api, name)
    try:
        for chat, texts in answered.items():
            await api.wait_for_texts(chat, texts, timeout_s=within_s)
        await asyncio.sleep(1.0)
        assert await bot.stop() == 0
    finally:
        bot.kill()


def three_from_a_one_from_b(api: FakeBotAPI, a: int, b: int) -> None:
    """The crash tests' traffic: three messages in chat `a`, then one in chat `b`."""
    for text in ("hello there", "how are you", "what do you like"):
        api.user_message(a, text)
    api.user_message(b, "hi from b")


def db_rows(tmp_path: Path, sql: str) -> list[tuple[Any, ...]]:
    """A read on the bot's SQLite file."""
    with sqlite3.connect(tmp_path / "bot.sqlite3") as conn:
        return list(conn.execute(sql))


def check_database(tmp_path: Path, answered: dict[int, int]) -> None:
    """The end state after recovery: every update closed, every text sent once, no orphans.

    `answered` maps chat id -> number of text turns it should have (user + bot message each).
    """
    assert db_rows(tmp_path, "PRAGMA integrity_check") == [("ok",)]
    assert db_rows(tmp_path, "SELECT count(*) FROM inbox WHERE status = 'pending'") == [(0,)]
    assert db_rows(tmp_path, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [(0,)]
    # No orphan: every reply row has its bot message; no turn recorded twice.
    assert db_rows(
        tmp_path,
        "SELECT count(*) FROM outbox o LEFT JOIN messages m ON m.id = o.message_id "
        "WHERE o.kind = 'reply' AND m.id IS NULL",
    ) == [(0,)]
    assert (
        db_rows(
            tmp_path,
            "SELECT update_id, count(*) FROM messages WHERE role = 'user' "
            "GROUP BY update_id HAVING count(*) > 1",
        )
        == []
    )
    assert (
        db_rows(
            tmp_path,
            "SELECT update_id, count(*) FROM outbox GROUP BY update_id HAVING count(*) > 1",
        )
        == []
    )
    for chat, turns in answered.items():
        roles = [
            r
            for (r,) in db_rows(
                tmp_path, f"SELECT role FROM messages WHERE chat_id = {chat} ORDER BY id"
            )
        ]
        assert roles == ["user", "bot"] * turns, (chat, roles)
