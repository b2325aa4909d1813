"""A model process's torch threads: one unless told, with passive OpenMP waiting set before
torch loads (bot/inference/model.py set_torch_threads), in a fresh interpreter each time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROBE = """
import sys
from bot.inference.model import set_torch_threads
assert "torch" not in sys.modules
set_torch_threads({threads}, {default})
import os, torch
print(torch.get_num_threads(), os.environ["OMP_WAIT_POLICY"], os.environ["KMP_BLOCKTIME"])
"""


def probe(threads: int | None, default: str = "1", **env: str) -> list[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OMP_NUM_THREADS")
    }
    code = PROBE.format(threads=threads, default=default)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.split()


def test_one_thread_and_passive_waiting_by_default() -> None:
    assert probe(None) == ["1", "PASSIVE", "0"]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")
def test_a_thread_count_given_wins() -> None:
    assert probe(2)[0] == "2"


def test_training_keeps_torchs_own_count_and_the_environment_wins() -> None:
    threads, policy, blocktime = probe(None, default="None", OMP_WAIT_POLICY="ACTIVE")
    assert int(threads) == (os.cpu_count() or 1)
    assert (policy, blocktime) == ("ACTIVE", "0")
