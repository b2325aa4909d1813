"""Loading the shared model: errors that say what to do, the optional int8 quantization, and the
first-start training that only a missing model brings in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bot.config import ConfigError, Settings
from bot.inference.batcher import Batcher
from bot.inference.cache import AgentCache
from bot.inference.model import load_shared_agent


async def test_int8_quantization_serves_replies(tiny_model_file: str, tmp_path: Path) -> None:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, data_dir=tmp_path, bot_model=tiny_model_file, quantize="int8"
    )
    agent = load_shared_agent(settings)
    quantized = [m for m in agent.model.modules() if "quantized" in type(m).__module__]
    assert quantized, "no linear layer was quantized"
    assert not any(type(m) is torch.nn.Linear for m in agent.model.modules())
    cache = AgentCache(agent, capacity=4)
    batcher = Batcher(agent, max_size=4, max_wait_ms=10)
    await batcher.start()
    try:
        entry = cache.rebuild(1, "I love dogs.", [])
        result = await batcher.generate(entry.clone, "hello how are you")
    finally:
        await batcher.close()
    assert result.text


def test_a_failed_first_start_training_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ensure_model relies on TrainingError, not on a status train_cli never returned."""
    import bot.training
    from bot.app import ensure_model

    def failing(*_: object, **__: object) -> int:
        raise bot.training.TrainingError("training the model into /x failed: disk full")

    monkeypatch.setattr(bot.training, "train_cli", failing)
    # as on an installed copy without the repository's shipped model
    monkeypatch.setattr("bot.config.SHIPPED_MODEL_FILE", tmp_path / "none" / "model")
    settings = Settings(_env_file=None, data_dir=tmp_path)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"disk full.*python -m bot train.*BOT_MODEL"):
        ensure_model(settings)


def test_ensure_model_with_a_model_in_place_never_imports_training(tiny_model_file: str) -> None:
    """The normal start: the offline pipeline stays unloaded (fresh process, fresh modules)."""
    code = (
        "import sys\n"
        "import bot.__main__, bot.app, bot.terminal, bot.inference.responder\n"
        "from bot.config import Settings\n"
        "from bot.app import ensure_model\n"
        f"ensure_model(Settings(_env_file=None, bot_model={tiny_model_file!r}))\n"
        "loaded = [m for m in sys.modules if m.startswith('bot.training')]\n"
        "assert not loaded, loaded\n"
    )
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
