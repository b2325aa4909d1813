"""chitchat-dataset conversations -> examples in ParlAI's dialog text format ("fromfile")."""

from __future__ import annotations

import random
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.training.recipe import DEFAULT_RECIPE, Recipe

_SPACES = re.compile(r"\s+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# Sentences that read like self-disclosure ("i love hiking", "my dog is ...") make good personas.
_FIRST_PERSON = re.compile(r"^(i|i'm|im|i've|ive|my|i am)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Example:
    """One training example: the model sees `text` and should answer `label`."""

    text: str
    label: str


@dataclass
class DataStats:
    """What the conversion produced."""

    conversations: int = 0
    train_examples: int = 0
    valid_examples: int = 0
    with_persona: int = 0


def clean(text: str) -> str:
    """One line of text: whitespace collapsed, tabs and newlines gone."""
    return _SPACES.sub(" ", text).strip()


def _join(messages: Iterable[str]) -> str:
    """One turn from a speaker's consecutive messages, a full stop where a message had none."""
    parts: list[str] = []
    for message in messages:
        if parts and not parts[-1].endswith((".", "!", "?", ",", ":", ";")):
            parts[-1] += "."
        parts.append(message)
    return " ".join(parts)


def conversation_turns(conversation: Mapping[str, Any]) -> list[list[str]]:
    """The turns of one chitchat-dataset conversation, each a list of cleaned messages."""
    turns: list[list[str]] = []
    for turn in conversation.get("messages", []):
        messages = [clean(str(m.get("text", ""))) for m in turn]
        messages = [m for m in messages if m]
        if messages:
            turns.append(messages)
    return turns


def persona_candidates(turns: Sequence[Sequence[str]], speaker: int) -> list[str]:
    """First-person sentences one speaker (0 or 1) says in a conversation."""
    out: list[str] = []
    for turn in turns[speaker::2]:
        for message in turn:
            for sentence in _SENTENCE_END.split(message):
                words = sentence.split()
                if 3 <= len(words) <= 15 and _FIRST_PERSON.match(sentence):
                    out.append(sentence)
    return out


def make_examples(
    turns: Sequence[Sequence[str]], rng: random.Random, recipe: Recipe = DEFAULT_RECIPE
) -> list[Example]:
    """Examples from one conversation: each turn after the first is a label, for both speakers.

    With probability `recipe.persona_rate` the context starts with one or two `your persona:`
    lines taken from the replying speaker's own first-person sentences elsewhere in the
    conversation (never from the label itself), the shape bot/inference/model_input.py gives
    the input.
    """
    from bot.persona import PERSONA_PREFIX

    texts = [_join(turn) for turn in turns]
    personas = [persona_candidates(turns, 0), persona_candidates(turns, 1)]
    out: list[Example] = []
    for i in range(1, len(texts)):
        label = texts[i]
        if len(label.split()) > recipe.max_label_words:
            continue  # long monologues teach rambling and get truncated anyway
        context = texts[max(0, i - recipe.context_turns) : i]
        if recipe.persona_rate and rng.random() < recipe.persona_rate:
            pool = [s for s in personas[i % 2] if s not in label]
            if pool:
                picked = rng.sample(pool, k=min(len(pool), rng.choice((1, 2))))
                context = [PERSONA_PREFIX + s for s in picked] + context
        out.append(Example("\n".join(context), label))
    return out


def to_parlai_line(example: Example) -> str:
    """One line of ParlAI's dialog text format (read by the `fromfile` teacher)."""

    def escape(value: str) -> str:
        # str_to_msg splits on tabs and on `|` in labels; newlines are written as `\n`.
        return value.replace("\t", " ").replace("\n", "\\n").replace("|", "__PIPE__")

    return f"text:{escape(example.text)}\tlabels:{escape(example.label)}\tepisode_done:True"


def load_conversations() -> Iterator[tuple[str, list[list[str]]]]:
    """(id, turns) of every chitchat-dataset conversation, in the package's stable order."""
    import chitchat_dataset

    for key, conversation in chitchat_dataset.Dataset().items():
        turns = conversation_turns(conversation)
        if len(turns) >= 2:
            yield str(key), turns


def write_dataset(
    directory: Path,
    conversations: Iterable[tuple[str, list[list[str]]]],
    recipe: Recipe = DEFAULT_RECIPE,
    extra: Callable[[Sequence[Sequence[str]]], list[Example]] | None = None,
) -> DataStats:
    """Write `chitchat_{train,valid,test}.txt`; held-out conversations form valid (= test).

    `extra` (stage 2 of the shipped recipe, bot/training/persona_data.py) adds more training
    examples per training conversation; it draws from its own random generator, so the split
    and the recipe's own examples stay exactly those of a run without it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(recipe.seed)
    stats = DataStats()
    train: list[str] = []
    valid: list[str] = []
    for _key, turns in conversations:
        if recipe.max_conversations is not None and stats.conversations >= recipe.max_conversations:
            break
        stats.conversations += 1
        examples = make_examples(turns, rng, recipe)
        stats.with_persona += sum(e.text.startswith("your persona:") for e in examples)
        # Split by conversation, so validation never sees a conversation it trained on.
        target = valid if rng.random() < recipe.valid_share else train
        target.extend(to_parlai_line(e) for e in examples)
        if extra is not None and target is train:
            train.extend(to_parlai_line(e) for e in extra(turns))
    if not valid:  # tiny slices (tests): hold out at least something
        valid, train = train[-max(1, len(train) // 20) :], train[: -max(1, len(train) // 20)]
    stats.train_examples, stats.valid_examples = len(train), len(valid)
    base = directory / "chitchat"
    (directory / "chitchat_train.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    (directory / "chitchat_valid.txt").write_text("\n".join(valid) + "\n", encoding="utf-8")
    # TrainLoop's final report also evaluates "test"; it is the same held-out slice.
    shutil.copyfile(directory / "chitchat_valid.txt", str(base) + "_test.txt")
    return stats
