"""`python -m bot model check PATH` (issue 33.4), through the real command line: the model's
shape, the runtime path that serves it, parity with ParlAI's own agent, exit status 0; a model
that cannot be served exits 2 naming why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.engine.test_incomplete_models import copy_without

ROOT = Path(__file__).resolve().parents[2]


def _check(tmp_path: Path, path: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEGRAM_", "DATABASE_"))}
    env.pop("BOT_MODEL", None)
    env.update(PYTHONPATH=str(ROOT), DATA_DIR=str(tmp_path / "data"))
    return subprocess.run(
        [sys.executable, "-m", "bot", "model", "check", path, "--turns", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_model_check_prints_the_shape_the_runtime_path_and_parity(
    tiny_model_file: str, tmp_path: Path
) -> None:
    proc = _check(tmp_path, tiny_model_file)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    for expected in (
        f"model: {tiny_model_file}",
        "agent: transformer/generator (FastTransformerGeneratorAgent)",
        "parameters: ",
        "layers: 1 encoder, 1 decoder",
        "embedding size: 16",
        "dictionary: ",
        "lower-cased (dict_lower=True)",
        "context: text_truncate=64 label_truncate=12 n_positions=",
        "decoding: inference=beam beam_size=2",
        "search: our batched search (SEARCH_IMPL=fast; FastDecoder",
        "scheduler: continuous batching",
        "parity: equal (2 turns)",
        "ms per reply: ",
        "resident memory: ",
    ):
        assert expected in out, out
    assert "Traceback" not in proc.stderr


def test_model_check_compares_a_cased_model_through_its_own_cleaning(
    cased_model_file: str, tmp_path: Path
) -> None:
    """A cased byte-level BPE model (built like BlenderBot 400M-distill) is shown verbatim, so
    ParlAI's text must be compared verbatim too: compared through the lowercasing cleaning,
    every reply "differed" (found running the command on the 400M-distill shape of
    tests/support/shapes.py) though the tokens were ParlAI's."""
    proc = _check(tmp_path, cased_model_file)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "cased (dict_lower=False)" in proc.stdout
    assert "parity: equal (2 turns)" in proc.stdout, proc.stdout


def test_model_check_refuses_an_incomplete_model_with_status_2(
    tiny_model_file: str, tmp_path: Path
) -> None:
    weightless = copy_without(tiny_model_file, tmp_path / "cand", "")
    proc = _check(tmp_path, str(tmp_path / "cand"))  # the directory form
    assert proc.returncode == 2, proc.stdout + proc.stderr[-2000:]
    assert (
        f"error: the model at {weightless} is incomplete: missing {weightless} (the weights)"
        in (proc.stderr)
    )
    assert "Traceback" not in proc.stderr


def test_model_check_refuses_a_polyencoder_with_status_2(
    tiny_model_file: str, tmp_path: Path
) -> None:
    poly = copy_without(tiny_model_file, tmp_path / "poly")
    opt_file = Path(f"{poly}.opt")
    opt = json.loads(opt_file.read_text())
    opt["model"] = "transformer/polyencoder"
    opt_file.write_text(json.dumps(opt))
    proc = _check(tmp_path, poly)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-2000:]
    assert "its agent transformer/polyencoder is a retrieval ranker" in proc.stderr
    assert "Supported: TorchGeneratorAgent subclasses" in proc.stderr
    assert "Traceback" not in proc.stderr
