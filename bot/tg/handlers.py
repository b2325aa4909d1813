"""Handlers: Telegram updates -> the conversation use cases (bot/conversations/usecases.py),
registered in one ordered function.

Handlers never send anything themselves (except the typing indicator): every answer is an outbox
row that a use case writes in the same transaction that closes the update's inbox row, and
delivery sends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from telegram import Bot, BotCommand, CallbackQuery, Message, MessageEntity, Update
from telegram.constants import ChatAction, ChatType
from telegram.error import Forbidden, TelegramError
from telegram.ext import (
    Application,
    ApplicationHandlerStop,
    CallbackContext,
    CallbackQueryHandler,
    CommandHandler,
    MessageHandler,
    MessageReactionHandler,
    TypeHandler,
    filters,
)

from bot import commands, texts
from bot.config import Settings
from bot.conversations.outcome import FLOODED
from bot.conversations.turn import CommandCall, Drafts, Turn
from bot.conversations.usecases import COMMAND_NAMES, UseCases
from bot.conversations.votes import arena_answer, rating_answer
from bot.db import inbox
from bot.db.feedback import Outcome
from bot.db.models import InboxStatus, VoteSource
from bot.reports.stats import format_stats, stats
from bot.service.access import Access
from bot.service.budget import SendBudget
from bot.tasks import cancel_and_wait
from bot.texts import Texts
from bot.tg import feedback
from bot.tg.drafts import DraftSender, DraftStream
from bot.tg.flood import Flood, FloodGate

log = logging.getLogger(__name__)

App = Application[Any, Any, Any, Any, Any, Any]


class TurnContext(CallbackContext[Any, Any, Any, Any]):
    """PTB's context plus the texts of the update's language, chosen once per update (the
    chat's /lang, else the sender's language_code, else English) before any handler runs.

    An attribute of the context, not a context variable: every handler reads it explicitly,
    and nothing outside the update's own dispatch can see it.
    """

    # The update's Turn (bot/conversations/turn.py), made by the runner before any handler
    # runs: its texts, the lease it is answered under, where its drafts go, its outcome.
    turn: Turn

    @property
    def texts(self) -> Texts:
        """The texts of the update's language."""
        return self.turn.texts


Context = TurnContext

# Telegram drops the typing indicator after about 5 s.
TYPING_INTERVAL_S = 4.0


def command_menu(language: Texts) -> list[BotCommand]:
    """The command menu (setMyCommands) in one language, from the command table."""
    return [BotCommand(name, description) for name, description in language.command_menu()]


@contextlib.asynccontextmanager
async def typing_action(
    bot: Bot, chat_id: int, interval_s: float | None = None
) -> AsyncIterator[None]:
    """Keep "typing..." visible in a chat while the body runs."""
    interval_s = interval_s or TYPING_INTERVAL_S

    async def keep_typing() -> None:
        while True:
            try:
                await bot.send_chat_action(chat_id, ChatAction.TYPING)
            except Forbidden:
                return
            except TelegramError as err:
                log.debug("typing indicator for chat %s failed: %s", chat_id, err)
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(keep_typing(), name=f"typing:{chat_id}")
    try:
        yield
    finally:
        await cancel_and_wait(task)


def command_name(message: Message) -> tuple[str, str | None] | None:
    """("persona", "botname"|None) for a message that starts with a command."""
    text = message.text or ""
    entity = next(
        (e for e in message.entities if e.type == MessageEntity.BOT_COMMAND and e.offset == 0),
        None,
    )
    if not text.startswith("/") or entity is None:
        return None
    # The command is the entity, as Telegram marks it and PTB's CommandHandler reads it: in
    # "/help." or "/done!" it is "/help", "/done" (command names are ASCII, so its UTF-16
    # length counts characters here).
    head = text[1 : entity.length]
    name, _, target = head.partition("@")
    return name.lower(), (target or None)


def _command_argument(message: Message) -> str:
    """Everything after the command, inner line breaks kept."""
    parts = (message.text or "").split(None, 1)
    return parts[1] if len(parts) > 1 else ""


