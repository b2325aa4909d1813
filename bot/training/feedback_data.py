"""The export `train --from-feedback` reads, and the data files it trains and measures on.

`read_feedback` reads an `admin export --format parlai` (or `parlai-jsonl`) file. A reply is
*liked* when it has more 👍 than 👎, won an /arena duel, or belongs to a conversation rated 4-5
without having more 👎 than 👍; it is *disliked* when it has more 👎 than 👍; a flagged or
deflected reply (bot.safety) is left out, and so is one nobody liked or disliked. Each reply
keeps the context the model read for it: the persona lines, then the newest turns.

Held out: about a tenth of the conversations (chosen by the seed), never trained on; the
episodes of one conversation (its persona changed) are held out together.

One user's influence is capped: at most `max_per_chat` liked and as many disliked examples per
chat (the export's `chat`; a conversation stands in for its chat in exports made before it had
one), drawn by the seed. The chat is the unit because the export has no voter ids, and a chat
is what the experiments randomise (bot.reports.variants); in a private chat it is the one user.

`write_examples` and `sample_base_data` write the ParlAI files the fine-tune reads
(bot.training.feedback): a disliked reply carries `reward:-1` (bot.training.unlikelihood).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PERSONA_PREFIX = "your persona:"
UNSAFE = ("flagged", "deflected")  # bot.safety.SafetyMark: not the model's clean reply
NEGATIVES = ("unlikelihood", "none")  # --negatives
# At most this many liked, and this many disliked, examples per chat (the per-user cap).
MAX_PER_CHAT = 20


class FeedbackInputError(Exception):
    """The export or the base model cannot be used; the message says why (exit status 2)."""


@dataclass(frozen=True)
class FeedbackRecipe:
    """The knobs of a fine-tune."""

    # lr x updates sets how far the candidate moves from the base: on bench.loop's quick
    # export, 1e-3 for a minute (about 100 updates) left 42% of its replies distinct against the
    # base's 95%; 3e-5 for 33 updates kept 88% with 72% asking a question back (the base: 43%).
    learning_rate: float = 3e-5
    batch_size: int = 16
    warmup_updates: int = 20
    context_lines: int = 6  # newest lines of the conversation kept after the persona
    heldout_share: float = 0.1  # of the conversations
    validation_max_exs: int = 200
    base_valid_examples: int = 200  # of the chitchat-dataset held-out split
    seed: int = 42
    negatives: str = "unlikelihood"  # or "none": see the module docstring
    unlikelihood_alpha: float = 0.3  # weight of the disliked replies' unlikelihood term
    max_per_chat: int = MAX_PER_CHAT  # liked, and disliked, examples kept per chat
    min_distinct_ratio: float = 0.9  # the collapse guard (0 turns it off)
    # Examples of the base's own training data (chitchat-dataset's train split) mixed in per
    # liked example, with likelihood: they keep the model answering each context its own way.
    base_mix: float = 1.0
    max_steps: int = 30  # updates at most (<= 0: as many as the minutes allow)


DEFAULT_FEEDBACK_RECIPE = FeedbackRecipe()


@dataclass
class FeedbackExample:
    """One reply with its context, and why it is or is not trained on."""

    session: str
    text: str
    label: str
    liked_by: list[str]  # "vote_up", "arena_won", "rating_4_5"
    disliked: bool
    unsafe: bool
    chat: str = ""  # the export's chat number ("session:ID" where the export has none)


@dataclass
class FeedbackData:
    """The export, read and split."""

    episodes: int = 0
    conversations: int = 0  # a conversation whose persona changed is several episodes
    examples: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, int] = field(default_factory=dict)
    chats: int = 0
    capped: dict[str, int] = field(default_factory=dict)  # examples dropped by the per-chat cap
    train: list[FeedbackExample] = field(default_factory=list)
    heldout: list[FeedbackExample] = field(default_factory=list)
    negatives: list[FeedbackExample] = field(default_factory=list)  # disliked, trained away from
    heldout_disliked: list[FeedbackExample] = field(default_factory=list)


# (example, held out?) per chat, before the per-chat cap
Pile = dict[str, list[tuple[FeedbackExample, bool]]]


def _int(msg: dict[str, Any], key: str) -> int:
    try:
        return int(msg.get(key) or 0)
    except (TypeError, ValueError):
        return 0


def _episodes(path: Path) -> Iterator[list[dict[str, Any]]]:
    """The export's episodes as lists of ParlAI messages (both export formats)."""
    from parlai.utils.misc import str_to_msg

    with open(path, encoding="utf-8") as fh:
        episode: list[dict[str, Any]] = []
        for number, raw in enumerate(fh, 1):
            line = raw.rstrip("\n")
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                try:
                    record = json.loads(line)
                    dialog = record["dialog"][0]
                except (ValueError, KeyError, IndexError, TypeError) as err:
                    raise FeedbackInputError(
                        f"{path}:{number} is not an `admin export` episode: {err}"
                    ) from err
                msgs = []
                for user, bot in zip(dialog[0::2], dialog[1::2], strict=False):
                    fields = {k: v for k, v in bot.items() if k not in ("id", "text")}
                    msgs.append({**fields, "text": user["text"], "labels": [bot["text"]]})
                if msgs:
                    yield msgs
                continue
            msg = dict(str_to_msg(line))
            if "text" not in msg or not msg.get("labels"):
                raise FeedbackInputError(
                    f"{path}:{number} is not a ParlAI example (text:...<TAB>labels:...): "
                    "make it with `python -m bot admin export --format parlai`"
                )
            episode.append(msg)
            if msg["episode_done"]:
                yield episode
                episode = []
        if episode:
            yield episode


