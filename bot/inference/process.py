"""A model worker process: one variant's shared agent, clone cache and batcher.

Started by bot.engine.backends.local with multiprocessing's `spawn`, so it shares nothing with the
service but the pipe it is given. The service sends turns (the session row, the user text, and
the conversation's context when this worker asked for it) and gets replies back; everything
that touches Telegram or the database stays in the service. The messages are the typed ones
of bot/engine/pipe.py (Turn, Inspect, Evict, Stored, StatsRequest, Ping, Stop one way; Ready
or Failed once, then Reply, NeedContext, Draft, Error, Stats, Pong the other). Drafts of a
streamed turn are the start of the reply as far as it is settled, cleaned like the reply, whole
words only: the first as soon as there is one, then at most one a second (continuous scheduler
only). A Ping is answered on this process's event loop, with how long the inference thread
has had work without a decoding step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from bot.config import ConfigError
from bot.engine import pipe
from bot.engine.protocol import ConversationContext, GenerationError
from bot.engine.spec import ProcessSpec

if TYPE_CHECKING:  # imported in the process, after its logging and torch threads are set
    from bot.inference.responder import Responder

log = logging.getLogger(__name__)

# Workers run this much nicer than the service: when the cores are short, the service's event
# loop (heartbeats, leases, delivery) comes first, and a long generation waits instead. Measured
# in docs/benchmarks.md ("Scale-out"): a starved loop misses heartbeats and fences itself.
MODEL_PROCESS_NICE = 5


class NeedContext(Exception):
    """The worker has no up-to-date clone for the session and no context came with the turn."""


class GivenContext:
    """A ContextSource holding the context sent with one turn (or none)."""

    def __init__(self, context: ConversationContext | None) -> None:
        self.context = context

    async def load_context(
        self, session_id: int, tail: int | None, upto: int | None = None
    ) -> ConversationContext:
        if self.context is None or self.context.session_id != session_id:
            raise NeedContext
        return self.context


def rss_bytes() -> dict[str, int]:
    """This process's resident and proportional set size (PSS splits shared pages), after a
    garbage collection and giving freed heap back to the OS (so figures compare)."""
    import ctypes
    import gc

    import psutil

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: a little noisier
        ctypes.CDLL("libc.so.6").malloc_trim(0)

    info = psutil.Process().memory_full_info()
    return {"rss": int(info.rss), "pss": int(getattr(info, "pss", info.rss))}


def main(conn: Connection, spec: ProcessSpec) -> None:
    """The worker's entry point (the `spawn` target)."""
    from bot.inference import compat
    from bot.inference.model import load_shared_agent, route_parlai_logging, set_torch_threads
    from bot.logs import setup_logging

    # Ctrl-C reaches the whole process group; the service stops its workers in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(MODEL_PROCESS_NICE)
    setup_logging(spec.log_level, spec.secrets, spec.log_format)
    set_torch_threads(spec.threads)  # passive waiting first, before torch loads
    compat.apply()
    route_parlai_logging(spec.log_level)
    try:
        agent = load_shared_agent(
            spec.settings, spec.parlai_overrides, share_weights=spec.share_weights
        )
    except Exception as err:  # noqa: BLE001 - whatever it was, the service reports it
        reason = (
            str(err)
            if isinstance(err, ConfigError)
            else (f"loading {spec.settings.model_file} failed: {type(err).__name__}: {err}")
        )
        with contextlib.suppress(OSError):
            conn.send(pipe.Failed(reason))
        return
    info = {
        "pid": os.getpid(),
        "model": spec.settings.model_file,
        "inference": agent.opt.get("inference"),
        "beam_size": agent.opt.get("beam_size"),
        "threads": spec.threads,
    }
    conn.send(pipe.Ready(info))
    log.info("variant %s: worker %d ready (%s)", spec.variant, os.getpid(), info["model"])
    asyncio.run(_serve(conn, agent, spec))


