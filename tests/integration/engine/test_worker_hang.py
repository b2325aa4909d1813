"""A real model worker process (tiny model) that stops (SIGSTOP), seen from its handle: the
event loop never blocks on its pipe, a full pipe restarts it and its turns are answered by the
new one, and a turn has a deadline even when nothing notices the hang."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from bot.config import Settings
from bot.engine.backends.local import PIPE_FULL, ModelProcess, process_spec
from bot.engine.protocol import GenerationError
from tests.integration.engine.test_worker_drafts import NoHistory, _session

LONG = "tell me about the weather and your family and your work " * 30


def _handle(tiny_model_file: str, tmp_path: Path, **settings: float) -> ModelProcess:
    own = Settings(  # type: ignore[call-arg]
        _env_file=None, bot_model=tiny_model_file, data_dir=tmp_path / "data", **settings
    )
    return ModelProcess(process_spec("tiny", own, {}, 1, ()), NoHistory())


async def _loop_lag(until: asyncio.Future[object]) -> float:
    """The event loop's worst lag (seconds) while `until` is pending."""
    worst = 0.0
    while not until.done():
        started = time.monotonic()
        await asyncio.sleep(0.01)
        worst = max(worst, time.monotonic() - started - 0.01)
    return worst


async def test_a_full_pipe_restarts_the_worker_and_its_turns_are_answered(
    tiny_model_file: str, tmp_path: Path
) -> None:
    handle = _handle(tiny_model_file, tmp_path)
    handle.send_queue_size = 20  # the pipe's 64 KiB, then 20 messages
    await handle.start()
    try:
        old = handle.pid
        assert old is not None
        os.kill(old, signal.SIGSTOP)
        turns = asyncio.ensure_future(
            asyncio.gather(*(handle.generate(_session(i), LONG) for i in range(1, 6)))
        )
        await asyncio.sleep(0.2)
        for session_id in range(5000):  # small messages, more than the pipe holds
            handle.evict(session_id)
            if not handle.alive:
                break
            await asyncio.sleep(0)  # let the writer thread fill the pipe
        lag = await _loop_lag(turns)
        replies = await turns
        new = handle.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(old, signal.SIGCONT)
    finally:
        await handle.close()
    assert lag < 0.5, lag  # the loop never waited on the stopped worker
    assert all(r.text for r in replies)
    assert handle.restart_reasons == {PIPE_FULL: 1}
    assert new is not None and new != old


async def test_a_turn_has_a_deadline_when_a_hang_goes_unnoticed(
    tiny_model_file: str, tmp_path: Path
) -> None:
    handle = _handle(tiny_model_file, tmp_path, worker_stall_s=600, generation_timeout_s=5)
    await handle.start()
    pid = handle.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(GenerationError, match="GENERATION_TIMEOUT_S"):
            await handle.generate(_session(1), "hello there")
        assert 5 <= time.monotonic() - started < 8
        closing = time.monotonic()
    finally:
        await handle.close()  # a worker that does not answer is killed at once
    assert time.monotonic() - closing < 3
    assert handle.restart_reasons == {}
