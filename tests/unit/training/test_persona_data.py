"""Stage 2 of the shipped recipe: its examples teach persona use, in the service's input shape,
and its arguments continue stage 1. No model, no process."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bot.persona import PERSONA_PREFIX, persona_lines
from bot.training import persona_data as pd
from bot.training.args import parlai_args
from bot.training.data import write_dataset
from bot.training.recipe import DEFAULT_RECIPE
from bot.training.ship import persona_args, render

CONVERSATIONS = [
    (
        str(i),
        [
            ["hi there", "how are you?"],
            ["I'm good. I just got back from a hike with my dog"],
            ["nice! where did you go"],
            ["my favourite trail by the lake. I go every sunday", "do you like hiking?"],
            [f"not really, I'm more of a couch person {i}"],
        ],
    )
    for i in range(40)
]


def test_a_question_answer_turn_states_the_asked_fact_in_the_service_shape() -> None:
    rng = random.Random(0)
    for _ in range(200):
        example, kind, value = pd.qa_turn(rng)
        lines = example.text.split("\n")
        persona = [line for line in lines if line.startswith(PERSONA_PREFIX)]
        assert 1 <= len(persona) <= 4 and lines[: len(persona)] == persona  # at the head
        # The persona lines are what the service makes of the same sentences.
        sentences = " ".join(line.removeprefix(PERSONA_PREFIX) for line in persona)
        assert persona_lines(sentences) == persona
        assert lines[-1] in pd.QUESTION_TEMPLATES[kind]
        assert value in example.label and value in "\n".join(persona), example


def test_a_grounded_example_restates_its_persona_line() -> None:
    turns = CONVERSATIONS[0][1]
    examples = pd.grounded_examples(turns, random.Random(0), rate=1.0)
    assert examples
    for example in examples:
        persona = [
            line.removeprefix(PERSONA_PREFIX)
            for line in example.text.split("\n")
            if line.startswith(PERSONA_PREFIX)
        ]
        assert any(sentence in example.label for sentence in persona)


def test_persona_chitchat_keeps_the_label_and_cuts_long_dialogue() -> None:
    example = pd.Example(" ".join(["word"] * 200), "the label")
    out = pd.persona_chitchat(example, random.Random(0))
    assert out.label == "the label"
    assert out.text.startswith(PERSONA_PREFIX)
    assert out.text.split("\n")[-1] == " ".join(["word"] * pd.DIALOGUE_WORDS)
    assert pd.tail_words("a b c\nd e f", 4) == "c\nd e f"


def test_stage_two_keeps_stage_ones_split_and_adds_persona_examples(tmp_path: Path) -> None:
    recipe = DEFAULT_RECIPE
    persona = pd.PersonaRecipe(qa_examples=50, grounded_rate=1.0, persona_chitchat_rate=0.5)
    write_dataset(tmp_path / "one", CONVERSATIONS, recipe)
    stats = pd.write_persona_dataset(tmp_path / "two", CONVERSATIONS, persona, recipe)
    one, two = tmp_path / "one", tmp_path / "two"
    assert (one / "chitchat_valid.txt").read_text() == (two / "chitchat_valid.txt").read_text()
    first = (one / "chitchat_train.txt").read_text().splitlines()
    second = (two / "chitchat_train.txt").read_text().splitlines()
    assert set(first) <= set(second)  # stage 1's examples, all of them
    assert stats.qa == 50 and stats.grounded > 0 and stats.persona_chitchat > 0
    assert len(second) == stats.chitchat + stats.grounded + stats.persona_chitchat + stats.qa
    assert stats.chitchat == len(first)


def test_stage_two_continues_stage_one() -> None:
    persona = pd.PersonaRecipe(learning_rate=5e-4, warmup_updates=30, seed=3)
    args = persona_args(Path("/s1/model"), Path("/d"), Path("/m/model"), 600.0, persona)
    base = parlai_args(DEFAULT_RECIPE, Path("/d"), Path("/m/model"), 600.0)

    def value(flags: list[str], flag: str) -> str:
        return flags[flags.index(flag) + 1]

    assert value(args, "--init-model") == "/s1/model"
    assert value(args, "--learningrate") == "0.0005"
    assert value(args, "--warmup-updates") == "30"
    assert value(args, "--seed") == "3"
    # Its own decoding: no context blocking, more sampled tokens before the beam.
    assert value(args, "--beam-context-block-ngram") == "-1"
    assert value(args, "--beam-delay") == str(persona.beam_delay) != value(base, "--beam-delay")
    # The architecture and dictionary are stage 1's, or its weights would not load.
    for flag in ("--embedding-size", "--n-encoder-layers", "--dict-maxtokens", "--dict-lower"):
        assert value(args, flag) == value(base, flag)


def test_the_recipe_page_names_both_stages() -> None:
    persona = pd.PersonaRecipe()
    recipe = {
        "data": "chitchat-dataset==0.9.0",
        "parlai": "1.7.2",
        "torch": "2",
        "seed": 42,
        "recipe": DEFAULT_RECIPE.__dict__,
        "parlai_args": ["--a"],
        "minutes": 100.0,
        "machine": "m",
        "stage1": {"heldout": {"ppl": 54.7}},
        "stage2": {
            "recipe": persona.__dict__,
            "data": {"chitchat": 1, "grounded": 2, "persona_chitchat": 3, "qa": 4, "valid": 5},
            "steps": 10,
            "examples_seen": 160,
            "parlai_args": ["--init-model", "<stage1>"],
        },
        "heldout": {"ppl": 55.0, "loss": 4.0, "token_acc": 0.26, "examples": 500},
        "size_bytes": 8_000_000,
        "samples": [{"prompt": "hi", "reply": "hello"}],
        "persona_samples": [{"persona": "My name is Sarah.", "prompt": "name?", "reply": "sarah"}],
    }
    page = render(recipe)
    assert "145 minutes" in page and "--from-stage1" in page
    assert "**persona:** My name is Sarah." in page and "stage 1: 54.7" in page
    assert "--init-model <stage1>" in page


def test_the_stage_two_flags_go_with_ship(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bot.__main__ import main

    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    assert main(["train", "--from-stage1", str(tmp_path / "model")]) == 2
    assert "--from-stage1 goes with --ship" in capsys.readouterr().err
    assert main(["train", "--stage1-only"]) == 2
    assert "--stage1-only goes with --ship" in capsys.readouterr().err
    assert main(["train", "--ship", "--stage1-only", "--from-stage1", "M"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_made_up_values_never_use_a_probe_word() -> None:
    """The probe set stays out of the training data: its words are not made-up values."""
    banned = pd.probe_words()
    assert {"sarah", "reykjavik", "paella"} <= banned
    talk = [("c", [["sarah went to reykjavik", "sarah ate paella in reykjavik"], ["paella!"]])]
    words = pd.corpus_words(talk * 2, banned)
    assert words == ["ate", "went"]
    values = pd.Values(words, made_up_rate=1.0, exclude=banned)
    rng = random.Random(0)
    drawn = [values.draw(kind, rng) for _ in range(500) for kind in pd.KINDS]
    assert not {w for v in drawn for w in v.split()} & banned
    assert len(set(drawn)) > 1000  # a large space: copying, not recall, lowers the loss


def test_made_up_values_need_no_corpus() -> None:
    """A tiny corpus with no word used twice still gives values (random letters)."""
    value = pd.made_up("name", random.Random(0), words=[])
    assert value.strip() and value.replace(" ", "").isalpha()
