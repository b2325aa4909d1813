"""ENCODER_BUCKETS (bot/inference/fastgen/beam.encode): a micro-batch's encoder over buckets of
contexts of similar length instead of one batch padded to the longest.

Not bit-identical to ParlAI's search on the padded batch (matrix products run on other row
counts), so it is opt-in; measured here: on random batches of mixed context lengths, at least
99% of chats get ParlAI's reply and score to within 1e-4, and the bucketed path really ran.
The default (off) keeps ParlAI's one padded encoder batch, which test_fastgen.py checks bit for
bit.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from bot.inference.fastgen import beam
from tests.integration.inference.test_fastgen import (
    _settings,
    random_case,
    run_search,
    torch_threads,
)


@pytest.fixture(scope="module")
def agent(tiny_model_file: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from bot.inference.model import load_shared_agent

    path = tmp_path_factory.mktemp("buckets")
    return load_shared_agent(_settings(tiny_model_file, path, encoder_buckets=True))


def test_the_setting_reaches_the_agent_and_defaults_off(agent: Any, tiny_model_file: str) -> None:
    from pathlib import Path

    assert agent.encoder_buckets is True
    assert _settings(tiny_model_file, Path("/tmp")).encoder_buckets is False


def test_bucketed_encoder_agrees_with_parlai(agent: Any, monkeypatch: pytest.MonkeyPatch) -> None:

    calls = {"batches": 0, "bucketed": 0}
    real = agent.model.encoder.forward

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls["batches"] += 1
        return real(*args, **kwargs)

    encode = beam.encode

    def watching(agent_: Any, model: Any, batch: Any) -> Any:
        before = calls["batches"]
        out = encode(agent_, model, batch)
        calls["bucketed"] += calls["batches"] - before > 1
        return out

    monkeypatch.setattr(agent.model.encoder, "forward", counting)
    monkeypatch.setattr(beam, "encode", watching)
    rng = random.Random(24)
    words = [agent.dict.ind2tok[i] for i in range(4, len(agent.dict))]
    chats = same = 0
    gaps: list[float] = []
    with torch_threads(1):
        for _ in range(120):
            case = random_case(rng, words, rng.choice([1, 2, 5, 10]), rng.random() < 0.5)
            ref, _, batch = run_search(agent, case, fast=False)
            got, _, _ = run_search(agent, case, batch=batch)
            for r, g in zip(ref, got, strict=True):
                chats += 1
                if r[0].tolist() == g[0].tolist():
                    same += 1
                    gaps.append(abs(r[1].item() - g[1].item()))
    print(f"\n{chats} chats, {same} same reply ({100 * same / chats:.2f}%), {calls}")
    assert calls["bucketed"] >= 20, calls  # mixed lengths really were bucketed
    assert same >= 0.99 * chats
    assert max(gaps) <= 1e-4
