"""`python -m bot admin ...` (filled in by the Admin issue)."""

from __future__ import annotations

import argparse
from typing import Any

from bot.config import Settings


def add_admin_parser(sub: Any) -> None:
    """Register the `admin` subcommand."""
    sub.add_parser("admin", help="inspect conversations and service health (not implemented yet)")


def run_admin(settings: Settings, args: argparse.Namespace) -> int:
    """Run an admin subcommand."""
    print("admin: not implemented yet")
    return 2
