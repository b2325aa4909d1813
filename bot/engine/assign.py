"""Sticky, weighted, deterministic assignment of chats to variants.

As GrowthBook and Unleash do: a hash of (experiment, chat_id) gives the chat a fixed point in
[0, 1), which falls into one variant's share of the weights. The result is stored at the chat's
first turn (bot.db.assignments), so later weight changes move no existing chat; a weight of 0
takes a variant out of new assignments only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


def bucket(experiment: str, chat_id: int) -> float:
    """The chat's fixed point in [0, 1) for this experiment (first 64 bits of SHA-256)."""
    digest = hashlib.sha256(f"{experiment}:{chat_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def choose(experiment: str, chat_id: int, weights: Mapping[str, float]) -> str:
    """The variant a new chat gets: its bucket over the positive weights, in the given order."""
    live = [(name, w) for name, w in weights.items() if w > 0]
    if not live:
        raise ValueError("no variant has a weight above 0")
    point = bucket(experiment, chat_id) * sum(w for _, w in live)
    for name, weight in live:
        point -= weight
        if point < 0:
            return name
    return live[-1][0]  # rounding at the very top of the range
