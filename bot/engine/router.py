"""The responder the service runs: every chat's turn goes to its variant's backend.

A backend (bot.engine.spec.Backend) is made by MODEL_BACKEND's factory
(bot.engine.backends.registry): a model process (bot.engine.backends.local.ModelProcess,
MODEL_WORKERS=process), an in-process Responder (MODEL_WORKERS=inline), or a Ray Serve
deployment (MODEL_BACKEND=ray, bot.engine.backends.ray.backend.RayBackend). The chat's variant
comes with its session row (one statement); a chat without one gets the allocation's choice
(bot.engine.bandit: the weights' shares, or the Thompson split), drawn from the chat's hash and
stored at this turn with the probability it had.

The variants live in the database (bot.engine.live); the backends serving them here are
started, followed and drained by ServedVariants (bot.engine.served). Every POLL_S the router
reads the experiment's version and, when it moved, follows: weights, the control and the
allocation change at once; a new variant's backend starts in the background (new chats go to
the variants served here meanwhile; a chat already assigned to it waits, or goes to a replica
that has it); a removed variant takes no new chats at once, its backend stops once its turns in
flight are answered (at most DRAIN_S), and each of its chats is assigned again by the
allocation at its next turn (source `moved`: no draw of its new variant). A variant that cannot
load is logged and shown in `load_errors` (the replica's status, and /readyz fails while it has
a weight above 0); the others keep serving, and it is tried again every RETRY_LOAD_S.

A new chat is only ever assigned to a variant served here now: with no weighted variant served
(the only weighted one is loading or cannot load) it goes to the control, else to another
served variant, and that probability (1) is what is recorded with it (source `fallback`: no
draw, left out of the sample-ratio check and the weights).

Every reply carries the identity of the variant whose backend produced it (Variant.version,
`variants.version_id`), which the conversation layer stores with it: votes and ratings
belong to that identity, so a name added again, or given another model, starts from zero.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from bot.config import ConfigError, Settings
from bot.db import variants as stored
from bot.db.assignments import FALLBACK, Choice
from bot.db.conversations import SessionRow
from bot.db.models import AssignmentSource
from bot.engine import live, served
from bot.engine.assign import choose
from bot.engine.backends.local import ModelProcess
from bot.engine.backends.registry import models_load_here
from bot.engine.bandit import Allocator
from bot.engine.protocol import (
    LOCAL_REPLICA,
    Abilities,
    DraftSink,
    Generated,
    ModelView,
    Reply,
    VariantStore,
)
from bot.engine.served import POLL_S, ServedVariants, VariantUnavailable
from bot.engine.spec import Backend
from bot.engine.variants import load_experiment

log = logging.getLogger(__name__)

HOLDERS = 100_000  # sessions whose backend is remembered (about 100 bytes each)


class VariantResponder(ServedVariants):
    """ResponderProtocol over the experiment's variants: it streams drafts, shows /context,
    duels two variants for /arena, and serves every variant in its lane."""

    @property
    def abilities(self) -> Abilities:
        """All of them (drafts unless SCHEDULER=batch, whose micro-batcher makes none)."""
        drafts = self._settings is None or self._settings.scheduler != "batch"
        return Abilities(drafts=drafts, inspect=self, duel=self, variants=self)

    def __post_init__(self, settings: Settings | None, secrets: tuple[str, ...]) -> None:
        super().__post_init__(settings, secrets)
        # Which backend holds a session's clone (the last one that answered it), for the most
        # recent sessions: a forgotten entry only means an evict reaches no worker, whose LRU
        # drops the clone in time (and a stale clone is never used: see Responder).
        self._holder: OrderedDict[int, str] = OrderedDict()
        self.allocator = Allocator(self._count_votes)
        self._fallback_logged: str | None = None  # the fallback variant last logged

    @classmethod
    async def start(
        cls,
        settings: Settings,
        store: VariantStore,
        secrets: tuple[str, ...] = (),
        *,
        poll_s: float = POLL_S,
    ) -> VariantResponder:
        """Load every variant of the stored experiment (seeded from VARIANTS_FILE the first
        time), in parallel, and follow its changes; ConfigError naming a variant that cannot
        load (at start every variant must: a broken one is a mistake to fix now)."""
        seed = load_experiment(settings)
        # A model file must exist where it is loaded: here, or (ray) on the cluster's nodes,
        # whose replicas say so when they cannot load it.
        local = models_load_here(settings)
        loaded = await live.ensure_seeded(store.sessionmaker, seed, settings, check_model=local)
        experiment, problems = loaded.experiment, loaded.problems
        if problems:
            raise ConfigError(
                f"experiment {experiment.name} (the variants table):\n  "
                + "\n  ".join(f"variant {n!r}: {why}" for n, why in problems.items())
            )
        names = experiment.names
        results = await asyncio.gather(
            *(served.start_backend(v, settings, store, secrets) for v in experiment.variants),
            return_exceptions=True,
        )
        backends: dict[str, Backend] = {}
        failures: list[tuple[str, BaseException]] = []
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                failures.append((name, result))
            else:
                backends[name] = result
        if failures:
            await asyncio.gather(*(e.close() for e in backends.values()), return_exceptions=True)
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
            "serving experiment %s (%s allocation): %s",
            experiment.name,
            experiment.allocation,
            ", ".join(f"{v.name} (weight {v.weight:g})" for v in experiment.variants),
        )
        router = cls(experiment, backends, store, settings=settings, secrets=secrets, poll_s=poll_s)
        router.follow()
        return router

    async def variant_for(self, session: SessionRow) -> str:
        """The session's chat's variant, assigned and stored now if it has none."""
        name = session.variant
        if name is None:
            name = await self.store.assign_variant(
                session.chat_id, await self._choose(session.chat_id)
            )
        if self.experiment.get(name) is None:
            await self.refresh()  # another replica may know of a variant just added
        if self.experiment.get(name) is None:
            # Removed from the experiment: the chat is assigned again, and stays there; it is
            # a move, not a draw (the report counts it at the draw it came from).
            moved = await self._choose(session.chat_id)
            log.info(
                "chat %s: variant %r is not served any more; moving it to %r",
                session.chat_id,
                name,
                moved.variant,
            )
            await self.store.set_variant(session.chat_id, moved, AssignmentSource.MOVED)
            name = moved.variant
        return name

    async def _choose(self, chat_id: int) -> Choice:
        """A new chat's variant, drawn from its hash against the allocation's split over the
        weighted variants served here, with that split (what is recorded with the chat).

        A chat is never assigned to a variant that cannot answer it now (one still loading,
        or failing to load, here): with no weighted variant served here it goes to a served
        one, the control first, with probability 1 and `by` FALLBACK (stored as source
        `fallback`: no draw, so the sample-ratio check and the weights leave it out); with
        none served at all nothing is assigned and the turn waits (VariantUnavailable)."""
        name = self.experiment.name
        weighted = self._weighted_ready()
        if weighted:
            self._fallback_logged = None
            split = await self.allocator.split(self.experiment, weighted)
            return Choice(name, choose(name, chat_id, split), split, self.experiment.allocation)
        fallback = self._fallback()
        if fallback is None:
            raise VariantUnavailable("no variant is served on this replica yet")
        return Choice(name, fallback, {fallback: 1.0}, FALLBACK)

    def _serving_now(self) -> list[str]:
        """The variants whose backend takes turns here now, in the experiment's order: loaded,
        and not stalled, restarting or without a running Ray replica."""
        return [name for name in self.ready if self.backends[name].alive]

    def _weighted_ready(self) -> list[str]:
        """The variants with a weight above 0 whose backend takes turns here now, in the
        experiment's order: those a new chat may be drawn into."""
        ready = set(self._serving_now())
        return [v.name for v in self.experiment.variants if v.weight > 0 and v.name in ready]

    def _fallback(self) -> str | None:
        """Where new chats go while no weighted variant is served here: the control if it is
        served, else the first variant that is (None: none is). Logged once per change."""
        ready = self._serving_now()
        control = next((v.name for v in self.experiment.variants if v.control), None)
        name = control if control in ready else (ready[0] if ready else None)
        if name is not None and name != self._fallback_logged:
            waiting = [v.name for v in self.experiment.variants if v.weight > 0]
            log.warning(
                "no variant with a weight above 0 is served here (%s: %s); new chats go to %s "
                "until one is",
                ", ".join(waiting),
                "; ".join(self.load_errors.get(n, "still loading") for n in waiting),
                name,
            )
        self._fallback_logged = name
        return name

    async def _count_votes(self, names: Sequence[str]) -> dict[str, tuple[int, int]]:
        async with self.store.sessionmaker() as db:
            return await stored.vote_counts(db, names, self.experiment.name)

    async def respond(
        self, session: SessionRow, user_text: str, *, on_draft: DraftSink | None = None
    ) -> Reply:
        """The reply of the chat's variant."""
        started = time.perf_counter()
        name = await self.variant_for(session)
        backend = await self._backend(name)
        version = self._version(name)
        self._moved(session.id, name)
        with self._serving(backend):
            result = await backend.generate(session, user_text, on_draft=on_draft)
        latency_ms = (time.perf_counter() - started) * 1000.0
        return _reply(result, latency_ms, name, version)

    def _version(self, name: str) -> int | None:
        """The identity of the variant whose backend answers `name` now: the definition it
        was started from (or followed since, with the same model), so that the replies of a
        model being replaced count for the old identity until the new model serves."""
        defined = self._defs.get(name)
        if defined is None or not defined.version:
            return None  # not stored (a test's experiment): the name's current identity
        return defined.version

    async def inspect(self, session: SessionRow) -> ModelView:
        """What the chat's variant's model reads now (the /context command)."""
        name = await self.variant_for(session)
        backend = await self._backend(name)
        self._moved(session.id, name)
        with self._serving(backend):
            return await backend.inspect(session)

    def _moved(self, session_id: int, name: str) -> None:
        previous = self._holder.get(session_id)
        if previous is not None and previous != name:
            old = self.backends.get(previous)
            if old is not None:
                old.evict(session_id)  # moved: the old clone is dead weight
        self._hold(session_id, name)

    @property
    def duelists(self) -> list[str]:
        """The variants /arena pairs: those with a weight above 0 served here (a drained one
        is on its way out, and its duels would still rank it)."""
        return [
            v.name for v in self.experiment.variants if v.weight > 0 and v.name in self.backends
        ]

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
        backends = [self.backends[name] for name in pair]
        versions = [self._version(name) for name in pair]
        try:
            with self._serving(backends[0]), self._serving(backends[1]):
                results = await asyncio.gather(
                    *(backend.generate(session, user_text) for backend in backends)
                )
        finally:
            self.evict(session.id)
            for backend in backends:
                backend.evict(session.id)
        latency_ms = (time.perf_counter() - started) * 1000.0
        a, b = (
            _reply(r, latency_ms, name, version)
            for name, r, version in zip(pair, results, versions, strict=True)
        )
        return a, b

    def _hold(self, session_id: int, name: str) -> None:
        self._holder[session_id] = name
        self._holder.move_to_end(session_id)
        while len(self._holder) > HOLDERS:
            self._holder.popitem(last=False)

    def set_persona(self, session_id: int, persona: str) -> None:
        """Tell the backend holding the conversation."""
        backend = self.backends.get(self._holder.get(session_id, ""))
        if backend is not None:
            backend.set_persona(session_id, persona)

    def evict(self, session_id: int) -> None:
        """Drop the conversation's clone wherever it is."""
        backend = self.backends.get(self._holder.pop(session_id, ""))
        if backend is not None:
            backend.evict(session_id)

    def turn_stored(self, session_id: int, last_message_id: int) -> None:
        """Tell the backend holding the conversation."""
        backend = self.backends.get(self._holder.get(session_id, ""))
        if backend is not None:
            backend.turn_stored(session_id, last_message_id)

    def restart_reasons(self) -> dict[str, dict[str, int]]:
        """Per variant: why and how often its worker was restarted (empty for inline ones)."""
        return {name: dict(backend.restart_reasons) for name, backend in self.backends.items()}

    def model_states(self) -> dict[str, str]:
        """Every variant loaded here: "" while its backend takes turns, else why not; and
        every variant with a weight above 0 that cannot load here, with why (/readyz fails
        while there is one: it was meant to take new chats)."""
        states = {name: backend.state for name, backend in self.backends.items()}
        for name, why in self.load_errors.items():
            variant = self.experiment.get(name)
            if variant is not None and variant.weight > 0:
                states[name] = f"cannot load: {why}"
        return states

    async def lane_of(self, chat_id: int) -> str:
        """The variant a chat's next turn goes to (its stored one, or the one its first turn
        will get): the inbox worker's lane for the chat."""
        if len(self.experiment.variants) == 1:
            # every branch below gives the one variant: no read (a checkout per turn, the
            # usual single-model deployment; docs/benchmarks.md, "Issue 38, fourth pass")
            return self.experiment.variants[0].name
        name = await self.store.variant_of(chat_id)
        if name is not None and self.experiment.get(name) is not None:
            return name
        # A chat's first turn (or a removed variant's chat): where the weights of the variants
        # served here would put it, as _choose does (the bandit's split may differ; only the
        # lane's share of the slots depends on it), else the fallback.
        weights = {n: self.experiment.weights[n] for n in self._weighted_ready()}
        if weights:
            self._fallback_logged = None
            return choose(self.experiment.name, chat_id, weights)
        fallback = self._fallback()
        if fallback is not None:
            return fallback
        # Nothing is served here yet: the chat waits in the lane the weights give it.
        return choose(self.experiment.name, chat_id, self.experiment.weights)

    def lane_ready(self, name: str) -> bool:
        """Whether the variant's backend takes turns now (a stalled or restarting worker does
        not, nor one still starting or unable to start here: its chats wait, or go to a
        replica whose worker is up). A variant no longer in the experiment is "ready": its
        chat is assigned again at the turn."""
        if self.experiment.get(name) is None:
            return True
        backend = self.backends.get(name)
        return backend is not None and backend.alive

    @property
    def lanes(self) -> int:
        """How many variants share the concurrency slots now (it follows the experiment)."""
        return max(1, len(self.backends))

    async def worker_stats(self) -> dict[str, dict[str, Any]]:
        """Per variant: pid, restarts and (for workers) cache and memory figures."""
        out: dict[str, dict[str, Any]] = {}
        # A copy: a variant that finishes loading while a process answers changes the dict.
        for name, backend in list(self.backends.items()):
            if isinstance(backend, ModelProcess):
                figures = await backend.stats() if backend.alive else {}
                out[name] = {"pid": backend.pid, "restarts": backend.restarts, **figures}
            else:
                out[name] = {"pid": None, "restarts": 0}
        return out


def _reply(result: Generated, latency_ms: float, variant: str, version: int | None) -> Reply:
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
        model_replica=result.replica or LOCAL_REPLICA,
        model_text=result.model_text,
        variant_version=version,
    )
