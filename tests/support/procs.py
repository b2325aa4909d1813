"""Helpers for the reliability suite: real `python -m bot run` processes (tests/e2e's), checks."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

from tests.support.botprocess import ROOT, START_TIMEOUT_S, TOKEN, BotProcess, bot_env
from tests.support.fakebotapi import FakeBotAPI

__all__ = ["ROOT", "TOKEN", "BotProcess", "bot_env", "check_database", "db_rows", "start_bot"]


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
