"""LOG_FORMAT=json on the real `python -m bot run`: every line of its output (model worker
processes included) is one JSON object, chat_id/update_id are there while an update is worked
on, and the token, the webhook secret and the database password appear nowhere."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.botprocess import SECRET, bot_process
from tests.support.fakebotapi import FakeBotAPI, Fault
from tests.support.pgserver import private_postgres
from tests.support.procs import (
    PASSWORD,
    TOKEN,
    assert_clean,
    bot_env,
    run_against_unreachable_database,
)


def json_lines(output: str) -> list[dict[str, Any]]:
    """Every line as a JSON object with the four fields every record has; fails on any other."""
    records = []
    for number, line in enumerate(output.splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError as err:
            raise AssertionError(f"line {number} is not JSON: {line[:300]!r}") from err
        assert isinstance(record, dict), line
        assert {"time", "level", "logger", "message"} <= record.keys(), line
        when = datetime.fromisoformat(record["time"])
        assert when.utcoffset() == timedelta(0), line
        records.append(record)
    assert records, "no output at all"
    return records


async def test_unreachable_database_at_debug_level_in_json(
    tmp_path: Path, tiny_model_file: str
) -> None:
    done = await run_against_unreachable_database(tmp_path, tiny_model_file, LOG_FORMAT="json")
    assert done.returncode != 0
    assert done.stdout == ""  # logs go to stderr
    records = json_lines(done.stderr)
    assert any(r["level"] == "DEBUG" for r in records)  # it did log at DEBUG
    failure = [r for r in records if r["level"] in ("ERROR", "CRITICAL")]
    assert failure and "127.0.0.1" in json.dumps(failure)  # it says what it cannot reach
    assert_clean(done.stderr)
    assert_clean(json.dumps(records, ensure_ascii=False))  # nor in a JSON-escaped form


@pytest.mark.slow
async def test_a_real_run_logs_json_lines_with_the_update_context(
    tmp_path: Path, tiny_model_file: str
) -> None:
    chat = 7301
    async with private_postgres(password=PASSWORD) as pg, FakeBotAPI(TOKEN) as api:
        env = bot_env(
            tmp_path, api, tiny_model_file, DATABASE_URL=pg.url, WEBHOOK_SECRET=SECRET,
            LOG_LEVEL="DEBUG", LOG_FORMAT="json",
        )  # fmt: skip
        async with bot_process(env, tmp_path, api) as bot:
            api.user_message(chat, "hello how are you")
            await api.wait_for_texts(chat, 1, timeout_s=60)
            # A failing send: its warning carries the chat it was for.
            api.inject(Fault("sendMessage", status=500, times=1))
            update_id = api.user_message(chat, "/help")
            await api.wait_for_texts(chat, 2, timeout_s=60)
            assert await bot.stop() == 0
        output = bot.output()
    records = json_lines(output)
    assert_clean(output)
    assert_clean(json.dumps(records, ensure_ascii=False))
    loggers = {r["logger"] for r in records}
    assert "bot.inference.process" in loggers  # the model worker process logs JSON too
    sending = [r for r in records if r["message"].startswith(f"sending to chat {chat} failed")]
    assert sending and all(r.get("chat_id") == chat for r in sending), sending
    processed = [r for r in records if r["message"].startswith(f"update {update_id} processed")]
    assert processed and processed[0]["chat_id"] == chat, processed
    assert processed[0]["update_id"] == update_id
    assert not any("chat_id" in r for r in records if r["message"] == "stopped")
