"""How the batcher collects requests into batches: up to `max_size`, waiting at most
`max_wait_ms` for companions, newcomers queueing while a batch runs. On the tiny model's
shared agent and real clones (a batch of the tiny model takes milliseconds)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bot.engine.protocol import Generated
from bot.inference.batcher import Batcher
from bot.inference.cache import new_clone


@pytest.fixture
async def batchers(tiny_agent: Any) -> AsyncIterator[Callable[[int, float], Any]]:
    """make(max_size, max_wait_ms) -> a started Batcher, closed at teardown."""
    made: list[Batcher] = []

    async def make(max_size: int, max_wait_ms: float) -> Batcher:
        batcher = Batcher(tiny_agent, max_size=max_size, max_wait_ms=max_wait_ms)
        await batcher.start()
        made.append(batcher)
        return batcher

    yield make
    for batcher in made:
        await batcher.close()


def _ask(batcher: Batcher, agent: Any, text: str = "hello how are you") -> Any:
    return batcher.generate(new_clone(agent, ""), text)


async def test_requests_waiting_together_are_grouped_up_to_max_size(
    batchers: Any, tiny_agent: Any
) -> None:
    batcher = await batchers(2, 200)
    results: list[Generated] = await asyncio.gather(*(_ask(batcher, tiny_agent) for _ in range(5)))
    assert [r.batch_size for r in results] == [2, 2, 2, 2, 1]
    assert batcher.stats.sizes == Counter({2: 2, 1: 1})
    assert (batcher.stats.batches, batcher.stats.requests) == (3, 5)


async def test_a_lone_request_waits_max_wait_for_companions_then_goes_alone(
    batchers: Any, tiny_agent: Any
) -> None:
    batcher = await batchers(8, 150)
    started = time.monotonic()
    result = await _ask(batcher, tiny_agent)
    assert time.monotonic() - started - result.model_ms / 1000 >= 0.14
    assert result.batch_size == 1 and result.text


async def test_a_companion_within_max_wait_joins_the_batch(batchers: Any, tiny_agent: Any) -> None:
    batcher = await batchers(8, 1000)
    first = asyncio.ensure_future(_ask(batcher, tiny_agent))
    await asyncio.sleep(0.1)
    assert not first.done()  # still waiting for companions
    second = await _ask(batcher, tiny_agent, "what do you like")
    assert (await first).batch_size == second.batch_size == 2
    assert batcher.stats.batches == 1


async def test_a_full_batch_goes_at_once_without_waiting(batchers: Any, tiny_agent: Any) -> None:
    batcher = await batchers(2, 5000)
    started = time.monotonic()
    results = await asyncio.gather(_ask(batcher, tiny_agent), _ask(batcher, tiny_agent))
    assert time.monotonic() - started < 4  # not the 5 s max_wait
    assert [r.batch_size for r in results] == [2, 2]


async def test_a_companion_after_max_wait_goes_in_the_next_batch(
    batchers: Any, tiny_agent: Any
) -> None:
    batcher = await batchers(8, 20)
    first = await _ask(batcher, tiny_agent)
    second = await _ask(batcher, tiny_agent)
    assert first.batch_size == second.batch_size == 1
    assert batcher.stats.sizes == Counter({1: 2})


async def test_a_request_cancelled_while_waiting_is_left_out(
    batchers: Any, tiny_agent: Any
) -> None:
    batcher = await batchers(8, 300)
    kept = asyncio.ensure_future(_ask(batcher, tiny_agent))
    dropped = asyncio.ensure_future(_ask(batcher, tiny_agent))
    await asyncio.sleep(0.05)
    dropped.cancel()
    assert (await kept).batch_size == 1
    assert batcher.stats.requests == 1


async def test_newcomers_queue_while_a_batch_runs(batchers: Any, tiny_agent: Any) -> None:
    batcher = await batchers(8, 10)
    original = tiny_agent.batch_act
    running = asyncio.Event()
    loop = asyncio.get_running_loop()
    release = asyncio.Event()

    def slow_batch_act(observations: Any) -> Any:
        loop.call_soon_threadsafe(running.set)
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)
        return original(observations)

    batcher.shared_agent = type("Slow", (), {"batch_act": staticmethod(slow_batch_act)})()
    first = asyncio.ensure_future(_ask(batcher, tiny_agent))
    await running.wait()
    later = [asyncio.ensure_future(_ask(batcher, tiny_agent)) for _ in range(3)]
    await asyncio.sleep(0.1)  # 10x max_wait: they must still wait for the running batch
    assert not any(f.done() for f in later)
    release.set()
    assert (await first).batch_size == 1
    assert [(await f).batch_size for f in later] == [3, 3, 3]


async def test_generate_before_start_is_an_error(tiny_agent: Any) -> None:
    batcher = Batcher(tiny_agent, max_size=2, max_wait_ms=10)
    with pytest.raises(RuntimeError, match="start"):
        await _ask(batcher, tiny_agent)
    await batcher.close()
