"""`zoo:` models on a machine without the internet (issue 33.5): an unstaged zoo model is
refused within seconds, naming the directory its files go in; a staged one loads offline.

"No network" is made deterministic with a proxy that refuses every connection
(`http_proxy` on a closed loopback port): ParlAI's download and our probe both go through it,
so the tests behave the same on a machine that can reach parl.ai."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bot.config import ConfigError, Settings
from bot.inference.model import load_shared_agent
from tests.support.botprocess import TOKEN, free_port

ROOT = Path(__file__).resolve().parents[3]
ZOO = "zoo:blender/blender_400Mdistill/model"
WITHIN_S = 8.0  # ParlAI's own retries took about 15 s, then "Connection broken too many times"


def _offline(monkeypatch: pytest.MonkeyPatch) -> str:
    proxy = f"http://127.0.0.1:{free_port()}"  # nothing listens there: refused at once
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, proxy)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return proxy


def _settings(data_dir: Path) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None, data_dir=data_dir, bot_model=ZOO, model_device="cpu"
    )


def _stage(tiny_model_file: str, data_dir: Path, marker: str | None) -> Path:
    """The tiny model staged as blender_400Mdistill: its files, its .opt's dictionary pointing
    at the staged copy (as a zoo model's names its own), and `marker` as the .built file."""
    directory = data_dir / "parlai" / "models" / "blender" / "blender_400Mdistill"
    directory.mkdir(parents=True)
    for f in Path(tiny_model_file).parent.glob("model*"):
        shutil.copy(f, directory / f.name)
    opt_file = directory / "model.opt"
    opt = json.loads(opt_file.read_text())
    opt["dict_file"] = "zoo:blender/blender_400Mdistill/model.dict"
    opt["model_file"] = str(directory / "model")
    opt_file.write_text(json.dumps(opt))
    if marker is not None:
        (directory / ".built").write_text(marker)
    return directory


def test_an_unreachable_zoo_is_refused_within_seconds_naming_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the download retried for about 15 s and ended with ParlAI's RuntimeError
    "Connection broken too many times", which named neither the model nor where it goes."""
    _offline(monkeypatch)
    directory = (tmp_path / "parlai" / "models" / "blender" / "blender_400Mdistill").resolve()
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        load_shared_agent(_settings(tmp_path))
    assert time.monotonic() - started < WITHIN_S
    message = str(caught.value)
    assert f"BOT_MODEL {ZOO} is not staged here" in message
    assert str(directory) in message
    assert ".built's second line: v1.1" in message
    assert "docs/models.md" in message


def test_a_staged_zoo_model_loads_offline(
    tiny_model_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _offline(monkeypatch)
    _stage(tiny_model_file, tmp_path, "2026-12-01 00:00:00\nv1.1")
    agent = load_shared_agent(_settings(tmp_path))
    assert agent.opt["model_file"].endswith("blender_400Mdistill/model")
    agent.observe({"text": "hello how are you", "episode_done": False})
    assert agent.act()["text"]


def test_a_staged_zoo_model_with_a_marker_of_another_version_is_refused(
    tiny_model_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ParlAI deletes a directory whose .built names another version, to download it again:
    offline, that would lose the staged files. Refused first, naming the version."""
    _offline(monkeypatch)
    directory = _stage(tiny_model_file, tmp_path, "2026-12-01 00:00:00")  # no version line
    with pytest.raises(ConfigError, match=r"names version None, ParlAI's zoo expects 'v1.1'"):
        load_shared_agent(_settings(tmp_path))
    assert (directory / "model").is_file()  # nothing deleted


@pytest.mark.parametrize("command", ["run", "chat"])
def test_the_command_line_refuses_an_unreachable_zoo_with_status_2(
    tmp_path: Path, command: str
) -> None:
    """Regression: `run` with an unreachable Bot API retried getMe for ever before the model
    loaded; once it did, ParlAI's download retried for 15 s and ended in a traceback."""
    import os

    proxy = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEGRAM_", "DATABASE_"))}
    env = {k: v for k, v in env.items() if k.lower() not in ("no_proxy", "bot_model")}
    db_file = tmp_path / "bot.sqlite3"
    env.update(
        PYTHONPATH=str(ROOT), DATA_DIR=str(tmp_path / "data"), BOT_MODEL=ZOO,
        TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_BASE_URL=f"http://127.0.0.1:{free_port()}/bot",
        DATABASE_URL=f"sqlite+aiosqlite:///{db_file}", http_proxy=proxy, HTTP_PROXY=proxy,
    )  # fmt: skip
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bot", command],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"").decode() + (err.stderr or b"").decode()
        pytest.fail(f"still running after 30 s:\n{output[-3000:]}")
    elapsed = time.monotonic() - started
    directory = tmp_path / "data" / "parlai" / "models" / "blender" / "blender_400Mdistill"
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"error: BOT_MODEL {ZOO} is not staged here" in proc.stderr
    assert str(directory.resolve()) in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not db_file.exists()  # refused before the database, and before getMe
    assert elapsed < 20, elapsed
