"""`python -m bot chat` (filled in by the Engine issue)."""

from __future__ import annotations

import sys

from bot.config import Settings


async def run_terminal(settings: Settings, *, chat_id: int) -> int:
    """Chat in the terminal; returns the exit status."""
    print("chat: not implemented yet", file=sys.stderr)
    return 2
