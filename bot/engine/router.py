"""The responder the service runs: every chat's turn goes to its variant's engine.

An engine is a model worker process (bot.engine.client.WorkerHandle, MODEL_WORKERS=process)
or an in-process Responder (MODEL_WORKERS=inline). The chat's variant comes with its session
row (one statement); a chat without one gets the weighted hash choice, stored at this turn.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from typing import Any, Protocol

from bot.config import ConfigError, Settings
from bot.db.conversations import SessionRow
from bot.db.models import AssignmentSource
from bot.engine.assign import choose
from bot.engine.protocol import DraftSink, Generated, ModelView, Reply, VariantStore
from bot.engine.variants import Experiment, Variant, load_experiment

log = logging.getLogger(__name__)

HOLDERS = 100_000  # sessions whose engine is remembered (about 100 bytes each)


class Engine(Protocol):
    """One variant's model, wherever it runs."""

    async def generate(
        self, session: SessionRow, user_text: str, *, on_draft: DraftSink | None = None
    ) -> Generated:
        """One turn in the session's context; drafts of the reply to `on_draft` if it streams."""
        ...

    def evict(self, session_id: int) -> None:
        """Drop a cached clone."""
        ...

    def turn_stored(self, session_id: int, last_message_id: int) -> None:
        """The cached clone is in step with the database up to `last_message_id`."""
        ...

    def set_persona(self, session_id: int, persona: str) -> None:
        """Use a new persona from the next turn."""
        ...

    async def inspect(self, session: SessionRow) -> ModelView:
        """What the model reads now for the conversation."""
        ...

    async def close(self) -> None:
        """Stop."""
        ...


