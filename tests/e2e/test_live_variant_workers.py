"""Under the real `python -m bot run` with worker processes: `admin variants add` (the real
command line) starts a new variant's worker process in the running service, which answers new
chats; `admin variants remove` stops that process again, and its chat moves at its next turn."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bot.engine.assign import choose
from tests.support.botprocess import ROOT, TOKEN, bot_env, bot_process, db_rows
from tests.support.fakebotapi import FakeBotAPI


def admin(env: dict[str, str], tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot", "admin", *argv],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").exists()
        and "zombie" not in Path(f"/proc/{pid}/status").read_text(errors="replace").lower()
    )


@pytest.mark.slow
async def test_add_starts_a_worker_process_and_remove_stops_it(
    tmp_path: Path, tiny_model_file: str
) -> None:
    vf = tmp_path / "v.toml"
    vf.write_text(f'[[variants]]\nname = "a"\nmodel = "{tiny_model_file}"\ncontrol = true\n')
    async with FakeBotAPI(TOKEN) as api:
        env = bot_env(tmp_path, api, tiny_model_file, VARIANTS_FILE=str(vf), WORKER_THREADS="1")
        async with bot_process(env, tmp_path, api) as bot:
            api.user_message(1, "hello")
            await api.wait_for_texts(1, 1, timeout_s=60)
            t0 = time.monotonic()
            proc = admin(env, tmp_path, "variants", "add", "c", "--model", tiny_model_file,
                         "--weight", "1000", "--inference", "greedy")  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            pid = 0
            while not pid:
                found = re.findall(r"variant c: worker (\d+) ready", bot.output())
                pid = int(found[-1]) if found else 0
                assert time.monotonic() - t0 < 10.0, bot.output()[-3000:]
                await asyncio.sleep(0.1)
            assert alive(pid)
            chat = next(
                c for c in range(100, 200) if choose("default", c, {"a": 1, "c": 1000}) == "c"
            )
            api.user_message(chat, "hello there")
            await api.wait_for_texts(chat, 1, timeout_s=30)
            assert db_rows(tmp_path, f"SELECT variant FROM assignments WHERE chat_id = {chat}") == [
                ("c",)
            ]
            assert db_rows(tmp_path, "SELECT variant FROM assignments WHERE chat_id = 1") == [
                ("a",)
            ]

            t0 = time.monotonic()
            proc = admin(env, tmp_path, "variants", "remove", "c")
            assert proc.returncode == 0, proc.stderr
            while alive(pid):
                assert time.monotonic() - t0 < 10.0, "the removed variant's worker still runs"
                await asyncio.sleep(0.1)
            api.user_message(chat, "still there?")
            await api.wait_for_texts(chat, 2, timeout_s=30)
            assert db_rows(
                tmp_path, f"SELECT variant, source FROM assignments WHERE chat_id = {chat}"
            ) == [("a", "moved")]  # a move, not a draw (issue 34)
        assert "Traceback" not in bot.output()
