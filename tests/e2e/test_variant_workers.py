"""Model workers under the real `python -m bot run`: a variant's worker killed with SIGKILL in
the middle of a batch is restarted, every turn is answered exactly once, and the other variant
keeps answering meanwhile."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from tests.support.botprocess import TOKEN, bot_process, db_rows, settled_on_disk
from tests.support.fakebotapi import FakeBotAPI
from tests.support.workers import chats_of, two_variant_env, worker_pid


async def test_a_killed_worker_is_restarted_and_its_turns_answered_once(
    tmp_path: Path, tiny_model_file: str
) -> None:
    on_a = chats_of("a", 3, 600)
    on_b = chats_of("b", 2, 600)
    async with FakeBotAPI(TOKEN) as api:
        env = two_variant_env(tmp_path, api, tiny_model_file, FAULT_GENERATION_DELAY_MS="1500")
        async with bot_process(env, tmp_path, api) as bot:
            for chat in on_a:
                api.user_message(chat, "hello there")
            # The batch with a's three turns is generating (1.5 s): kill a's worker.
            await asyncio.sleep(0.8)
            pid_a = worker_pid(bot.output(), "a")
            killed_at = time.time()
            os.kill(pid_a, signal.SIGKILL)
            for chat in on_b:
                api.user_message(chat, "hi from b")
            for chat in on_a + on_b:
                await api.wait_for_texts(chat, 1, timeout_s=60)
            # Would a duplicate follow? (a's worker was killed: only a turn run again could
            # make one, and it would be pending or queued until this returns)
            await settled_on_disk(api, tmp_path)
            log = bot.output()
            assert await bot.stop() == 0
    assert f"variant a: worker {pid_a} died" in log
    assert worker_pid(log, "a") != pid_a  # restarted
    for chat in on_a + on_b:
        assert len(api.texts(chat)) == 1, chat
    first_a = min(s.at for s in api.sent if s.chat_id in on_a)
    first_b = min(s.at for s in api.sent if s.chat_id in on_b)
    assert killed_at < first_b < first_a  # b answered while a was still coming back
    assert db_rows(tmp_path, "SELECT DISTINCT status FROM inbox") == [("done",)]
    replies = db_rows(
        tmp_path, "SELECT chat_id, variant FROM messages WHERE role = 'bot' ORDER BY chat_id"
    )
    assert replies == sorted([(c, "a") for c in on_a] + [(c, "b") for c in on_b])