async def _serve(conn: Connection, agent: Any, spec: ProcessSpec) -> None:
    from bot.inference.responder import Responder

    responder = Responder(agent, GivenContext(None), spec.settings)
    await responder.batcher.start()
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[pipe.Message] = asyncio.Queue()

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                message = pipe.Stop()  # the service is gone: nobody is waiting for replies
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if isinstance(message, pipe.Stop):
                return

    threading.Thread(target=read, name="worker-pipe", daemon=True).start()
    worker = _Worker(conn, responder, spec)
    running: set[asyncio.Task[None]] = set()
    while not isinstance(message := await inbox.get(), pipe.Stop):
        match message:
            case pipe.TurnRequest() | pipe.Inspect():
                task = asyncio.create_task(worker.logged(message))
                running.add(task)
                task.add_done_callback(running.discard)
            case pipe.Ping():
                # Answered here, on the event loop; the inference thread's progress goes with it.
                worker.send(pipe.Pong(responder.batcher.liveness.stuck_s()))
            case pipe.Evict(session_id=session_id):
                responder.evict(session_id)
            case pipe.Stored(session_id=session_id, last_message_id=last):
                responder.turn_stored(session_id, last)
            case pipe.StatsRequest(req_id=req_id, memory=memory):
                worker.send(pipe.Stats(req_id, worker.stats(memory)))
            case _:
                log.error("variant %s: unexpected message: %r", spec.variant, message)
    for task in list(running):
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    await responder.close()


class _Worker:
    """A model process's answers to the service's requests, over its pipe."""

    def __init__(self, conn: Connection, responder: Responder, spec: ProcessSpec) -> None:
        self.conn = conn
        self.responder = responder
        self.spec = spec

    def send(self, message: pipe.Message) -> None:
        with contextlib.suppress(OSError):  # the service is gone; the reader stops us
            self.conn.send(message)

    def need_context(self, req_id: int) -> None:
        self.send(pipe.NeedContext(req_id, self.responder.cache.tail_limit))

    async def turn(self, request: pipe.TurnRequest) -> None:
        responder, send = self.responder, self.send
        req_id, session, context = request.req_id, request.session, request.context
        if context is None and not responder.has_fresh(session):
            self.need_context(req_id)
            return
        on_draft = (lambda draft: send(pipe.Draft(req_id, draft))) if request.stream else None
        try:
            result = await responder.generate(
                session, request.text, GivenContext(context), on_draft
            )
        except NeedContext:
            self.need_context(req_id)
        except GenerationError as err:
            send(pipe.Error(req_id, str(err)))
        except Exception as err:
            log.exception("variant %s: turn of session %s failed", self.spec.variant, session.id)
            responder.evict(session.id)
            send(pipe.Error(req_id, f"{type(err).__name__}: {err}"))
        else:
            send(pipe.ReplyMessage(req_id, result))

    async def inspect(self, request: pipe.Inspect) -> None:
        req_id, session, context = request.req_id, request.session, request.context
        if context is None and not self.responder.has_fresh(session):
            self.need_context(req_id)
            return
        try:
            view = await self.responder.inspect(session, GivenContext(context))
        except Exception as err:
            log.exception("variant %s: inspecting session %s failed", self.spec.variant, session.id)
            self.send(pipe.Error(req_id, f"{type(err).__name__}: {err}"))
        else:
            self.send(pipe.ReplyMessage(req_id, view))

    async def logged(self, request: pipe.TurnRequest | pipe.Inspect) -> None:
        from bot.logs import log_context

        with log_context(chat_id=request.session.chat_id):
            await (
                self.turn(request)
                if isinstance(request, pipe.TurnRequest)
                else self.inspect(request)
            )

    def stats(self, memory: bool = False) -> dict[str, Any]:
        """Cache and batch figures; with `memory` rss and pss too (rss_bytes: a collection
        that stops the inference thread for a few hundred ms, pipe.StatsRequest)."""
        cache = self.responder.cache
        return {
            "cached": len(cache),
            "hits": cache.stats.hits,
            "misses": cache.stats.misses,
            "evictions": cache.stats.evictions,
            "batches": self.responder.batcher.stats.batches,
            "requests": self.responder.batcher.stats.requests,
            **(rss_bytes() if memory else {}),
        }
