"""Loading the shared model: errors that say what to do, and the optional int8 quantization."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bot.config import ConfigError, Settings
from bot.inference.batcher import Batcher
from bot.inference.cache import AgentCache
from bot.inference.model import load_shared_agent


def test_missing_model_says_how_to_get_one(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path, bot_model=str(tmp_path / "nope"))  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="python -m bot train"):
        load_shared_agent(settings)


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
