"""Retry delays shared by ingest, the sequencer and delivery."""

from __future__ import annotations

import asyncio
import random
import warnings
from dataclasses import dataclass
from datetime import timedelta

from telegram.error import RetryAfter
from telegram.warnings import PTBDeprecationWarning


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with a cap and a little jitter, so retries of many chats spread out."""

    initial_s: float = 0.5
    factor: float = 2.0
    cap_s: float = 30.0
    jitter: float = 0.1

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (1-based)."""
        base = min(self.cap_s, self.initial_s * self.factor ** max(0, attempt - 1))
        return base * (1.0 + random.uniform(0.0, self.jitter))

    async def sleep(self, attempt: int) -> None:
        """Wait before retry number `attempt`."""
        await asyncio.sleep(self.delay(attempt))


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait for `event` at most `timeout_s` seconds; True if it was set."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        return False
    return True


def retry_after_s(err: RetryAfter) -> float:
    """Seconds a 429 asks us to wait (PTB 22 warns that the attribute becomes a timedelta)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = err.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)
