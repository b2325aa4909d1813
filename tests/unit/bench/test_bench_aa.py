"""bench.aa on a tiny run: the simulated chats, the real report path on a real SQLite database,
the full report agreeing with the fast path, and the RESULT lines the issue asks for."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from bench import aa, common


def test_simulated_chats_follow_the_setup() -> None:
    setup = aa.Setup(aa=1, ab=0, chats=2000, batches=10, votes=6.0, seed=1, full_every=1, name="x")
    sim = aa.simulate(np.random.default_rng(3), setup, lift=0.05)
    votes = [v for batch in sim.votes_by_batch for v in batch]
    # every chat votes at least once, about 6 times on average
    assert len({i for i, _ in votes}) == setup.chats
    assert 5.5 < len(votes) / setup.chats < 6.5
    by_arm = {arm: [p for p, a in zip(sim.propensity, sim.arm, strict=True) if a == arm]
              for arm in "ab"}  # fmt: skip
    # Beta(3, 2) against Beta(3.25, 1.75): means 0.60 and 0.65
    assert np.mean(by_arm["a"]) == pytest.approx(0.60, abs=0.02)
    assert np.mean(by_arm["b"]) == pytest.approx(0.65, abs=0.02)


def test_a_tiny_run_prints_the_result_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(common, "ROOT", tmp_path)
    setup = aa.Setup(aa=4, ab=2, chats=60, batches=4, votes=4.0, seed=2, full_every=1, name="t")
    results = asyncio.run(aa.run(setup, example=False, base=str(tmp_path)))
    # every experiment ran the full variant_report twice, and it agreed with the fast path
    assert results["aa"]["full_report_checks"] == 8 and results["ab"]["full_report_checks"] == 4
    aa.report(results)
    lines = capsys.readouterr().out.splitlines()
    names = [line.split("=")[0] for line in lines if line.startswith("RESULT ")]
    assert names[:3] == [
        "RESULT aa_false_positive_rate",
        "RESULT aa_power",
        "RESULT aa_chats_to_decision",
    ]
    assert 0.0 <= results["aa"]["av_rate"] <= 1.0
