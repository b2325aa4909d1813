"""bench.loop's simulated users and its variants files, without running the loop (that is
`make bench-loop`, minutes long)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from bench import loop
from bot.config import ConfigError, Settings
from bot.engine.variants import load_experiment


def test_the_simulated_preference_is_a_question_back() -> None:
    assert loop.likes("i love dogs. do you have one?")
    assert not loop.likes("i love dogs.")


def test_votes_press_the_buttons_the_bot_sent() -> None:
    markup = {"inline_keyboard": [[{"text": "👍", "callback_data": "v:42:1"},
                                   {"text": "👎", "callback_data": "v:42:-1"}]]}  # fmt: skip
    assert loop.vote_data(markup, 1) == "v:42:1"
    assert loop.vote_data(markup, -1) == "v:42:-1"
    assert loop.vote_data(None, 1) is None


def test_the_comparison_file_is_a_valid_experiment(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    model = str(loop.SHIPPED)
    loop.variants_file(path, {loop.CONTROL: model, loop.CANDIDATE: model})
    settings = Settings(_env_file=None, variants_file=str(path), data_dir=tmp_path)  # type: ignore[call-arg]
    experiment = load_experiment(settings)
    assert list(experiment.names) == [loop.CONTROL, loop.CANDIDATE]
    assert experiment.get(loop.CONTROL).control  # type: ignore[union-attr]


def test_thompson_is_written_and_refused_clearly_where_unknown(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    model = str(loop.SHIPPED)
    loop.variants_file(path, {loop.CONTROL: model, loop.CANDIDATE: model}, "thompson")
    assert tomllib.loads(path.read_text())["allocation"] == "thompson"
    settings = Settings(_env_file=None, variants_file=str(path), data_dir=tmp_path)  # type: ignore[call-arg]
    try:
        load_experiment(settings)
    except ConfigError as err:  # before the Thompson allocation is merged
        assert "allocation" in str(err)
        with pytest.raises(SystemExit, match='refuses allocation = "thompson"'):
            loop.check_allocation(tmp_path, "thompson", model)
