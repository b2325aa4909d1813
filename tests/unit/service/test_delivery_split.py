"""Splitting a reply into Telegram messages: at most 4096 UTF-16 units each, nothing lost."""

from __future__ import annotations

import pytest

from bot.service.delivery import MAX_MESSAGE_UTF16, split_message, utf16_len


@pytest.mark.parametrize(
    "text",
    [
        "short",
        "word " * 2000,
        "😀" * 3000,  # 2 UTF-16 units each: 6000 units in 3000 characters
        "line\n" * 1500 + "x" * 5000,
        "a" * 10_000,  # no boundary at all
        "😀a" * 2000 + "b😀" * 2000,
    ],
)
def test_split_message_respects_utf16_limit_and_loses_nothing(text: str) -> None:
    parts = split_message(text)
    assert all(0 < utf16_len(p) <= MAX_MESSAGE_UTF16 for p in parts)
    assert "".join("".join(p.split()) for p in parts) == "".join(text.split())
    assert split_message(text) == parts  # deterministic: parts_sent means the same later
    if utf16_len(text.strip()) <= MAX_MESSAGE_UTF16:
        assert parts == [text.strip()]


def test_split_message_never_sends_empty_text() -> None:
    assert split_message("  \n ") == ["…"]
