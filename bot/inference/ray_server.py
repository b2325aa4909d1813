"""A model server in a Ray Serve replica: one variant's shared agent, clone cache and batcher.

The deployment class that bot.engine.backends.ray deploys (MODEL_BACKEND=ray): each replica runs
the same Responder as a model process (bot.inference.process), and speaks the same typed
messages (bot/engine/pipe.py), over Serve's handle instead of a pipe. A turn (`turn`, a
streaming method) yields Drafts while it generates (continuous scheduler only), then one
Reply, Error or NeedContext: a replica never reads the service's database, so a conversation
it has no up-to-date clone of is asked for (NeedContext), and the service sends the turn again
with its context, from which the clone is rebuilt.

Cache upkeep (Evict, Stored) rides on the session's next request (`upkeep`), applied before it:
fire-and-forget calls are not ordered before the next turn, and a Stored that came after the
turn it belongs to would make the clone look stale (one rebuild too many), an Evict that came
after would leave a duel's clone to answer. The multiplexed model id of every request names
the session (bot.engine.backends.ray.backend says why); once this replica holds the session's clone,
`_pin` registers it with Serve, so that Serve's router sends the session's next requests here.

`check_health` (called by Serve every few seconds) fails while the inference thread has had
work without a decoding step for WORKER_STALL_S: Serve then replaces the replica, as the
service's watcher restarts a stalled model process.

Only this module imports ray on the replica's side; it is imported with MODEL_BACKEND=ray only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from bot.config import ConfigError
from bot.engine import pipe
from bot.engine.protocol import GenerationError
from bot.engine.spec import ProcessSpec
from bot.inference.process import (
    MODEL_PROCESS_NICE,
    GivenContext,
    NeedContext,
    rss_bytes,
)
from bot.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def _load(spec: ProcessSpec) -> Any:
    """The variant's shared agent, loaded as a model process loads it (in a thread)."""
    from bot.inference import compat
    from bot.inference.model import load_shared_agent, route_parlai_logging, set_torch_threads
    from bot.logs import setup_logging

    with contextlib.suppress(OSError):
        os.nice(MODEL_PROCESS_NICE)  # a local instance shares the cores with the service
    setup_logging(spec.log_level, (), spec.log_format)
    set_torch_threads(spec.threads)  # passive waiting first, before torch loads
    compat.apply()
    route_parlai_logging(spec.log_level)
    try:
        return load_shared_agent(
            spec.settings, spec.parlai_overrides, share_weights=spec.share_weights
        )
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(
            f"loading {spec.settings.model_file} failed: {type(err).__name__}: {err}"
        ) from err


