"""Model workers map their weights from the model file (torch.load(mmap=True)), so variants of
one file share one copy in the page cache; the replies do not change."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bot.config import Settings
from bot.inference.batcher import chat_reply
from bot.inference.cache import new_clone
from bot.inference.model import load_shared_agent


def _mapped_ranges(path: str) -> list[tuple[int, int]]:
    """Address ranges of this process mapped from `path` (/proc/self/maps)."""
    real = os.path.realpath(path)
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == real:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def _in_file(agent: Any, model_file: str) -> list[bool]:
    ranges = _mapped_ranges(model_file)
    return [
        any(start <= p.data_ptr() < end for start, end in ranges) for p in agent.model.parameters()
    ]


def _reply(agent: Any, text: str) -> str:
    from parlai.core.message import Message

    clone = new_clone(agent, "my name is sarah .")
    clone.observe(Message({"text": text, "episode_done": False}))
    return chat_reply(str(agent.batch_act([clone.observation])[0]["text"]))


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc")
def test_shared_weights_live_in_the_file_mapping_and_answer_the_same(
    tiny_model_file: str, tmp_path: Path
) -> None:
    settings = Settings(_env_file=None, bot_model=tiny_model_file, data_dir=tmp_path)  # type: ignore[call-arg]
    mapped = load_shared_agent(settings, share_weights=True)
    private = load_shared_agent(settings)
    assert all(_in_file(mapped, tiny_model_file))
    assert not any(_in_file(private, tiny_model_file))
    for text in ("hello how are you", "what do you like to do"):
        assert _reply(mapped, text) == _reply(private, text)
