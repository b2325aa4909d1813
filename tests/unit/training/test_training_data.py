"""`python -m bot train`'s data conversion and command-line semantics: no model, no process."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import bot.training as training
from bot.training import Example
from tests.support.tinymodel import TINY_RECIPE as TINY

CONVERSATION = [
    ["hi there", "how are you?"],
    ["I'm good. I just got back from a hike with my dog"],
    ["nice! where did you go"],
    ["my favourite trail by the lake. I go every sunday", "do you like hiking?"],
    ["not really, I'm more of a couch person | honestly\tha"],
]


# --- data conversion ----------------------------------------------------------------------


def test_examples_cover_both_speakers_with_short_context() -> None:
    recipe = replace(training.DEFAULT_RECIPE, persona_rate=0.0, context_turns=2)
    examples = training.make_examples(CONVERSATION, random.Random(0), recipe)
    # Every turn after the first is a label once, whichever speaker said it.
    assert [e.label for e in examples] == [
        "I'm good. I just got back from a hike with my dog",
        "nice! where did you go",
        "my favourite trail by the lake. I go every sunday. do you like hiking?",
        "not really, I'm more of a couch person | honestly\tha",
    ]
    # A speaker's consecutive messages join with a full stop where one was missing.
    assert examples[0].text == "hi there. how are you?"
    # At most `context_turns` previous turns, oldest first.
    assert examples[3].text.split("\n") == [
        "nice! where did you go",
        "my favourite trail by the lake. I go every sunday. do you like hiking?",
    ]


def test_persona_lines_come_from_the_replying_speaker_and_never_give_away_the_label() -> None:
    recipe = replace(training.DEFAULT_RECIPE, persona_rate=1.0, context_turns=1)
    # Short sentences ("I'm good.") and questions are no persona; speaker A discloses nothing.
    assert training.persona_candidates(CONVERSATION, 0) == []
    assert set(training.persona_candidates(CONVERSATION, 1)) == {
        "I just got back from a hike with my dog",
        "my favourite trail by the lake.",
        "I go every sunday",
    }
    for seed in range(20):
        for i, example in enumerate(
            training.make_examples(CONVERSATION, random.Random(seed), recipe)
        ):
            lines = example.text.split("\n")
            personas = [line for line in lines if line.startswith("your persona: ")]
            # Persona lines lead the context, like bot/inference/model_input.py pins them.
            assert lines[: len(personas)] == personas
            replier = (i + 1) % 2
            allowed = set(training.persona_candidates(CONVERSATION, replier))
            for line in personas:
                sentence = line.removeprefix("your persona: ")
                assert sentence in allowed
                assert sentence not in example.label


def test_parlai_reads_back_exactly_what_was_written() -> None:
    from parlai.utils.misc import str_to_msg

    example = Example("your persona: i like tea.\nhi | there\tyou", "fine\tthanks | you?")
    line = training.to_parlai_line(example)
    assert "\n" not in line
    message = str_to_msg(line)
    assert message["text"] == "your persona: i like tea.\nhi | there you"
    assert list(message["labels"]) == ["fine thanks | you?"]
    assert message["episode_done"] is True


def test_dataset_split_keeps_whole_conversations_apart(tmp_path: Path) -> None:
    conversations = [
        (str(n), [[f"hello number {n}"], [f"reply {n} one"], [f"more {n}"], [f"end {n}"]])
        for n in range(300)
    ]
    stats = training.write_dataset(tmp_path, conversations, replace(TINY, valid_share=0.1))
    train = (tmp_path / "chitchat_train.txt").read_text().splitlines()
    valid = (tmp_path / "chitchat_valid.txt").read_text().splitlines()
    assert (tmp_path / "chitchat_test.txt").read_text().splitlines() == valid
    assert (stats.train_examples, stats.valid_examples) == (len(train), len(valid))
    assert stats.conversations == TINY.max_conversations  # the slice is honoured

    def ids(lines: list[str]) -> set[str]:
        return {line.split("labels:")[1].split()[1] for line in lines}

    assert valid and train
    assert not ids(train) & ids(valid)


def test_real_dataset_converts(tmp_path: Path) -> None:
    """The installed chitchat-dataset package parses into examples (a slice, for speed)."""
    stats = training.write_dataset(
        tmp_path, training.load_conversations(), replace(TINY, max_conversations=200)
    )
    assert stats.conversations == 200
    assert stats.train_examples > 1000
    first = (tmp_path / "chitchat_train.txt").read_text().splitlines()[0]
    assert first.startswith("text:") and "\tlabels:" in first


# --- command-line semantics ---------------------------------------------------------------


def test_clamp_minutes() -> None:
    assert training.clamp_minutes(None, 12.0) == 12.0
    assert training.clamp_minutes(60.0, 12.0) == training.MAX_MINUTES
    assert training.clamp_minutes(0.0, 12.0) == 0.1
