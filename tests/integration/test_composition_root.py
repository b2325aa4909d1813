"""bot/__main__.py is the composition root: each command sets the process up once, there.

Every command is run for real (tests/support/setup_probe.py counts the set-up functions): one
logging set-up and one root handler; the ParlAI shims before anything imports ParlAI, and torch's
thread count, once, for the commands that load a model; ParlAI's logger routed once where a model
serves. `run` with a model in place never imports the offline training pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.botprocess import ROOT, TOKEN
from tests.support.fakebotapi import FakeBotAPI

TIMEOUT_S = 120.0
# Commands other than `run` never reach the Bot API: nothing listens there.
NO_API = "http://127.0.0.1:9"


def _env(tmp_path: Path, model: str, base_url: str = NO_API) -> dict[str, str]:
    """A clean environment (tests/support/botprocess.py's): a tmp SQLite file, the given model."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PYTHONPATH": str(ROOT),
        "TELEGRAM_BOT_TOKEN": TOKEN,
        "TELEGRAM_BASE_URL": base_url,
        "DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'bot.sqlite3'}",
        "BOT_MODEL": model,
        "DATA_DIR": str(tmp_path / "data"),
        "MODEL_DEVICE": "cpu",
        "TORCH_THREADS": "1",
    }


def _report(output: str) -> dict[str, Any]:
    line = next((x for x in output.splitlines() if x.startswith("SETUP=")), None)
    assert line is not None, output[-3000:]
    report: dict[str, Any] = json.loads(line.removeprefix("SETUP="))
    return report


async def _probe(
    argv: list[str], env: dict[str, str], cwd: Path, api: FakeBotAPI | None = None
) -> dict[str, Any]:
    """Run the probe; `run` is stopped with SIGTERM once it polls, like an operator would."""
    log = cwd / f"probe-{argv[0]}.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.setup_probe", *argv,
            cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while proc.returncode is None and time.monotonic() < deadline:
                if api is not None and api.calls_to("getUpdates"):
                    proc.send_signal(signal.SIGTERM)
                    api = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 0.05)
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
    output = log.read_text(errors="replace")
    assert proc.returncode == 0, output[-3000:]
    assert "Traceback" not in output
    return _report(output)


def _assert_model_process(report: dict[str, Any], *, routed: bool) -> None:
    calls = report["calls"]
    assert calls["setup_logging"] == 1, calls
    assert report["root_handlers"] == 1
    assert calls["apply"] == 1, calls
    assert report["parlai_before_shims"] == [False]
    assert calls["set_torch_threads"] == 1 and calls["set_num_threads"] == 1, calls
    assert calls.get("route_parlai_logging", 0) == (1 if routed else 0), calls


async def test_run_sets_up_once_and_never_imports_training(
    tmp_path: Path, tiny_model_file: str
) -> None:
    async with FakeBotAPI(TOKEN) as api:
        env = _env(tmp_path, tiny_model_file, api.base_url)
        report = await _probe(["run"], env, tmp_path, api)
    _assert_model_process(report, routed=True)
    assert report["training_modules"] == []


async def test_chat_sets_up_once_and_never_imports_training(
    tmp_path: Path, tiny_model_file: str
) -> None:
    report = await _probe(["chat"], _env(tmp_path, tiny_model_file), tmp_path)
    _assert_model_process(report, routed=True)
    assert report["training_modules"] == []


async def test_train_sets_up_once(tmp_path: Path, tiny_model_file: str) -> None:
    # --if-missing on a complete model: the whole command runs, without a real training
    argv = ["train", "--if-missing", "--out", tiny_model_file]
    report = await _probe(argv, _env(tmp_path, tiny_model_file), tmp_path)
    _assert_model_process(report, routed=False)


@pytest.mark.parametrize("argv", [["db", "current"], ["admin", "sessions"]])
async def test_db_and_admin_set_logging_up_once_and_load_no_model(
    tmp_path: Path, argv: list[str]
) -> None:
    env = _env(tmp_path, str(tmp_path / "no-model"))
    if argv[0] == "admin":
        await _probe(["db", "upgrade"], env, tmp_path)
    report = await _probe(argv, env, tmp_path)
    assert report["calls"] == {"setup_logging": 1}
    assert report["root_handlers"] == 1
    assert report["training_modules"] == []
