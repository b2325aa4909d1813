"""`python -m bot ...` as an operator runs it: a clean environment, the output captured."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from tests.support.botprocess import ROOT

# What a developer's shell may hold that would point a command at another bot or database.
FOREIGN = ("TELEGRAM_", "DATABASE_", "ADMIN_DATABASE_")


def cli_env(tmp_path: Path, *, strip: tuple[str, ...] = FOREIGN, **extra: str) -> dict[str, str]:
    """This process's environment less the `strip` prefixes, with this checkout on PYTHONPATH,
    DATA_DIR under tmp_path, and `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(strip)}
    env.update(PYTHONPATH=str(ROOT), DATA_DIR=str(tmp_path / "data"))
    env.update(extra)
    return env


def run_cli(
    *argv: str,
    env: dict[str, str] | None,
    cwd: Path | None = None,
    timeout: float = 120,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m bot *argv` (`input` on its stdin), its stdout and stderr captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "bot", *argv],
        input=input,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def run_cli_async(
    *argv: str, env: dict[str, str] | None, cwd: Path | None = None, limit_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """run_cli in a thread, for a test whose event loop serves a loopback API meanwhile."""
    return await asyncio.to_thread(run_cli, *argv, env=env, cwd=cwd, timeout=limit_s)
