"""How a persona and a conversation's turns become the model's text: pure text, no ParlAI.

Each persona sentence is a `your persona: ...` line, the way ParlAI's persona models (BlenderBot,
ConvAI2) were trained; consecutive messages of one role are one turn. Shared by the model
process (bot/inference/model_input.py's history), /context, the training data and exports.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PERSONA_PREFIX = "your persona: "
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# Personas pasted from ConvAI2/BlenderBot data already carry the prefix.
_GIVEN_PREFIX = re.compile(r"^(?:your persona\s*:\s*)+", re.IGNORECASE)


def persona_lines(persona: str) -> list[str]:
    """Split free text into `your persona: ...` lines, one per sentence or line.

    A sentence that already starts with "your persona:" (pasted from ParlAI data) keeps one
    prefix, not two.
    """
    lines: list[str] = []
    for raw_line in persona.splitlines():
        for sentence in _SENTENCE_END.split(raw_line.strip()):
            sentence = _GIVEN_PREFIX.sub("", sentence.strip()).strip()
            if sentence:
                lines.append(PERSONA_PREFIX + sentence)
    return lines


def join_turns(messages: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Merge consecutive messages of one role (the model cannot take two user turns in a row)."""
    out: list[tuple[str, str]] = []
    for role, text in messages:
        if out and out[-1][0] == role:
            out[-1] = (role, out[-1][1] + "\n" + text)
        else:
            out.append((role, text))
    return out
