"""The responder: shared model, agent cache and batcher behind ResponderProtocol
(bot.engine.protocol), in the process that loaded the model: a model process's, or the
service's own with MODEL_WORKERS=inline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from bot.config import Settings
from bot.db.conversations import SessionRow
from bot.engine.protocol import (
    Abilities,
    ContextSource,
    DraftSink,
    Generated,
    GenerationError,
    ModelView,
    Reply,
)
from bot.inference.batcher import Batcher, BatchError, Liveness
from bot.inference.cache import AgentCache, Conversation
from bot.inference.scheduler import Scheduler

log = logging.getLogger(__name__)


def _serves(entry: Conversation, session: SessionRow) -> bool:
    """Whether a cached clone is the session's conversation as the database has it now: never
    another chat's clone, whatever happened to the ids, and never one behind the database
    (another process answered a turn, an admin changed it, a turn is regenerated after an
    edit): the database wins."""
    return entry.chat_id == session.chat_id and entry.last_message_id == session.last_message_id


class Responder:
    """One shared ParlAI agent serving every conversation."""

    def __init__(self, shared_agent: Any, store: ContextSource, settings: Settings) -> None:
        self.shared_agent = shared_agent
        self.store = store
        self.settings = settings
        self.cache = AgentCache(shared_agent, settings.agent_cache_size)
        self.batcher: Batcher | Scheduler = make_decoder(shared_agent, settings)
        count_steps(shared_agent, self.batcher.liveness)

    @classmethod
    async def start(
        cls,
        settings: Settings,
        store: ContextSource,
        extra_overrides: dict[str, Any] | None = None,
    ) -> Responder:
        """Load the model off the event loop and start the batcher."""
        from bot.inference.model import load_shared_agent

        agent = await asyncio.to_thread(load_shared_agent, settings, extra_overrides)
        responder = cls(agent, store, settings)
        await responder.batcher.start()
        return responder

    @property
    def abilities(self) -> Abilities:
        """It shows /context, and streams drafts where the continuous scheduler runs (the
        micro-batcher makes none); one model, so no variants and no /arena."""
        return Abilities(drafts=isinstance(self.batcher, Scheduler), inspect=self)

    # As a variant's backend in the router (bot.engine.router.Backend): in this process it is
    # up from start to close, and nothing restarts it.
    alive = True
    state = ""
    restart_reasons: Mapping[str, int] = MappingProxyType({})

    async def close(self) -> None:
        """Stop the batcher (a running batch finishes first)."""
        await self.batcher.close()

    @contextlib.asynccontextmanager
    async def checkout(
        self, session: SessionRow, source: ContextSource | None = None
    ) -> AsyncIterator[Conversation]:
        """A session's conversation (cached clone, or rebuilt from `source`, by default the
        store), held for the duration of one request so that the cache never evicts it
        meanwhile."""
        entry = await self.conversation(session, source)
        with self.cache.checkout(entry):
            yield entry

    def has_fresh(self, session: SessionRow) -> bool:
        """Whether a cached clone can answer the session's next turn as it is (no rebuild)."""
        entry = self.cache.peek(session.id)
        return entry is not None and _serves(entry, session)

    async def conversation(
        self, session: SessionRow, source: ContextSource | None = None
    ) -> Conversation:
        """The cached clone for a session, rebuilt from `source` (the store) on a miss."""
        entry = self.cache.get(session.id)
        if entry is not None and not _serves(entry, session):
            log.debug("session %s: cached clone is not this conversation's now", session.id)
            self.cache.evict(session.id)
            entry = None
        if entry is None:
            # As far as the session row says: a turn regenerated after an edit reads the
            # conversation without its old turn (session.last_message_id is set before it),
            # with the row's persona, the one the reply is stored with (not a second read).
            ctx = await (source or self.store).load_context(
                session.id, self.cache.tail_limit, session.last_message_id or 0
            )
            entry = self.cache.rebuild(
                session.id,
                session.persona,
                # What the model said, where the text shown differs (messages.model_text).
                [(m.role, m.text if m.model_text is None else m.model_text) for m in ctx.messages],
                chat_id=session.chat_id,
                last_message_id=ctx.messages[-1].id if ctx.messages else None,
            )
        elif entry.persona != session.persona:
            # Changed elsewhere (another replica, the admin CLI): the database wins.
            self.cache.set_persona(session.id, session.persona)
        return entry

    async def generate(
        self,
        session: SessionRow,
        user_text: str,
        source: ContextSource | None = None,
        on_draft: DraftSink | None = None,
    ) -> Generated:
        """One turn with everything the batcher reports (model input included), and the clone
        cache's figures for the metrics; the settled start of the reply goes to `on_draft` while
        it generates (continuous scheduler only)."""
        cached = self.has_fresh(session)  # else the checkout rebuilds it
        async with self.checkout(session, source) as entry:
            try:
                turn = entry.user_turn(user_text)
                if isinstance(self.batcher, Scheduler):
                    result = await self.batcher.generate(entry.clone, turn, on_draft)
                else:
                    result = await self.batcher.generate(entry.clone, turn)
            except BatchError as err:
                self.cache.evict(session.id)
                raise GenerationError(str(err)) from err
            except asyncio.CancelledError:
                # The turn goes on in the batch and its reply lands in this clone, which the
                # database will never hear of: the next turn must rebuild (found in review).
                self.cache.evict(session.id)
                raise
            return replace(
                result,
                cache_hit=cached,
                rebuild_ms=None if cached else entry.rebuild_ms,
                cache_evictions=self.cache.take_evictions(),
            )

    async def inspect(self, session: SessionRow, source: ContextSource | None = None) -> ModelView:
        """The model input the conversation's clone holds now, without generating."""
        async with self.checkout(session, source) as entry:
            history = entry.clone.history
            vec = history.get_history_vec() or list(history.persona_vec)
            text = str(self.shared_agent.dict.vec2txt(vec)) if vec else ""
            return ModelView(list(vec), text, history.visible_turns())

    async def respond(
        self, session: SessionRow, user_text: str, *, on_draft: DraftSink | None = None
    ) -> Reply:
        """The bot's reply to `user_text` in `session`'s context (drafts to the turn's sink)."""
        started = time.perf_counter()
        result = await self.generate(session, user_text, on_draft=on_draft)
        latency_ms = (time.perf_counter() - started) * 1000.0
        return Reply(
            result.text,
            latency_ms,
            None,
            result.model_ms,
            result.candidates,
            model_text=result.model_text,
        )

    def set_persona(self, session_id: int, persona: str) -> None:
        """Use a new persona for a cached conversation from its next turn."""
        self.cache.set_persona(session_id, persona)

    def evict(self, session_id: int) -> None:
        """Forget a conversation's clone."""
        self.cache.evict(session_id)

    def turn_stored(self, session_id: int, last_message_id: int) -> None:
        """The clone's latest turn is in the database now, up to `last_message_id`."""
        entry = self.cache.peek(session_id)
        if entry is not None:
            entry.last_message_id = last_message_id


def count_steps(shared_agent: Any, liveness: Liveness) -> None:
    """Every call of the model's token embeddings (once per decoding step, in ParlAI's search
    and in fastgen's; and per encoder pass) is a sign of progress. A model without them is
    judged by its batches and the scheduler's steps alone."""
    import torch

    model = getattr(shared_agent, "model", None)
    embeddings = getattr(getattr(model, "decoder", None), "embeddings", None)
    if isinstance(embeddings, torch.nn.Module):
        embeddings.register_forward_hook(lambda *_: liveness.beat())


def make_decoder(shared_agent: Any, settings: Settings) -> Batcher | Scheduler:
    """The continuous scheduler where it applies (SCHEDULER=continuous and a search it covers:
    greedy, beam, delayed beam on the stock transformer), else the micro-batcher."""
    from bot.inference.fastgen.continuous import continuous_supported

    if settings.scheduler == "continuous":
        why = continuous_supported(shared_agent)
        if why is None:
            return Scheduler(shared_agent, max_size=settings.batch_max_size)
        log.info("continuous batching does not apply (%s); micro-batching instead", why)
    return Batcher(
        shared_agent,
        max_size=settings.batch_max_size,
        max_wait_ms=settings.batch_max_wait_ms,
    )