def _context(persona: list[str], lines: list[str], keep: int) -> str:
    return "\n".join([*persona, *lines[-keep:]])


def _liked_by(msg: dict[str, Any], up: int, down: int) -> list[str]:
    """Why a reply counts as liked: "vote_up", "arena_won", "rating_4_5" (none: not liked)."""
    return [
        source
        for source, hit in (
            ("vote_up", up > down),
            ("arena_won", msg.get("arena") == "won"),
            ("rating_4_5", _int(msg, "rating") >= 4 and down <= up),
        )
        if hit
    ]


def _episode_examples(
    episode: list[dict[str, Any]], session: str, keep: int
) -> Iterator[FeedbackExample]:
    """Each reply of an episode with its context: the persona, then the `keep` newest lines."""
    chat = str(episode[0].get("chat") or f"session:{session}")
    persona: list[str] = []
    lines: list[str] = []
    for i, msg in enumerate(episode):
        text_lines = str(msg["text"]).split("\n")
        if i == 0:
            persona = [t for t in text_lines if t.startswith(PERSONA_PREFIX)]
            text_lines = [t for t in text_lines if not t.startswith(PERSONA_PREFIX)]
        lines.extend(text_lines)
        label = str(msg["labels"][0])
        up, down = _int(msg, "votes_up"), _int(msg, "votes_down")
        ex = FeedbackExample(
            session,
            _context(persona, lines, keep),
            label,
            _liked_by(msg, up, down),
            disliked=down > up,
            unsafe=msg.get("safety") in UNSAFE,
            chat=chat,
        )
        lines.extend(label.split("\n"))
        yield ex


def read_feedback(path: Path, recipe: FeedbackRecipe = DEFAULT_FEEDBACK_RECIPE) -> FeedbackData:
    """Read an export: liked replies to train on and to hold out, the rest counted."""
    if not path.is_file():
        raise FeedbackInputError(f"no export at {path}: make one with `python -m bot admin "
                                 "export --format parlai -o FILE`")  # fmt: skip
    if recipe.negatives not in NEGATIVES:
        raise FeedbackInputError(
            f"--negatives {recipe.negatives!r}: choose one of {', '.join(NEGATIVES)}"
        )
    data = FeedbackData()
    data.by_source = {"vote_up": 0, "arena_won": 0, "rating_4_5": 0}
    data.left_out = {"disliked": 0, "neutral": 0, "unsafe": 0}
    liked, disliked = _sort_examples(path, recipe, data)
    _keep_capped(data, liked, disliked, recipe)
    _check_enough(path, data)
    return data


