"""`python -m bot run` (filled in by the Telegram service issue)."""

from __future__ import annotations

import sys

from bot.config import Settings


def run_service(settings: Settings) -> int:
    """Serve Telegram until stopped; returns the exit status."""
    print("run: not implemented yet", file=sys.stderr)
    return 2
