"""The inference thread's liveness (bot/inference/batcher.py's Liveness), which a model worker
reports in its answer to the service's pings: on the real tiny model, a generation that takes
long but makes decoding steps is progress, a step that blocks is not, and an idle thread is
never stuck. Both engines: the continuous scheduler and the micro-batcher."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from bot.config import Settings
from bot.inference.batcher import Batcher
from bot.inference.model import load_shared_agent
from bot.inference.responder import count_steps
from bot.inference.scheduler import Scheduler
from tests.support.waits import until


@pytest.fixture(scope="module")
def agent(tiny_model_file: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        bot_model=tiny_model_file,
        data_dir=tmp_path_factory.mktemp("liveness") / "data",
        beam_min_length=12,  # a dozen decoding steps at least
    )
    return load_shared_agent(settings)


async def _worst_stuck(engine: Batcher | Scheduler, agent: Any) -> tuple[float, float]:
    """One turn: the most seconds `stuck_s` said while it ran, and how long it took."""
    started = time.monotonic()
    task = asyncio.ensure_future(engine.generate(agent.clone(), "hello how are you today"))
    worst = 0.0
    while not task.done():
        worst = max(worst, engine.liveness.stuck_s())
        await asyncio.sleep(0.005)
    await task
    return worst, time.monotonic() - started


@pytest.mark.parametrize("kind", ["continuous", "batch"])
async def test_decoding_steps_are_progress_and_a_blocked_step_is_not(agent: Any, kind: str) -> None:
    engine: Batcher | Scheduler = (
        Scheduler(agent, max_size=4)
        if kind == "continuous"
        else Batcher(agent, max_size=4, max_wait_ms=0)
    )
    count_steps(agent, engine.liveness)
    step_s = {"now": 0.05, "once": 0.0}

    def slow_step(*_: object) -> None:
        time.sleep(step_s["now"] + step_s["once"])
        step_s["once"] = 0.0

    slow = agent.model.decoder.embeddings.register_forward_hook(slow_step)
    await engine.start()
    try:
        assert engine.liveness.stuck_s() == 0.0  # idle is never stuck
        worst, took = await _worst_stuck(engine, agent)
        # A dozen slow steps: the turn took many times longer than any gap between them.
        assert took > 0.6 and worst < took / 3, (worst, took)
        # Done: idle again once the thread has handed the reply out and looked for more work
        # (the reply can reach the loop a moment before the thread says it is idle).
        await until(lambda: engine.liveness.stuck_s() == 0.0, within_s=2, what="going idle")
        step_s["once"] = 1.5  # one step that blocks, as a hung kernel would
        worst, took = await _worst_stuck(engine, agent)
        assert worst > 1.2, (worst, took)
    finally:
        slow.remove()
        await engine.close()
