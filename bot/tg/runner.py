"""The inbox worker's runner for Telegram: one inbox row through python-telegram-bot's handlers
(bot/tg/handlers.py), in one Turn, with the update closed and its outcome counted after."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from telegram import Update
from telegram.ext import ApplicationHandlerStop

from bot.conversations.outcome import COMMAND, FEEDBACK, IGNORED, NOTICE
from bot.conversations.turn import Turn
from bot.db import inbox
from bot.db.inbox import InboxRow, UpdateRef
from bot.db.models import InboxStatus
from bot.service.metrics import Metrics
from bot.texts import ENGLISH
from bot.tg.handlers import (
    App,
    Context,
    Handlers,
    TurnContext,
    command_name,
    sender_language,
    user_id_of,
)

log = logging.getLogger(__name__)


async def dispatch(application: App, update: Update, turn: Turn) -> None:
    """Run the update through the application's handlers, as Application.process_update does
    (per group, in group order, the first handler whose check matches; ApplicationHandlerStop
    ends it), except that a handler's exception propagates to the caller.

    process_update hands exceptions to the error handler instead, which would leave the inbox
    worker no way to retry the update but shared state keyed by update_id. Every handler here
    is blocking (PTB's default), so running it in this task is what PTB would do too.
    Every handler's context is a TurnContext that carries `turn`.
    """
    context: Context | None = None
    for group in sorted(application.handlers):
        for handler in list(application.handlers[group]):
            check = handler.check_update(update)
            if check is None or check is False:
                continue
            if context is None:
                context = TurnContext.from_update(update, application)
                context.turn = turn
                await context.refresh_data()
            try:
                await handler.handle_update(update, application, check, context)
            except ApplicationHandlerStop:
                return
            break  # at most one handler per group


@dataclass(frozen=True, slots=True, eq=False)
class UpdateRunner:
    """Runs one inbox row through the PTB application (the inbox worker's `handle`)."""

    application: App
    handlers: Handlers
    sessionmaker: async_sessionmaker[AsyncSession]
    metrics: Metrics | None = None

    async def __call__(self, row: InboxRow, owner: str | None) -> None:
        """Process the update as `owner` (the holder of the chat's inbox lease, checked again
        when the update is closed); raise what its handler raised, so the inbox worker can
        retry."""
        update = Update.de_json(json.loads(row.payload), self.application.bot)
        started = time.perf_counter()
        with inbox.watching_close(row.update_id) as watch:
            turn = await self.turn_of(update, row, owner)
            await dispatch(self.application, update, turn)
        unanswered = False
        if not watch.closed:  # (a handler's commit closed it: nothing to read back)
            async with self.sessionmaker.begin() as db:
                # No handler closed it (a group message not for us, a service message): done.
                if await inbox.status_of(db, row.update_id) == InboxStatus.PENDING:
                    await inbox.finish(
                        db, UpdateRef(row.update_id, owner), status=InboxStatus.IGNORED
                    )
                    unanswered = True
        log.debug(
            "update %s processed in %.0f ms", row.update_id, (time.perf_counter() - started) * 1000
        )
        if self.metrics is not None:
            # Counted once the update is closed: a failed attempt that is retried counts nothing.
            self.metrics.turn(_outcome(update, turn, unanswered), turn.variant)
            for reply in turn.replies:
                self.metrics.replied(reply, row.received_at)

    async def turn_of(self, update: Update, row: InboxRow, owner: str | None) -> Turn:
        """The update's Turn, in its language (chosen once for the whole update: every text
        it gets is in it)."""
        chat = update.effective_chat
        texts = (
            await self.handlers.cases.languages.texts_for(chat.id, sender_language(update))
            if chat is not None
            else ENGLISH
        )
        return Turn(
            chat_id=chat.id if chat is not None else 0,  # (the gate stops an update without one)
            update_id=row.update_id,
            user_id=user_id_of(update),
            at=row.received_at,
            texts=texts,
            owner=owner,
        )


def _outcome(update: Update, turn: Turn, unanswered: bool) -> str:
    """The turn's outcome: what the use case decided, else what the update was."""
    if turn.outcome is not None:
        return turn.outcome
    if unanswered:
        return IGNORED
    if update.callback_query is not None or update.message_reaction is not None:
        return FEEDBACK
    if update.message is not None and command_name(update.message) is not None:
        return COMMAND
    return NOTICE
