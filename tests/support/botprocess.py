"""The real `python -m bot run` in a subprocess against the loopback Bot API: shared by the
end-to-end tests, the reliability suite, the soak and the benchmarks."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.support.fakebotapi import FakeBotAPI
from tests.support.waits import until

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "987654321:AAFakeTokenForEndToEndTests_abcdefg"
assert len(TOKEN.split(":")[1]) == 35
SECRET = "e2e-webhook-Secret_42"
START_TIMEOUT_S = 90.0


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BotProcess:
    """`python -m bot run` in a subprocess, its output in a file (with FAULT_GENERATION_DELAY_MS
    in `env`, through tests/support/slow_bot.py, which slows every generation batch down)."""

    def __init__(self, env: dict[str, str], cwd: Path, log: Path) -> None:
        self.log = log
        self._out = log.open("ab")
        module = "tests.support.slow_bot" if "FAULT_GENERATION_DELAY_MS" in env else "bot"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "run"],
            cwd=cwd,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        """Everything the process printed so far."""
        return self.log.read_text(errors="replace")

    async def wait(self, timeout_s: float) -> int:
        """Wait for the process to exit; its exit status."""
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"bot did not exit in {timeout_s}s:\n{self.output()[-3000:]}")
            await asyncio.sleep(0.05)
        return self.proc.returncode

    async def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then wait for the process to exit; its exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return await self.wait(timeout_s)

    async def kill_9(self) -> int:
        """SIGKILL, then wait for the process to be gone; its exit status."""
        self.proc.send_signal(signal.SIGKILL)
        return await self.wait(10)

    def kill(self) -> None:
        """kill -9 it (if it still runs)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._out.close()


def bot_env(tmp_path: Path, api: FakeBotAPI, model: str, **extra: str) -> dict[str, str]:
    """A clean environment for the bot: the fake API, a tmp SQLite file, the given model."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PYTHONPATH": str(ROOT),
        "TELEGRAM_BOT_TOKEN": TOKEN,
        "TELEGRAM_BASE_URL": api.base_url,
        "DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'bot.sqlite3'}",
        "BOT_MODEL": model,
        "DATA_DIR": str(tmp_path / "data"),
        "SHUTDOWN_GRACE_S": "10",
        "MODEL_DEVICE": "cpu",
        "TORCH_THREADS": "1",
    }
    env.update(extra)
    return env


@asynccontextmanager
async def bot_process(
    env: dict[str, str], tmp_path: Path, api: FakeBotAPI, *, ready: str = "getUpdates"
) -> AsyncIterator[BotProcess]:
    """Start the bot, wait until it polls (or set its webhook); always kill it at the end."""
    bot = BotProcess(env, tmp_path, tmp_path / "bot.log")
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not api.calls_to(ready):
            if bot.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"bot did not start:\n{bot.output()[-3000:]}")
            await asyncio.sleep(0.05)
        yield bot
    finally:
        bot.kill()


def db_rows(tmp_path: Path, sql: str) -> list[tuple[object, ...]]:
    """Rows of a query on the bot's SQLite file."""
    with sqlite3.connect(tmp_path / "bot.sqlite3") as conn:
        return list(conn.execute(sql))


async def settled_on_disk(api: FakeBotAPI, tmp_path: Path, *, within_s: float = 30.0) -> None:
    """tests/support/service_harness.settled for a bot process on tmp_path's SQLite file: every
    update confirmed, no inbox row pending, no text waiting, no Bot API call but the long poll
    in flight. Then nothing more goes out until something new comes in (or a worker that is
    still generating is woken: that needs its own wait)."""

    def quiet() -> bool:
        if api.unconfirmed:
            return False
        if any(c.status is None for c in api.calls if c.method != "getUpdates"):
            return False
        [(inbox_left,)] = db_rows(tmp_path, "SELECT count(*) FROM inbox WHERE status = 'pending'")
        [(outbox_left,)] = db_rows(
            tmp_path, "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND failed_at IS NULL"
        )
        return inbox_left == 0 and outbox_left == 0

    await until(quiet, within_s=within_s, every_s=0.05, what="the bot process settling")
