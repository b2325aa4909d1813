"""Loading the shared model: a missing one is an error that says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import ConfigError, Settings
from bot.inference.model import load_shared_agent


def test_missing_model_says_how_to_get_one(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path, bot_model=str(tmp_path / "nope"))  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="python -m bot train"):
        load_shared_agent(settings)
