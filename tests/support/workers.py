"""Two variants, `a` and `b`, each with its model worker process under the real
`python -m bot run`: shared by tests/e2e's worker tests."""

from __future__ import annotations

import re
from pathlib import Path

from bot.engine.assign import choose
from tests.support.botprocess import bot_env
from tests.support.fakebotapi import FakeBotAPI

WEIGHTS = {"a": 1.0, "b": 1.0}


def write_variants(path: Path, model: str) -> Path:
    """A variants file: `a` (the control) and `b` (greedy), both on `model`."""
    path.write_text(
        f'[[variants]]\nname = "a"\nmodel = "{model}"\ncontrol = true\n'
        f'[[variants]]\nname = "b"\nmodel = "{model}"\ninference = "greedy"\n'
    )
    return path


def two_variant_env(tmp_path: Path, api: FakeBotAPI, model: str, **extra: str) -> dict[str, str]:
    """bot_env with write_variants' file in tmp_path and one thread per worker, plus `extra`."""
    return bot_env(
        tmp_path,
        api,
        model,
        VARIANTS_FILE=str(write_variants(tmp_path / "variants.toml", model)),
        WORKER_THREADS="1",
        **extra,
    )


def chats_of(variant: str, count: int, start: int) -> list[int]:
    """The first `count` chat ids from `start` that the hash gives `variant`."""
    found: list[int] = []
    chat = start
    while len(found) < count:
        if choose("default", chat, WEIGHTS) == variant:
            found.append(chat)
        chat += 1
    return found


def worker_pid(log: str, variant: str) -> int:
    """The process id of `variant`'s worker that the log said was ready last."""
    pids = re.findall(rf"variant {variant}: worker (\d+) ready", log)
    assert pids, f"no worker of variant {variant} in the log:\n{log[-3000:]}"
    return int(pids[-1])