class Handlers:
    """The conversation's Telegram handlers; each ends in one use case call."""

    def __init__(
        self,
        cases: UseCases,
        settings: Settings,
        sessionmaker: async_sessionmaker[AsyncSession],
        budget: SendBudget,
        access: Access | None = None,
    ) -> None:
        self.cases = cases
        self.access = access  # the reply quotas (bot/service/access.py); None: no quotas
        self.settings = settings
        self.sessionmaker = sessionmaker
        self.budget = budget  # the bot's, shared with the replies: drafts take what they leave
        self.flood = FloodGate(settings.flood_max_messages, settings.flood_window_s)
        # Button presses have a window of their own (the same limits): each costs two Bot API
        # calls (the answer and the buttons' edit), but must not use up the messages' budget.
        self.press_flood = FloodGate(settings.flood_max_messages, settings.flood_window_s)
        self.admin_ids = frozenset(settings.admin_user_ids)
        self.drafts: DraftSender | None = None  # made at the first streamed turn

    async def close(self) -> None:
        """Release the drafts client."""
        if self.drafts is not None:
            await self.drafts.close()

    def register(self, application: App) -> None:
        """Register every handler. PTB runs, per group, the first handler that matches."""
        message = filters.UpdateType.MESSAGE  # never edits: an edit must not re-run anything
        # Group -1 runs first for every update and stops what this chat's policy ignores.
        application.add_handler(TypeHandler(Update, self.gate), group=-1)
        # One handler per entry of the command table: its use case, or Telegram's own.
        own = {"stats": self.stats}
        for command in commands.COMMANDS:
            callback = self.command if command.name in COMMAND_NAMES else own[command.name]
            application.add_handler(CommandHandler(command.name, callback, filters=message))
        # After every CommandHandler: any other command.
        application.add_handler(MessageHandler(message & filters.COMMAND, self.unknown_command))
        # After the commands, since "/persona x" is TEXT as well.
        application.add_handler(MessageHandler(message & filters.TEXT, self.text))
        application.add_handler(MessageHandler(filters.UpdateType.EDITED_MESSAGE, self.edited))
        application.add_handler(CallbackQueryHandler(self.button))
        application.add_handler(MessageReactionHandler(self.reaction))
        # Last: stickers, photos, voice, ...; service messages (joins, pins) stay unanswered.
        application.add_handler(MessageHandler(message & ~filters.StatusUpdate.ALL, self.not_text))
        application.add_error_handler(self.on_error)

    # --- gate ------------------------------------------------------------------------------

    async def gate(self, update: Update, context: Context) -> None:
        """Stop updates that are not for us (channel posts, group traffic per policy), and
        commands and edits over the chat's flood limit."""
        await self._for_us(update, context)
        if update.callback_query is not None:
            await self._press_gate(update.callback_query, context.turn)
            return
        if update.message_reaction is not None:
            # A reaction makes no Bot API call, and storing its vote is the one transaction
            # that closing it unanswered would be; dropping it would leave the stored vote
            # different from what the chat shows.
            return
        message = update.message or update.edited_message
        assert message is not None
        command = command_name(message)
        if command is None and update.edited_message is None:
            return  # texts and non-text messages meet the flood gate in their handlers
        if command is not None and command[0] in commands.FLOOD_EXEMPT:
            return
        # Every reply counts against Telegram's per-chat limits, so commands and edits count
        # too. One over the limit is not run: the chat gets the flood notice (once per window)
        # and the update is closed unanswered ("ignored").
        verdict = self.flood.check(_chat_id(update), _sent_at(message), update.update_id)
        if verdict is Flood.OK:
            return
        if verdict is Flood.NOTICE:
            await self.cases.core.notice(context.turn, self.flood.notice(context.texts))
        context.turn.decided(FLOODED)
        raise ApplicationHandlerStop

    async def _press_gate(self, query: CallbackQuery, turn: Turn) -> None:
        """Stop a button press over the chat's limit: it is not applied, the first one in the
        window is answered that it did not count, later ones make no Bot API call at all."""
        # A press carries no date of its own (its message's is when the bot sent it).
        chat_id = turn.chat_id
        verdict = self.press_flood.check(chat_id, time.time(), turn.update_id)
        if verdict is Flood.OK:
            return
        if verdict is Flood.NOTICE:
            limit, window = self.press_flood.max_messages, self.press_flood.window_s
            try:
                await query.answer(turn.texts.pressing_too_fast(limit, window))
            except TelegramError as err:
                log.debug("answering a button press in chat %s failed: %s", chat_id, err)
        turn.decided(FLOODED)
        raise ApplicationHandlerStop

    async def _for_us(self, update: Update, context: Context) -> None:
        message = update.message or update.edited_message
        chat = update.effective_chat
        if chat is not None and (
            update.callback_query is not None or update.message_reaction is not None
        ):
            return  # presses of our buttons and reactions to our messages, in any chat
        if message is None or chat is None:
            raise ApplicationHandlerStop
        if chat.type == ChatType.PRIVATE:
            return
        policy = self.settings.group_policy
        if policy == "ignore" or update.edited_message is not None:
            raise ApplicationHandlerStop
        command = command_name(message)
        if command is not None:
            name, target = command
            for_us = (
                target.lower() == (context.bot.username or "").lower()
                if target
                else name in commands.KNOWN  # a bare unknown /command is another bot's
            )
            if for_us:
                return
            raise ApplicationHandlerStop
        if policy == "all" or self._addressed(message, context.bot):
            return
        raise ApplicationHandlerStop

    @staticmethod
    def _addressed(message: Message, bot: Bot) -> bool:
        """Whether a group message @mentions the bot or replies to one of its messages."""
        replied = message.reply_to_message
        if replied is not None and replied.from_user is not None and replied.from_user.id == bot.id:
            return True
        username = f"@{bot.username}".lower()
        entities = {**message.parse_entities(), **message.parse_caption_entities()}
        for entity, text in entities.items():
            if entity.type == MessageEntity.MENTION and text.lower() == username:
                return True
            if (
                entity.type == MessageEntity.TEXT_MENTION
                and entity.user
                and entity.user.id == bot.id
            ):
                return True
        return False

    # --- commands --------------------------------------------------------------------------

    async def command(self, update: Update, context: Context) -> None:
        """A command of the table with a use case (bot/conversations/usecases.COMMAND_NAMES):
        `/name argument`; /done gets the 1-5 rating keyboard where FEEDBACK_BUTTONS is on."""
        message = update.message
        assert message is not None
        name = command_name(message)
        assert name is not None
        call = CommandCall(
            name[0],
            _command_argument(message),
            sender_language=sender_language(update),
            rating_markup=feedback.rating_markup_json if self.settings.feedback_buttons else None,
        )
        await self.cases.command(context.turn, call)

    async def stats(self, update: Update, context: Context) -> None:
        """/stats for admins; everyone else gets the unknown-command answer."""
        user_id = user_id_of(update)
        if user_id is None or user_id not in self.admin_ids:
            log.info("refused /stats from user %s in chat %s", user_id, _chat_id(update))
            await self.cases.core.notice(context.turn, context.texts.UNKNOWN_COMMAND)
            return
        figures = await stats(self.sessionmaker, retention_days=self.settings.retention_days)
        text = format_stats(figures)
        await self.cases.core.notice(context.turn, text)

    async def unknown_command(self, update: Update, context: Context) -> None:
        """Any other /command."""
        await self.cases.core.notice(context.turn, context.texts.UNKNOWN_COMMAND)

    # --- messages --------------------------------------------------------------------------

    async def text(self, update: Update, context: Context) -> None:
        """A plain message: one model turn, unless the chat is over its flood limit."""
        message = update.message
        assert message is not None and message.text is not None
        chat_id = _chat_id(update)
        text = message.text
        if message.chat.type != ChatType.PRIVATE and context.bot.username:
            # "@bot how are you?" -> "how are you?"
            text = re.sub(rf"@{re.escape(context.bot.username)}\b", " ", text, flags=re.I).strip()
        verdict = self.flood.check(chat_id, _sent_at(message), update.update_id)
        if verdict is not Flood.OK:
            await self.cases.core.unanswered(
                context.turn,
                text,
                notice=self.flood.notice(context.texts) if verdict is Flood.NOTICE else None,
                telegram_message_id=message.message_id,
            )
            return
        if self.access is not None and await self._over_quota(context, text, message):
            return
        async with self._showing_progress(context.bot, context.turn, message.chat.type):
            await self.cases.chat.text(
                context.turn,
                text,
                telegram_message_id=message.message_id,
                arena_markup=lambda match_id: feedback.duel_markup_json(match_id, context.texts),
            )

    async def _over_quota(self, context: Context, text: str, message: Message) -> bool:
        """Count the reply against the sender's quota; if it does not fit, keep the message
        unanswered (as the flood gate does: it joins the next reply's context, so nothing is
        lost and no model call is made) and, the first time in the window, say when the user
        can write again. The update is closed either way (consumed, not retried)."""
        assert self.access is not None
        over = await self.access.take_reply(context.turn.user_id)
        if over is None:
            return False
        log.info(
            "user %s is over the %s quota (%d) until %s",
            context.turn.user_id,
            over.span,
            over.limit,
            over.until.isoformat(),
        )
        when = over.until.strftime("%H:%M:%S" if over.span == "minute" else "%Y-%m-%d %H:%M")
        notice = context.texts.quota_reached(over.span, over.limit, when) if over.first else None
        await self.cases.core.unanswered(
            context.turn, text, notice=notice, telegram_message_id=message.message_id
        )
        return True

    @contextlib.asynccontextmanager
    async def _showing_progress(self, bot: Bot, turn: Turn, chat_type: str) -> AsyncIterator[None]:
        """While a reply generates: drafts in private chats (STREAM_REPLIES=on), else the
        typing indicator (groups: drafts are for private chats only; and a responder that
        makes no drafts gets the typing indicator too)."""
        chat_id = turn.chat_id
        streams = self.settings.stream_replies and self.cases.core.responder.abilities.drafts
        if chat_type != ChatType.PRIVATE or not streams:
            async with typing_action(bot, chat_id):
                yield
            return
        if self.drafts is None:
            settings = self.settings
            token, url = settings.require_token(), settings.telegram_base_url
            self.drafts = DraftSender(token, url, self.budget)
        safety = self.cases.core.safety
        stream = DraftStream(self.drafts, chat_id, check=safety.offensive if safety.on else None)
        stream.start()
        turn.drafts = Drafts(stream.send, stream.done)  # the use case awaits done() first
        try:
            yield
        finally:
            turn.drafts = None
            await stream.done()

    async def edited(self, update: Update, context: Context) -> None:
        """An edit (private chats only; the gate drops group edits): an edit of the message the
        bot answered last regenerates the answer; any other gets a short notice."""
        message = update.edited_message
        assert message is not None
        if message.text is None or command_name(message) is not None:
            await self.cases.core.notice(context.turn, context.texts.EDITED)
            return
        async with typing_action(context.bot, _chat_id(update)):
            await self.cases.chat.edit(context.turn, message.message_id, message.text)

    async def not_text(self, update: Update, context: Context) -> None:
        """Stickers, photos, voice, files, locations, ...: only text is understood."""
        assert update.message is not None
        verdict = self.flood.check(_chat_id(update), _sent_at(update.message), update.update_id)
        if verdict is Flood.QUIET:
            return  # left pending -> closed as ignored
        text = context.texts.NOT_TEXT if verdict is Flood.OK else self.flood.notice(context.texts)
        await self.cases.core.notice(context.turn, text)

    # --- feedback --------------------------------------------------------------------------

    async def button(self, update: Update, context: Context) -> None:
        """A press of 👍/👎 or of a rating: stored (or refused), answered, the buttons updated.

        The press is answered and the keyboard edited after the vote is committed; both are
        best-effort (a lost answer only leaves the client's spinner to time out).
        """
        query = update.callback_query
        assert query is not None
        chat_id, user_id = _chat_id(update), user_id_of(update)
        pressed_on = query.message.message_id if query.message is not None else None
        press = feedback.parse(query.data)
        language = context.texts  # the chat's (or the presser's), as for any update
        answer, markup = language.VOTE_STALE, None
        if isinstance(press, feedback.VotePress) and user_id is not None:
            outcome = await self.cases.votes.vote(
                context.turn, user_id, press.message_id, press.value, telegram_message_id=pressed_on
            )
            if outcome is not Outcome.STALE:
                answer = language.VOTED_UP if press.value > 0 else language.VOTED_DOWN
                markup = feedback.vote_keyboard(press.message_id, press.value)
        elif isinstance(press, feedback.DuelPress):
            outcome = await self.cases.votes.arena_pick(context.turn, press.match_id, press.winner)
            answer = arena_answer(outcome, press.winner, language)
            if outcome is Outcome.STORED:
                markup = feedback.duel_keyboard(press.match_id, language, press.winner)
        elif isinstance(press, feedback.RatePress) and press.value > 0:
            outcome = await self.cases.votes.rate(context.turn, press.session_id, press.value)
            answer = rating_answer(outcome, press.value, language)
            if outcome is Outcome.STORED:
                markup = feedback.rating_keyboard(press.session_id, press.value)
        else:
            if isinstance(press, feedback.RatePress):
                answer = language.RATING_TWICE  # the tick of a rating already given
            await self._ignore(context.turn)
        try:
            await query.answer(answer)
        except TelegramError as err:
            log.debug("answering a button press in chat %s failed: %s", chat_id, err)
        if markup is not None and query.message is not None:
            try:
                await context.bot.edit_message_reply_markup(
                    chat_id, query.message.message_id, reply_markup=markup
                )
            except TelegramError as err:
                log.debug("updating the buttons in chat %s failed: %s", chat_id, err)

    async def reaction(self, update: Update, context: Context) -> None:
        """A reaction to a message (groups where the bot is an admin): 👍/👎 on a bot reply
        count as votes; taking it back removes the vote."""
        change = update.message_reaction
        assert change is not None
        if change.user is None:  # anonymous (a channel or an anonymous admin): no voter
            await self._ignore(context.turn)
            return
        emoji = {getattr(r, "emoji", None) for r in change.new_reaction}
        value = 1 if texts.VOTE_UP in emoji else -1 if texts.VOTE_DOWN in emoji else 0
        await self.cases.votes.vote(
            context.turn,
            change.user.id,
            None,
            value,
            source=VoteSource.REACTION,
            telegram_message_id=change.message_id,
        )

    async def _ignore(self, turn: Turn) -> None:
        """Close the update unanswered."""
        if turn.update is not None:
            async with self.cases.core.store.write() as db:
                await inbox.finish(db, turn.update, status=InboxStatus.IGNORED)

    # --- errors ----------------------------------------------------------------------------

    async def on_error(self, update: object, context: Context) -> None:
        """Errors PTB catches outside our dispatch (updates never reach it: see dispatch)."""
        log.error("error outside any update", exc_info=context.error)


def _chat_id(update: Update) -> int:
    chat = update.effective_chat
    assert chat is not None  # the gate lets only updates with a chat through
    return chat.id


def user_id_of(update: Update) -> int | None:
    user = update.effective_user
    return user.id if user else None


def sender_language(update: Update) -> str | None:
    """The sender's Telegram client language (an IETF tag such as "de" or "pt-br")."""
    user = update.effective_user
    return user.language_code if user else None


def _sent_at(message: Message) -> float:
    return message.date.timestamp() if message.date else time.time()
