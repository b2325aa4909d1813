"""The conversation use cases every front end shares (Telegram handlers, terminal chat), by
feature over a small shared core (bot/conversations/core.py):

- chat.py: a text turn and its edit, /start, /help, /context, /privacy, /done, /forget;
- personas.py: /persona and the presets;
- votes.py: votes, ratings, /arena and its duels;
- model_choice.py: /model;
- languages.py: /lang, and the texts an update is answered in.

Each feature runs the commands of the table (bot/commands.py) it owns (its `commands()`); a
command of the table that no feature runs is one front end's own (Telegram's /stats).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import TypeVar

from bot.config import Settings
from bot.conversations import chat, languages, model_choice, personas, votes
from bot.conversations.core import Core, FeatureCommand, UseCase
from bot.conversations.store import ConversationStore
from bot.conversations.turn import CommandCall, Turn
from bot.engine.protocol import ResponderProtocol

# The commands of the table that a use case runs, for every front end alike: each feature
# module's COMMANDS.
COMMAND_NAMES = frozenset(
    [
        *chat.COMMANDS,
        *personas.COMMANDS,
        *votes.COMMANDS,
        *model_choice.COMMANDS,
        *languages.COMMANDS,
    ]
)
F = TypeVar("F")


def _bound(feature: F, commands: Mapping[str, FeatureCommand[F]]) -> dict[str, UseCase]:
    return {name: partial(use_case, feature) for name, use_case in commands.items()}


class UseCases:
    """The use cases of one service, by feature."""

    def __init__(
        self,
        store: ConversationStore,
        responder: ResponderProtocol,
        settings: Settings,
    ) -> None:
        self.core = Core(store, responder, settings)
        self.personas = personas.Personas(self.core)
        self.votes = votes.Votes(self.core)
        self.chat = chat.Chat(self.core, self.personas, self.votes)
        self.model_choice = model_choice.ModelChoice(self.core)
        self.languages = languages.Languages(self.core)
        # Each feature registers the commands it owns; no command has two use cases.
        self.commands: dict[str, UseCase] = {
            **_bound(self.chat, chat.COMMANDS),
            **_bound(self.personas, personas.COMMANDS),
            **_bound(self.votes, votes.COMMANDS),
            **_bound(self.model_choice, model_choice.COMMANDS),
            **_bound(self.languages, languages.COMMANDS),
        }
        assert self.commands.keys() == COMMAND_NAMES

    async def command(self, turn: Turn, call: CommandCall) -> None:
        """Run a command of the table by the use case of the feature that owns it."""
        await self.commands[call.name](turn, call)