class VariantResponder:
    """ResponderProtocol over the experiment's variants."""

    def __init__(
        self,
        experiment: Experiment,
        engines: dict[str, Engine],
        store: VariantStore,
    ) -> None:
        self.experiment = experiment
        self.engines = engines
        self.store = store
        # Which engine holds a session's clone (the last one that answered it), for the most
        # recent sessions: a forgotten entry only means an evict reaches no worker, whose LRU
        # drops the clone in time (and a stale clone is never used: see Responder).
        self._holder: OrderedDict[int, str] = OrderedDict()

    @classmethod
    async def start(
        cls, settings: Settings, store: VariantStore, secrets: tuple[str, ...] = ()
    ) -> VariantResponder:
        """Load every variant (in parallel); ConfigError naming the variant that cannot load."""
        experiment = load_experiment(settings)
        names = experiment.names
        results = await asyncio.gather(
            *(_start_engine(v, settings, store, secrets) for v in experiment.variants),
            return_exceptions=True,
        )
        engines: dict[str, Engine] = {}
        failures: list[tuple[str, BaseException]] = []
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                failures.append((name, result))
            else:
                engines[name] = result
        if failures:
            await asyncio.gather(*(e.close() for e in engines.values()), return_exceptions=True)
            for _, err in failures:
                if not isinstance(err, Exception):
                    raise err  # a cancellation or an interrupt, not a failure to load
            raise ConfigError(
                "\n  ".join(
                    [f"{len(failures)} variant(s) cannot load:"]
                    + [f"variant {n!r}: {err}" for n, err in failures]
                )
            )
        log.info(
            "serving experiment %s: %s",
            experiment.name,
            ", ".join(f"{v.name} (weight {v.weight:g})" for v in experiment.variants),
        )
        return cls(experiment, engines, store)

    async def close(self) -> None:
        """Stop every engine."""
        await asyncio.gather(*(e.close() for e in self.engines.values()), return_exceptions=True)

    async def variant_for(self, session: SessionRow) -> str:
        """The session's chat's variant, assigned and stored now if it has none."""
        name = session.variant
        if name is None:
            name = await self.store.assign_variant(
                session.chat_id, self.experiment.name, self._choose(session.chat_id)
            )
        if name not in self.engines:
            # The variants file no longer has it: the chat is assigned again, and stays there.
            new = self._choose(session.chat_id)
            log.warning(
                "chat %s: variant %r is not served any more; moving it to %r",
                session.chat_id,
                name,
                new,
            )
            await self.store.set_variant(
                session.chat_id, self.experiment.name, new, AssignmentSource.HASH
            )
            name = new
        return name

    def _choose(self, chat_id: int) -> str:
        return choose(self.experiment.name, chat_id, self.experiment.weights)

    async def respond(
        self, session: SessionRow, user_text: str, *, on_draft: DraftSink | None = None
    ) -> Reply:
        """The reply of the chat's variant."""
        started = time.perf_counter()
        name = await self.variant_for(session)
        previous = self._holder.get(session.id)
        if previous is not None and previous != name:
            self.engines[previous].evict(session.id)  # moved: the old clone is dead weight
        self._hold(session.id, name)
        result = await self.engines[name].generate(session, user_text, on_draft=on_draft)
        latency_ms = (time.perf_counter() - started) * 1000.0
        return _reply(result, latency_ms, name)

    async def inspect(self, session: SessionRow) -> ModelView:
        """What the chat's variant's model reads now (the /context command)."""
        name = await self.variant_for(session)
        previous = self._holder.get(session.id)
        if previous is not None and previous != name:
            self.engines[previous].evict(session.id)
        self._hold(session.id, name)
        return await self.engines[name].inspect(session)

    @property
    def duelists(self) -> list[str]:
        """The variants /arena pairs: those with a weight above 0 (a drained one is on its way
        out, and its duels would still rank it)."""
        return [v.name for v in self.experiment.variants if v.weight > 0 and v.name in self.engines]

    async def duel(self, session: SessionRow, user_text: str) -> tuple[Reply, Reply]:
        """Two variants' replies to one message (/arena), in random order: the chat's own
        variant and another one (two others when its own is drained). Neither clone keeps the
        turn: the user's pick is stored, and the next turn rebuilds from the database."""
        own = await self.variant_for(session)
        duelists = self.duelists
        if own in duelists:
            pair = [own, random.choice([name for name in duelists if name != own])]
        else:
            pair = random.sample(duelists, 2)
        random.shuffle(pair)
        started = time.perf_counter()
        try:
            results = await asyncio.gather(
                *(self.engines[name].generate(session, user_text) for name in pair)
            )
        finally:
            self.evict(session.id)
            for name in pair:
                self.engines[name].evict(session.id)
        latency_ms = (time.perf_counter() - started) * 1000.0
        a, b = (_reply(r, latency_ms, name) for name, r in zip(pair, results, strict=True))
        return a, b

    def _hold(self, session_id: int, name: str) -> None:
        self._holder[session_id] = name
        self._holder.move_to_end(session_id)
        while len(self._holder) > HOLDERS:
            self._holder.popitem(last=False)

    def set_persona(self, session_id: int, persona: str) -> None:
        """Tell the engine holding the conversation."""
        holder = self._holder.get(session_id)
        if holder is not None:
            self.engines[holder].set_persona(session_id, persona)

    def evict(self, session_id: int) -> None:
        """Drop the conversation's clone wherever it is."""
        holder = self._holder.pop(session_id, None)
        if holder is not None:
            self.engines[holder].evict(session_id)

    def turn_stored(self, session_id: int, last_message_id: int) -> None:
        """Tell the engine holding the conversation."""
        holder = self._holder.get(session_id)
        if holder is not None:
            self.engines[holder].turn_stored(session_id, last_message_id)

    def restart_reasons(self) -> dict[str, dict[str, int]]:
        """Per variant: why and how often its worker was restarted (empty for inline ones)."""
        return {
            name: dict(getattr(engine, "restart_reasons", {}))
            for name, engine in self.engines.items()
        }

    async def lane_of(self, chat_id: int) -> str:
        """The variant a chat's next turn goes to (its stored one, or the one its first turn
        will get): the inbox worker's lane for the chat."""
        stored = await self.store.variant_of(chat_id)
        return stored if stored in self.engines else self._choose(chat_id)

    def lane_ready(self, name: str) -> bool:
        """Whether the variant's engine takes turns now (a stalled or restarting worker
        does not: its chats wait, or go to a replica whose worker is up)."""
        engine = self.engines.get(name)
        return engine is None or bool(getattr(engine, "alive", True))

    @property
    def lanes(self) -> int:
        """How many variants share the concurrency slots."""
        return len(self.engines)

    async def worker_stats(self) -> dict[str, dict[str, Any]]:
        """Per variant: pid, restarts and (for workers) cache and memory figures."""
        from bot.engine.client import WorkerHandle

        out: dict[str, dict[str, Any]] = {}
        for name, engine in self.engines.items():
            if isinstance(engine, WorkerHandle):
                figures = await engine.stats() if engine.alive else {}
                out[name] = {"pid": engine.pid, "restarts": engine.restarts, **figures}
            else:
                out[name] = {"pid": None, "restarts": 0}
        return out


def _reply(result: Generated, latency_ms: float, variant: str) -> Reply:
    """A variant's Generated as the conversation layer's Reply, its metrics figures kept."""
    return Reply(
        result.text,
        latency_ms,
        variant,
        result.model_ms,
        result.candidates,
        batch_size=result.batch_size,
        cache_hit=result.cache_hit,
        rebuild_ms=result.rebuild_ms,
        cache_evictions=result.cache_evictions,
    )


async def _start_engine(
    variant: Variant, settings: Settings, store: VariantStore, secrets: tuple[str, ...]
) -> Engine:
    own = variant.settings(settings)
    if settings.model_workers == "inline":
        from bot.inference.responder import Responder

        try:
            return await Responder.start(own, store, variant.parlai_overrides())
        except ConfigError:
            raise
        except Exception as err:
            raise ConfigError(str(err) or type(err).__name__) from err
    from bot.engine.client import WorkerHandle, WorkerStartError, worker_spec

    handle = WorkerHandle(
        worker_spec(variant.name, own, variant.parlai_overrides(), variant.threads, secrets),
        store,
    )
    try:
        await handle.start()
    except WorkerStartError as err:
        raise ConfigError(str(err)) from err
    return handle