def _sort_examples(path: Path, recipe: FeedbackRecipe, data: FeedbackData) -> tuple[Pile, Pile]:
    """The export's liked and disliked examples per chat, each with whether it is held out;
    the rest counted in `data`."""
    rng = random.Random(recipe.seed)
    liked: Pile = {}
    disliked: Pile = {}
    # A conversation whose persona changed is several episodes (bot.admin.export): they are
    # held out together, or the later ones would hand the held-out turns to training.
    held: dict[str, bool] = {}
    for number, episode in enumerate(_episodes(path)):
        data.episodes += 1
        session = str(episode[0].get("session_id", number))
        if session not in held:
            held[session] = rng.random() < recipe.heldout_share
        heldout = held[session]
        data.conversations = len(held)
        for ex in _episode_examples(episode, session, recipe.context_lines):
            data.examples += 1
            if ex.unsafe:
                data.left_out["unsafe"] += 1
            elif ex.disliked:
                disliked.setdefault(ex.chat, []).append((ex, heldout))
            elif not ex.liked_by:
                data.left_out["neutral"] += 1
            else:
                liked.setdefault(ex.chat, []).append((ex, heldout))
    return liked, disliked


def _keep_capped(data: FeedbackData, liked: Pile, disliked: Pile, recipe: FeedbackRecipe) -> None:
    """Into `data`: what the per-chat cap keeps, liked to train on or hold out, disliked to
    train away from (or leave out, with --negatives none) or hold out."""
    data.chats = len(set(liked) | set(disliked))
    cap_rng = random.Random(recipe.seed + 1)
    data.capped = {"liked": 0, "disliked": 0}
    for ex, heldout in _capped(liked, recipe.max_per_chat, cap_rng, data.capped, "liked"):
        for source in ex.liked_by:
            data.by_source[source] += 1
        (data.heldout if heldout else data.train).append(ex)
    for ex, heldout in _capped(disliked, recipe.max_per_chat, cap_rng, data.capped, "disliked"):
        if heldout:
            data.heldout_disliked.append(ex)
        if heldout or recipe.negatives == "none":
            data.left_out["disliked"] += 1  # not trained on
        else:
            data.negatives.append(ex)


def _check_enough(path: Path, data: FeedbackData) -> None:
    """FeedbackInputError without a liked reply; at least one example trained on and one
    held out otherwise."""
    if data.examples == 0:
        raise FeedbackInputError(f"{path} has no exported replies: nothing to learn from")
    if not data.train and not data.heldout:
        raise FeedbackInputError(
            f"{path} has {data.examples} replies but none that users liked (👍, an arena win, "
            "a conversation rated 4-5): nothing to learn from"
        )
    if not data.heldout:  # too few conversations for a tenth: hold out the last liked one
        data.heldout.append(data.train.pop())
    if not data.train:
        data.train.append(data.heldout[0])
        log.warning("only one liked reply: it is trained on and held out both")


def _capped(
    by_chat: Pile,
    cap: int,
    rng: random.Random,
    dropped: dict[str, int],
    kind: str,
) -> list[tuple[FeedbackExample, bool]]:
    """At most `cap` examples of each chat (a seeded sample where it has more), in the order
    they came; how many were dropped is added to dropped[kind]."""
    kept: list[tuple[FeedbackExample, bool]] = []
    for examples in by_chat.values():
        if cap > 0 and len(examples) > cap:
            chosen = set(rng.sample(range(len(examples)), cap))
            dropped[kind] += len(examples) - cap
            examples = [e for i, e in enumerate(examples) if i in chosen]
        kept += examples
    return kept


def _line(ex: FeedbackExample) -> str:
    """One example as a ParlAI line, its own episode; a disliked one with `reward:-1`."""
    from parlai.utils.misc import msg_to_str

    from bot.training.unlikelihood import NEGATIVE_REWARD

    msg: dict[str, Any] = {"text": ex.text, "labels": [ex.label], "episode_done": True}
    if ex.disliked:
        msg["reward"] = NEGATIVE_REWARD
    return str(msg_to_str(msg)).rstrip("\t")


def write_examples(
    path: Path, examples: list[FeedbackExample], extra: list[str] | None = None
) -> None:
    """A ParlAI data file: the examples, then the `extra` lines as they are."""
    lines = [_line(ex) for ex in examples] + (extra or [])
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def sample_base_data(train_file: Path, data: FeedbackData, recipe: FeedbackRecipe) -> list[str]:
    """recipe.base_mix examples of the base's own training data per liked example, a seeded
    sample of the chitchat-dataset train split (ParlAI lines, each its own episode). Per liked
    example, not per example: with or without negatives the liked replies then weigh the same
    against the base's data, and the negatives are all the two runs differ by."""
    want = round(recipe.base_mix * len(data.train))
    if want <= 0:
        return []
    lines = [line for line in train_file.read_text(encoding="utf-8").splitlines() if line]
    return random.Random(recipe.seed + 2).sample(lines, min(want, len(lines)))
