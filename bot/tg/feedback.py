"""The feedback buttons: 👍/👎 under every bot reply, 1-5 under the end of a conversation.

callback_data (at most 64 bytes) names what a button is about, in the database's terms:
    v:<message id>:<+1|-1>   a vote on one bot reply
    r:<session id>:<1..5>    the rating of one conversation (0: the tick once rated)
    x:<match id>:<a|b|tie>   the pick in an arena duel (/arena)
Anything else is stale or forged and is answered without changing anything.
The data holds no language: a button's label and its answer are in the presser's chat's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from telegram import InlineKeyboardButton, InlineKeyboardMarkup

from bot import texts
from bot.db.models import OutboxKind
from bot.db.outbox import OutboxRow
from bot.texts import Texts

_VOTE = re.compile(r"v:([0-9]{1,19}):(1|-1)")
# 0: the tick shown once a conversation is rated (pressing it changes nothing)
_DUEL = re.compile(r"x:([0-9]{1,19}):(a|b|tie)")
_RATE = re.compile(r"r:([0-9]{1,19}):([0-5])")
CHOSEN = " ✓"
MAX_ID = 2**63 - 1  # the ids are BIGINT; a larger number in forged data would not even bind


@dataclass(frozen=True, slots=True)
class VotePress:
    """A press of 👍 or 👎."""

    message_id: int
    value: int


@dataclass(frozen=True, slots=True)
class RatePress:
    """A press of one of the 1-5 buttons (0: the tick of a rating already given)."""

    session_id: int
    value: int


@dataclass(frozen=True, slots=True)
class DuelPress:
    """A pick in an arena duel: a, b, or tie (both bad)."""

    match_id: int
    winner: str


def parse(data: str | None) -> VotePress | RatePress | DuelPress | None:
    """What a button's callback_data means; None when it is not one of ours."""
    if data is None:
        return None
    for pattern in (_VOTE, _RATE, _DUEL):
        m = pattern.fullmatch(data)
        if m is None:
            continue
        target = int(m.group(1))
        if target > MAX_ID:  # no database id is that large
            return None
        if pattern is _VOTE:
            return VotePress(target, int(m.group(2)))
        if pattern is _RATE:
            return RatePress(target, int(m.group(2)))
        return DuelPress(target, m.group(2))
    return None


def vote_keyboard(message_id: int, chosen: int | None = None) -> InlineKeyboardMarkup:
    """👍 👎 for a reply, the chosen one ticked."""
    return InlineKeyboardMarkup(
        [
            [
                InlineKeyboardButton(
                    texts.VOTE_UP + (CHOSEN if chosen == 1 else ""),
                    callback_data=f"v:{message_id}:1",
                ),
                InlineKeyboardButton(
                    texts.VOTE_DOWN + (CHOSEN if chosen == -1 else ""),
                    callback_data=f"v:{message_id}:-1",
                ),
            ]
        ]
    )


def rating_keyboard(session_id: int, chosen: int | None = None) -> InlineKeyboardMarkup:
    """1 2 3 4 5 for a conversation; once rated, only the chosen value (nothing to press)."""
    if chosen is not None:
        return InlineKeyboardMarkup(
            [[InlineKeyboardButton(f"{'★' * chosen}{CHOSEN}", callback_data=f"r:{session_id}:0")]]
        )
    return InlineKeyboardMarkup(
        [[InlineKeyboardButton(str(n), callback_data=f"r:{session_id}:{n}") for n in range(1, 6)]]
    )


def duel_keyboard(
    match_id: int, labels_in: Texts, chosen: str | None = None
) -> InlineKeyboardMarkup:
    """A is better / B is better / Both bad (in `labels_in`'s language); once chosen, the
    choice ticked."""
    labels = {
        "a": labels_in.ARENA_BETTER_A,
        "b": labels_in.ARENA_BETTER_B,
        "tie": labels_in.ARENA_BOTH_BAD,
    }
    return InlineKeyboardMarkup(
        [
            [
                InlineKeyboardButton(
                    label + (CHOSEN if key == chosen else ""), callback_data=f"x:{match_id}:{key}"
                )
                for key, label in labels.items()
            ]
        ]
    )


def duel_markup_json(match_id: int, labels_in: Texts) -> str:
    """The duel keyboard as the outbox stores it."""
    return json.dumps(duel_keyboard(match_id, labels_in).to_dict())


def rating_markup_json(session_id: int) -> str:
    """The rating keyboard as the outbox stores it."""
    return json.dumps(rating_keyboard(session_id).to_dict())


def markup_from_json(text: str | None) -> InlineKeyboardMarkup | None:
    """An outbox row's stored keyboard."""
    if not text:
        return None
    return InlineKeyboardMarkup.de_json(json.loads(text), None)


def outbox_markup(vote_buttons: bool) -> Callable[[OutboxRow], InlineKeyboardMarkup | None]:
    """What delivery puts under a text's last part: the 👍/👎 of a model reply (when
    FEEDBACK_BUTTONS is on), or the notice's own keyboard (the rating at /done, a duel)."""

    def markup(row: OutboxRow) -> InlineKeyboardMarkup | None:
        if row.kind == OutboxKind.REPLY and row.message_id is not None:
            return vote_keyboard(row.message_id) if vote_buttons else None
        return markup_from_json(row.markup)

    return markup
