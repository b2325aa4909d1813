"""Every turn's deadline on a backend whose model is elsewhere (a worker process, Ray Serve):
GENERATION_TIMEOUT_S, waiting for a restarted model included."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

from bot.engine.protocol import GenerationError

T = TypeVar("T")


class TimedBackend(Protocol):
    """What within_turn_deadline needs of a variant's backend (worker process or Ray)."""

    name: str
    turn_timeout_s: float

    def evict(self, session_id: int) -> None: ...


async def within_turn_deadline(
    backend: TimedBackend, session_id: int, work: Coroutine[Any, Any, T]
) -> T:
    """`work` (a turn's round trips to the backend's model, waiting for a restarted one
    included) within GENERATION_TIMEOUT_S; after it, the session's clone is evicted (whatever
    the model still does with it is not stored) and the turn fails."""
    try:
        async with asyncio.timeout(backend.turn_timeout_s):
            return await work
    except TimeoutError:
        backend.evict(session_id)
        raise GenerationError(
            f"variant {backend.name}: no reply within GENERATION_TIMEOUT_S "
            f"({backend.turn_timeout_s:g} s)"
        ) from None
