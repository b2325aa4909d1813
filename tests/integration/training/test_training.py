"""`python -m bot train`: atomic install, and a real (very short) training run (the data
conversion is in tests/unit/training/test_training_data.py).

The training test goes through `train_cli`, the function behind `python -m bot train`, with a
tiny architecture and a slice of chitchat-dataset, then serves the result exactly like the
service does: `load_shared_agent`, a persona-pinned clone, one batched generation.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import bot.training as training
from bot.config import Settings
from bot.engine.protocol import Generated
from bot.inference.batcher import Batcher
from bot.training import TrainingError, cli
from tests.support.tinymodel import TINY_RECIPE as TINY


def _settings(tmp_path: Path, **kwargs: object) -> Settings:
    return Settings(data_dir=tmp_path / "data", model_device="cpu", **kwargs)  # type: ignore[arg-type]


# --- command-line semantics ---------------------------------------------------------------


def test_if_missing_skips_a_complete_model_and_retrains_a_partial_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []

    def fake_train(out: Path, **_: object) -> training.TrainResult:
        calls.append(out)
        # a complete model: its weights, its dictionary and (last) its options
        for suffix, content in (("", "x"), (".dict", "x"), (".opt", "{}")):
            Path(str(out) + suffix).write_text(content)
        return training.TrainResult(out, training.DataStats(), 0.0, 0.0)

    monkeypatch.setattr(cli, "train_model", fake_train)
    settings = _settings(tmp_path)
    model = settings.default_model_file
    model.parent.mkdir(parents=True)
    model.write_text("weights without .opt: a training that died while installing")

    assert training.train_cli(settings, minutes=None, if_missing=True, out=None) == 0
    assert calls == [model]
    assert training.train_cli(settings, minutes=None, if_missing=True, out=None) == 0
    assert calls == [model]  # complete now: nothing to do
    assert training.train_cli(settings, minutes=None, if_missing=False, out=None) == 0
    assert len(calls) == 2  # without --if-missing it always trains


def test_a_model_that_cannot_be_written_is_a_training_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = blocker / "model"
    with pytest.raises(TrainingError, match=f"training the model into {out} failed: "):
        training.train_cli(_settings(tmp_path), minutes=0.1, if_missing=False, out=str(out))


def test_python_m_bot_train_fails_with_one_clean_error_line(tmp_path: Path) -> None:
    """Regression: train_cli returned 0 on every path, so a failure was a traceback (or,
    through ensure_model, a status check that could never fire)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [sys.executable, "-m", "bot", "train", "--out", str(blocker / "model")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(root), "DATA_DIR": str(tmp_path / "data")},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(f"error: training the model into {blocker / 'model'} failed: ")
    assert f"{blocker}'" in errors[0]  # the reason names what is in the way


# --- a real training run ------------------------------------------------------------------


def test_train_then_serve_with_a_persona(tmp_path: Path) -> None:
    from bot.inference.model import load_shared_agent

    out = tmp_path / "models" / "model"
    stale = out.parent / ".model.train-killed"  # what a run killed by SIGKILL leaves
    stale.mkdir(parents=True)
    settings = _settings(tmp_path)
    status = training.train_cli(settings, minutes=0.5, if_missing=False, out=str(out), recipe=TINY)
    assert status == 0

    # Installed complete, nothing of the temporary training directory left behind.
    assert training.model_exists(out)
    assert Path(str(out) + ".dict").is_file() and Path(str(out) + ".dict.codecs").is_file()
    assert not list(out.parent.glob(".model.train-*"))  # neither ours nor the stale one
    opt = json.loads(Path(str(out) + ".opt").read_text())
    assert opt["dict_file"] == str(out.resolve()) + ".dict"
    assert (opt["inference"], opt["beam_size"], opt["beam_block_ngram"]) == ("delayedbeam", 2, 3)
    assert opt["skip_generation"] is False
    stats = json.loads(Path(str(out) + ".trainstats").read_text())
    assert stats["train_steps"] > 0
    assert stats["final_valid_report"]["ppl"] > 1

    agent = load_shared_agent(_settings(tmp_path, bot_model=str(out)))
    from parlai.agents.transformer.transformer import TransformerGeneratorAgent

    assert isinstance(agent, TransformerGeneratorAgent)
    result = asyncio.run(_reply(agent, "I love hiking. My dog is called Rex.", "hi! how are you?"))
    assert result.text.strip()
    # The persona was part of what the model read, at the head of its input.
    persona = agent.dict.txt2vec("your persona: i love hiking.")
    assert result.model_input[: len(persona)] == persona


async def _reply(agent: object, persona: str, text: str) -> Generated:
    """One reply the way the engine produces it: a persona-pinned clone, a batched generation."""
    from bot.inference.cache import new_clone

    batcher = Batcher(agent, max_size=4, max_wait_ms=5)
    await batcher.start()
    try:
        return await batcher.generate(new_clone(agent, persona), text)
    finally:
        await batcher.close()


def test_a_second_run_reuses_the_data_and_the_dictionary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """The set-up (dataset conversion, BPE dictionary) is done once per recipe and data
    version; without a terminal no progress bar writes carriage returns."""
    import logging

    settings = _settings(tmp_path)
    with caplog.at_level(logging.INFO, logger="bot.training"):
        for name in ("one", "two"):
            out = tmp_path / name / "model"
            training.train_cli(settings, minutes=0.2, if_missing=False, out=str(out), recipe=TINY)
    first, second = (
        [r.getMessage() for r in caplog.records if r.getMessage().startswith(what)]
        for what in ("data from the cache", "BPE dictionary from the cache")
    )
    assert len(first) == 1 and len(second) == 1  # the second run only
    one, two = (Path(tmp_path / n / "model.dict").read_text() for n in ("one", "two"))
    assert one == two
    assert "\r" not in capfd.readouterr().err
