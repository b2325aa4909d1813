"""Persona text -> the `your persona:` lines the model sees."""

from __future__ import annotations

import pytest

from bot.persona import persona_lines


@pytest.mark.parametrize(
    ("persona", "lines"),
    [
        ("My name is Sarah. I love hiking.", ["My name is Sarah.", "I love hiking."]),
        ("line one\nline two!", ["line one", "line two!"]),
        # Pasted from ConvAI2 / BlenderBot data (issue 11, suspected): one prefix, not two.
        ("your persona: i like cats.", ["i like cats."]),
        (
            "your persona: i like cats.\nYour Persona:i have a dog. your persona: your persona: x",
            ["i like cats.", "i have a dog.", "x"],
        ),
        ("your persona:", []),
        ("  \n ", []),
        # Only a leading prefix is removed; the words elsewhere are the persona's own.
        ("I said your persona: nothing", ["I said your persona: nothing"]),
    ],
)
def test_persona_lines(persona: str, lines: list[str]) -> None:
    assert persona_lines(persona) == [f"your persona: {line}" for line in lines]
