"""`python -m bot train` (filled in by the Engine issue)."""

from __future__ import annotations

import sys

from bot.config import Settings


def train_cli(
    settings: Settings, *, minutes: float | None, if_missing: bool, out: str | None
) -> int:
    """Train the default model; returns the exit status."""
    print("train: not implemented yet", file=sys.stderr)
    return 2