class ModelServer:
    """The deployment's class: one replica's Responder (bot.inference.responder)."""

    async def __init__(self, spec: ProcessSpec) -> None:  # type: ignore[misc]  # Serve awaits it
        from ray import serve

        from bot.inference.responder import Responder

        self.spec = spec
        # Serve's id of this replica (as its dashboard shows it): the model_replica label of
        # the metrics of every turn it generates.
        self.replica = str(serve.get_replica_context().replica_id.unique_id)
        agent = await asyncio.to_thread(_load, spec)
        self.responder = Responder(agent, GivenContext(None), spec.settings)
        await self.responder.batcher.start()
        self.info = {
            "pid": os.getpid(),
            "model": spec.settings.model_file,
            "inference": agent.opt.get("inference"),
            "beam_size": agent.opt.get("beam_size"),
            "threads": spec.threads,
            "replica": self.replica,
        }
        # One "model" per session: Serve's router prefers the replica that holds the id. Its
        # LRU is as long as the clone cache's, so both forget a session about together.
        size = max(1, self.responder.cache.capacity)

        async def pin(key: str) -> str:
            return key

        self._pin: Callable[[str], Awaitable[str]] = serve.multiplexed(
            max_num_models_per_replica=size
        )(pin)
        self._model_id: Callable[[], str] = serve.get_multiplexed_model_id
        log.info(
            "variant %s: replica %s (pid %d) ready (%s)",
            spec.variant,
            self.replica,
            os.getpid(),
            self.info["model"],
        )

    async def ready(self) -> pipe.Ready:
        """The replica's info, and the protocol version it speaks."""
        return pipe.Ready(self.info)

    async def check_health(self) -> None:
        """Serve's health check: a replica whose inference thread is stuck is replaced."""
        stuck = self.responder.batcher.liveness.stuck_s()
        if stuck > self.spec.settings.worker_stall_s:
            raise RuntimeError(f"no decoding step for {stuck:.1f} s while it has work")

    def _upkeep(self, upkeep: Sequence[pipe.Message]) -> None:
        """Apply the cache upkeep that came with a request."""
        for message in upkeep:
            match message:
                case pipe.Evict(session_id=session_id):
                    self.responder.evict(session_id)
                case pipe.Stored(session_id=session_id, last_message_id=last, replica=replica):
                    # Only the clone that made the turn is in step with it (pipe.Stored).
                    if replica in (None, self.replica):
                        self.responder.turn_stored(session_id, last)

    async def _hold(self, answer: pipe.Message) -> pipe.Message:
        """Register the request's session with Serve's router once this replica holds its
        clone (never on NeedContext: the turn sent again with the context may land on another
        replica, and the session would then be registered on two, its turns alternating)."""
        key = self._model_id()
        if key and isinstance(answer, pipe.ReplyMessage):
            await self._pin(key)
        return answer

    def _need_context(self, req_id: int) -> pipe.NeedContext:
        return pipe.NeedContext(req_id, self.responder.cache.tail_limit)

    async def turn(
        self, request: pipe.TurnRequest, upkeep: Sequence[pipe.Message] = ()
    ) -> AsyncIterator[pipe.Message]:
        """One turn: Drafts (if asked for), then its Reply, Error or NeedContext."""
        from bot.logs import log_context

        self._upkeep(upkeep)
        responder, session = self.responder, request.session
        if request.context is None and not responder.has_fresh(session):
            yield self._need_context(request.req_id)
            return
        drafts: asyncio.Queue[str] = asyncio.Queue()
        on_draft = drafts.put_nowait if request.stream else None
        with log_context(chat_id=session.chat_id):
            task = asyncio.create_task(
                responder.generate(session, request.text, GivenContext(request.context), on_draft)
            )
            waiter: asyncio.Task[str] | None = None
            try:
                while not task.done():
                    waiter = asyncio.create_task(drafts.get())
                    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    if waiter.done():
                        yield pipe.Draft(request.req_id, waiter.result())
                while not drafts.empty():  # those of its last step
                    yield pipe.Draft(request.req_id, drafts.get_nowait())
                yield await self._hold(self._outcome(request, task))
            finally:
                if waiter is not None:
                    waiter.cancel()
                if not task.done():  # the caller went away (cancelled, timed out)
                    await cancel_and_wait(task, raise_errors=False)

    def _outcome(self, request: pipe.TurnRequest, task: asyncio.Task[Any]) -> pipe.Message:
        req_id, session = request.req_id, request.session
        try:
            result = task.result()
        except NeedContext:
            return self._need_context(req_id)
        except GenerationError as err:
            return pipe.Error(req_id, str(err))
        except Exception as err:
            log.exception("variant %s: turn of session %s failed", self.spec.variant, session.id)
            self.responder.evict(session.id)
            return pipe.Error(req_id, f"{type(err).__name__}: {err}")
        return pipe.ReplyMessage(req_id, replace(result, replica=self.replica))

    async def inspect(
        self, request: pipe.Inspect, upkeep: Sequence[pipe.Message] = ()
    ) -> pipe.Message:
        """What the model reads now for the conversation: a Reply (its ModelView), an Error,
        or NeedContext."""
        self._upkeep(upkeep)
        req_id, session = request.req_id, request.session
        if request.context is None and not self.responder.has_fresh(session):
            return self._need_context(req_id)
        try:
            view = await self.responder.inspect(session, GivenContext(request.context))
        except NeedContext:
            return self._need_context(req_id)
        except Exception as err:
            log.exception("variant %s: inspecting session %s failed", self.spec.variant, session.id)
            return pipe.Error(req_id, f"{type(err).__name__}: {err}")
        return await self._hold(pipe.ReplyMessage(req_id, view))

    async def evict(self, session_id: int) -> None:
        """Drop a conversation's clone now (its next request also carries the Evict)."""
        self.responder.evict(session_id)

    async def stats(self) -> dict[str, Any]:
        """This replica's cache, batch and memory figures."""
        cache, batcher = self.responder.cache, self.responder.batcher
        return {
            "pid": os.getpid(),
            "replica": self.replica,
            "cached": len(cache),
            "hits": cache.stats.hits,
            "misses": cache.stats.misses,
            "evictions": cache.stats.evictions,
            "batches": batcher.stats.batches,
            "requests": batcher.stats.requests,
            **rss_bytes(),
        }
