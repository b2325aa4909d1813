"""The variants use case: /model lists the variants, or moves this chat to one, where the
operator allows it (ALLOW_MODEL_CHOICE)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.conversations.core import Core, FeatureCommand
from bot.conversations.turn import Turn
from bot.db import conversations
from bot.db.assignments import Choice
from bot.db.models import AssignmentSource

if TYPE_CHECKING:
    from bot.engine.variants import Experiment


class ModelChoice:
    """The chat's choice of variant."""

    def __init__(self, core: Core) -> None:
        self.core = core

    @property
    def experiment(self) -> Experiment | None:
        """The variants served now (for /model): the responder's own, which follow the
        database's changes; None when the responder has no variants."""
        variants = self.core.responder.abilities.variants
        return variants.experiment if variants is not None else None

    async def choose_variant(self, turn: Turn, name: str) -> None:
        """/model: list the variants, or move this chat to one (where the operator allows)."""
        core = self.core
        experiment = self.experiment
        if experiment is None or not core.settings.allow_model_choice:
            await core.notice(turn, turn.texts.not_enabled("model"))
            return
        names = experiment.names
        name = name.strip()
        if not name:
            async with core.store.read() as db:
                session = await conversations.get_active_session(db, turn.chat_id)
            current = session.variant if session is not None else None
            await core.notice(turn, turn.texts.variants_list(names, current))
            return
        if name not in names:
            await core.notice(turn, turn.texts.variant_unknown(name, names))
            return
        await core.store.set_variant(
            turn.chat_id,
            Choice(experiment.name, name),
            AssignmentSource.USER,
            notice=turn.texts.variant_chosen(name),
            update=turn.update,
        )


# The commands of the table (bot/commands.py) this feature runs.
COMMANDS: dict[str, FeatureCommand[ModelChoice]] = {
    "model": lambda choice, turn, call: choice.choose_variant(turn, call.argument),
}
