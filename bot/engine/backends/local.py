"""MODEL_BACKEND=local: every variant's model on this machine, in a worker process of its own
(MODEL_WORKERS=process, ModelProcess below) or in this process (MODEL_WORKERS=inline, the
model's own Responder, named by bot.engine.spec.INLINE_RESPONDER).

ModelProcess is the service's side of a model worker process (bot.engine.spec.PROCESS_MAIN,
bot.inference.process): start it, send it turns, watch that it answers, restart it when it dies
or hangs.

Nothing here may block the event loop on the worker: messages to it go through a bounded queue
to a writer thread of its own (a stopped worker fills its pipe, and a blocking `send` on the
loop would freeze the whole service), and replies come back through a reader thread.

A worker that dies (kill -9, out of memory, a CUDA error) fails the turns it was working on
with ModelProcessLost; `generate` waits for the restarted worker and sends them again, so they are
answered once it is back, while other variants' workers keep answering. A worker that hangs
(SIGSTOP, a deadlock, a swapped-out machine) is treated the same way: the service pings it once
a second, and the worker answers from its event loop with how long its inference thread has
been without progress while it has work (a decoding step counts, so a long generation is not a
hang). No answer, or no progress, for WORKER_STALL_S seconds, or a full pipe, and the worker is
killed and restarted. The restart waits with exponential backoff, so a worker that cannot come
up does not spin; every turn has a deadline (GENERATION_TIMEOUT_S) all the same.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, Protocol

from bot.config import ConfigError, Settings
from bot.db.conversations import SessionRow
from bot.engine import pipe
from bot.engine.backends.deadline import within_turn_deadline
from bot.engine.protocol import DraftSink, Generated, GenerationError, ModelView
from bot.engine.spec import INLINE_RESPONDER, PROCESS_MAIN, Backend, ProcessSpec, resolve
from bot.tasks import cancel_and_wait

if TYPE_CHECKING:  # the service process never imports torch or ParlAI: the workers do
    from bot.engine.protocol import ContextSource, ConversationContext
    from bot.engine.variants import Variant


class _Build(Protocol):
    """A request about a session, made once its req_id and context (None: not asked for yet)
    are known."""

    def __call__(self, req_id: int, *, context: ConversationContext | None) -> pipe.Request: ...


# The logger keeps the name of the module this code came from (bot/engine/client.py): log
# filters and dashboards that select it keep working.
log = logging.getLogger("bot.engine.client")

# A turn whose worker died this many times is given up (it may be what kills the worker).
MAX_LOST = 3
START_TIMEOUT_S = 600.0  # a zoo model downloads on its first start
STOP_TIMEOUT_S = 10.0
# Restarts wait 0.5 s, then twice as long each time, at most 30 s.
RESTART_FIRST_S, RESTART_CAP_S = 0.5, 30.0
PING_INTERVAL_S = 1.0
STATS_TIMEOUT_S = 2.0
# Messages waiting for the writer thread (at least 4 per concurrent chat). A live worker drains
# its pipe at once (its reader thread only queues what it reads), so a full queue means the
# worker stopped reading.
SEND_QUEUE_SIZE = 1000

# Why a worker was restarted (bot_worker_restarts_total{reason}).
EXITED, STALLED, PIPE_FULL = "exited", "stalled", "pipe_full"


class ModelStartError(Exception):
    """The worker could not load its model; the message says why."""


class ModelProcessLost(Exception):
    """The worker process died, or was killed for hanging, while a request was in flight."""


class ModelProcess:
    """One variant's worker process, as the service sees it (the engine interface of
    bot.engine.router: generate, evict, turn_stored, set_persona, close)."""

    def __init__(self, spec: ProcessSpec, store: ContextSource) -> None:
        self.spec = spec
        self.name = spec.variant
        self.store = store
        self.stall_s = spec.settings.worker_stall_s
        self.turn_timeout_s = spec.settings.generation_timeout_s
        # Room for every chat's turn at once (a restarted worker gets them all in one burst).
        self.send_queue_size = max(SEND_QUEUE_SIZE, 4 * spec.settings.max_concurrent_chats)
        self.restarts = 0
        # bot_worker_restarts_total{variant,reason}, read at scrape time (bot/service/metrics.py).
        self.restart_reasons: collections.Counter[str] = collections.Counter()
        self.info: dict[str, Any] = {}
        self._ready = asyncio.Event()
        self._lost = asyncio.Event()
        self._closing = False
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._drafts: dict[int, DraftSink] = {}  # req_id -> where its drafts go
        self._conn: Connection | None = None
        self._proc: BaseProcess | None = None
        self._sending: queue.Queue[pipe.Message | None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        # Liveness: when the worker last answered a ping, and how long its inference thread
        # had then been without progress while it had work.
        self._heard_at = time.monotonic()
        self._stuck_s = 0.0
        self._down: tuple[str, str] | None = None  # (reason, detail) while stalled/restarting

    @property
    def pid(self) -> int | None:
        """The worker's process id (None while it is down)."""
        return self._proc.pid if self._proc is not None and self._ready.is_set() else None

    @property
    def alive(self) -> bool:
        """Whether the worker is up, answering and taking turns."""
        return self._ready.is_set()

    @property
    def state(self) -> str:
        """Why the worker takes no turns now ("" while it does), for /readyz."""
        if self._ready.is_set():
            return ""
        if self._down is not None and self._down[0] != EXITED:
            return f"worker stalled ({self._down[1]}); restarting"
        return "worker down; restarting"

    async def start(self) -> None:
        """Start the worker and wait until its model is loaded; ModelStartError if it cannot."""
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(), name=f"worker:{self.name}")
        self._watcher = asyncio.create_task(self._watch(), name=f"worker-ping:{self.name}")

    async def close(self) -> None:
        """Stop the worker: ask, then kill (at once if it does not answer pings any more)."""
        self._closing = True
        await cancel_and_wait(self._supervisor, self._watcher)
        proc, conn = self._proc, self._conn
        answering = self._ready.is_set() and self._quiet_s() < 3 * PING_INTERVAL_S
        self._ready.clear()
        with contextlib.suppress(ModelProcessLost):
            self._send(pipe.Stop())
        if proc is not None:
            await asyncio.to_thread(proc.join, STOP_TIMEOUT_S if answering else 0.0)
            if proc.is_alive():
                log.warning("variant %s: worker %s did not stop; killing it", self.name, proc.pid)
                proc.kill()
                await asyncio.to_thread(proc.join, STOP_TIMEOUT_S)
        self._stop_writer()
        if conn is not None:
            conn.close()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(GenerationError(f"variant {self.name} is shutting down"))

    # --- requests --------------------------------------------------------------------------

    async def generate(
        self, session: SessionRow, user_text: str, *, on_draft: DraftSink | None = None
    ) -> Generated:
        """One turn on this variant; a lost worker's turn is sent again once it is back. The
        worker streams drafts of the reply to `on_draft` when one is given."""
        stream = on_draft is not None
        result = await self._with_context(
            lambda req_id, *, context: pipe.TurnRequest(
                req_id, session, user_text, stream, context
            ),
            session,
            on_draft,
        )
        assert isinstance(result, Generated)
        return result

    async def inspect(self, session: SessionRow) -> ModelView:
        """What this variant's model reads now for the conversation."""
        result = await self._with_context(
            lambda req_id, *, context: pipe.Inspect(req_id, session, context), session
        )
        assert isinstance(result, ModelView)
        return result

    async def _with_context(
        self, request: _Build, session: SessionRow, on_draft: DraftSink | None = None
    ) -> Generated | ModelView:
        """A request about a session, with its context sent when the worker asks for it, within
        the turn's deadline (waiting for a restarted worker included)."""
        return await within_turn_deadline(
            self, session.id, self._context_round_trips(request, session, on_draft)
        )

    async def _context_round_trips(
        self, request: _Build, session: SessionRow, on_draft: DraftSink | None
    ) -> Generated | ModelView:
        context: ConversationContext | None = None
        lost = 0
        while True:
            await self._ready.wait()
            try:
                answer = await self._request(partial(request, context=context), on_draft)
            except ModelProcessLost:
                lost += 1
                if lost >= MAX_LOST:
                    raise GenerationError(
                        f"variant {self.name}: its worker died {lost} times during this turn"
                    ) from None
                context = None  # the new worker has an empty cache: it will ask
                continue
            if isinstance(answer, pipe.NeedContext):
                context = await self.store.load_context(
                    session.id, answer.tail, session.last_message_id or 0
                )
                continue
            assert isinstance(answer, pipe.ReplyMessage)
            return answer.result

    async def stats(self, memory: bool = False) -> dict[str, Any]:
        """The worker's cache and batch figures, and with `memory` its rss and pss (a pause
        of its inference, pipe.StatsRequest); {} while it is down or does not answer within
        STATS_TIMEOUT_S: a status report never waits on a hung worker."""
        if not self._ready.is_set():
            return {}
        try:
            async with asyncio.timeout(STATS_TIMEOUT_S):
                answer = await self._request(partial(pipe.StatsRequest, memory=memory))
        except (TimeoutError, ModelProcessLost):
            return {}
        assert isinstance(answer, pipe.Stats)
        return answer.figures

    def evict(self, session_id: int) -> None:
        """Drop a conversation's clone in the worker (a restarted one has none anyway)."""
        self._tell(pipe.Evict(session_id))

    def turn_stored(self, session_id: int, last_message_id: int) -> None:
        """The worker's clone is in step with the database up to `last_message_id`."""
        self._tell(pipe.Stored(session_id, last_message_id))

    def set_persona(self, session_id: int, persona: str) -> None:
        """Nothing to do: every turn carries the session's persona, and the worker follows."""

    def _tell(self, message: pipe.Message) -> None:
        if not self._ready.is_set():
            return
        with contextlib.suppress(ModelProcessLost):  # a hung worker: the watcher restarts it
            self._send(message)

    def _send(self, message: pipe.Message) -> None:
        """Queue a message for the writer thread, never blocking; ModelProcessLost when the worker
        is down, or has stopped reading (its pipe and the queue are full: it is restarted)."""
        sending = self._sending
        if sending is None:
            raise ModelProcessLost
        try:
            sending.put_nowait(message)
        except queue.Full:
            self._stall(PIPE_FULL, f"{sending.maxsize} messages waiting: it stopped reading")
            raise ModelProcessLost from None

    async def _request(
        self, build: Callable[[int], pipe.Request], on_draft: DraftSink | None = None
    ) -> pipe.Request:
        """Send the request `build(req_id)` makes; its answer (Reply, NeedContext, Stats)."""
        req_id = next(self._ids)
        future: asyncio.Future[pipe.Request] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = future
        if on_draft is not None:
            self._drafts[req_id] = on_draft
        try:
            self._send(build(req_id))
            return await future
        finally:
            self._pending.pop(req_id, None)
            self._drafts.pop(req_id, None)

    def _on_message(self, message: pipe.Message) -> None:
        match message:
            case pipe.Pong(stuck_s=stuck_s):
                self._heard_at = time.monotonic()
                self._stuck_s = stuck_s
            case pipe.Draft(req_id=req_id, text=text):
                sink = self._drafts.get(req_id)
                if sink is not None:
                    try:
                        sink(text)
                    except Exception:
                        log.exception("variant %s: a draft could not be handed on", self.name)
            case pipe.ReplyMessage() | pipe.NeedContext() | pipe.Stats() | pipe.Error():
                future = self._pending.get(message.req_id)
                if future is None or future.done():
                    return  # its caller gave up (cancelled): the answer is dropped
                if isinstance(message, pipe.Error):
                    future.set_exception(GenerationError(f"variant {self.name}: {message.message}"))
                else:
                    future.set_result(message)
            case _:
                log.error("variant %s: unexpected message from the worker: %r", self.name, message)

    def _on_lost(self, conn: Connection) -> None:
        if conn is not self._conn:
            return
        self._ready.clear()
        self._down = self._down or (EXITED, "the process exited")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ModelProcessLost())
        self._lost.set()

    # --- liveness --------------------------------------------------------------------------

    def _quiet_s(self) -> float:
        return time.monotonic() - self._heard_at

    async def _watch(self) -> None:
        """Ping the worker once a second; restart it when it stops answering or progressing."""
        while not self._closing:
            await asyncio.sleep(PING_INTERVAL_S)
            if not self._ready.is_set():
                continue
            quiet = self._quiet_s()
            if quiet > self.stall_s:
                self._stall(STALLED, f"no answer to pings for {quiet:.1f} s")
            elif self._stuck_s > self.stall_s:
                self._stall(STALLED, f"no decoding step for {self._stuck_s:.1f} s")
            else:
                with contextlib.suppress(ModelProcessLost):
                    self._send(pipe.Ping())

    def _stall(self, reason: str, detail: str) -> None:
        """The worker hangs: take no more turns and kill it; the reader thread then sees the
        pipe close and its turns are lost and retried, as for a worker that died."""
        if not self._ready.is_set() or self._closing:
            return
        self._ready.clear()
        self._down = (reason, detail)
        proc = self._proc
        log.error(
            "variant %s: worker %s stalled (%s); killing and restarting it",
            self.name,
            proc.pid if proc is not None else None,
            detail,
        )
        if proc is not None:
            proc.kill()  # SIGKILL reaches a stopped process too

    def _stop_writer(self) -> None:
        sending, self._sending = self._sending, None
        if sending is not None:
            with contextlib.suppress(queue.Full):
                sending.put_nowait(None)  # a writer blocked in a dead pipe ends on EPIPE

    # --- the process -----------------------------------------------------------------------

    async def _spawn(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=resolve(PROCESS_MAIN),
            args=(child, self.spec),
            name=f"bot-variant-{self.name}",
            daemon=True,
        )
        proc.start()
        child.close()
        try:
            first = await asyncio.to_thread(_first_message, parent, proc)
        except asyncio.CancelledError:
            # Stopped while the model was loading: the child goes too, and with the pipe
            # closed the waiting thread returns at once (shutdown does not wait for it).
            proc.kill()
            parent.close()
            raise
        if not isinstance(first, pipe.Ready):
            await asyncio.to_thread(proc.join, STOP_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                await asyncio.to_thread(proc.join, STOP_TIMEOUT_S)
            parent.close()
            raise ModelStartError(first.reason)
        self.info = dict(first.info)
        self._conn, self._proc = parent, proc
        self._sending = queue.Queue(self.send_queue_size)
        self._heard_at, self._stuck_s, self._down = time.monotonic(), 0.0, None
        self._lost.clear()
        loop = asyncio.get_running_loop()
        threading.Thread(
            target=_read, args=(parent, loop, self), name=f"worker-pipe:{self.name}", daemon=True
        ).start()
        threading.Thread(
            target=_write,
            args=(parent, self._sending, self.name),
            name=f"worker-send:{self.name}",
            daemon=True,
        ).start()
        self._ready.set()

    async def _supervise(self) -> None:
        failures = 0
        started = time.monotonic()
        while not self._closing:
            await self._lost.wait()
            if time.monotonic() - started > 60:
                failures = 0  # it stayed up a while: the next restart starts from a short delay
            reason = self._down[0] if self._down is not None else EXITED
            self.restart_reasons[reason] += 1
            proc = self._proc
            if proc is not None:
                await asyncio.to_thread(proc.join, STOP_TIMEOUT_S)
                if reason == EXITED:
                    log.error(
                        "variant %s: worker %s died (exit code %s); restarting it",
                        self.name,
                        proc.pid,
                        proc.exitcode,
                    )
            self._stop_writer()
            if self._conn is not None:
                self._conn.close()
            self._proc = None
            while not self._closing:
                failures += 1
                await asyncio.sleep(min(RESTART_CAP_S, RESTART_FIRST_S * 2 ** (failures - 1)))
                try:
                    await self._spawn()
                except ModelStartError as err:
                    log.error("variant %s: restarting the worker failed: %s", self.name, err)
                    continue
                self.restarts += 1
                log.info("variant %s: worker restarted (pid %s)", self.name, self.pid)
                started = time.monotonic()
                break


def _first_message(conn: Connection, proc: BaseProcess) -> pipe.Ready | pipe.Failed:
    """The worker's Ready or Failed, or why there is none (a worker that speaks another
    protocol version is refused: it is not the code this service runs)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if conn.poll(0.2):
                message = conn.recv()
                if not isinstance(message, pipe.Ready | pipe.Failed):
                    return pipe.Failed(f"the worker's first message was {message!r}")
                if message.version != pipe.PROTOCOL_VERSION:
                    return pipe.Failed(
                        f"the worker speaks pipe protocol {message.version}, this service "
                        f"{pipe.PROTOCOL_VERSION}: reinstall (make install) and restart"
                    )
                return message
        except (EOFError, OSError):
            time.sleep(0.05)  # it died, or the start was cancelled (pipe closed): see below
        if not proc.is_alive():
            return pipe.Failed(f"the worker process exited with code {proc.exitcode} while loading")
    return pipe.Failed(f"the model did not load within {START_TIMEOUT_S:.0f} s")


def _read(conn: Connection, loop: asyncio.AbstractEventLoop, handle: ModelProcess) -> None:
    """The pipe's reader thread: every message to the event loop; EOF means the worker died."""
    while True:
        try:
            message = conn.recv()
        except Exception as err:  # noqa: BLE001 - EOF (it died), a broken pipe, an unreadable message
            if not isinstance(err, EOFError | OSError):
                log.error("variant %s: unreadable message from the worker: %r", handle.name, err)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
                loop.call_soon_threadsafe(handle._on_lost, conn)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(handle._on_message, message)


def _write(conn: Connection, sending: queue.Queue[pipe.Message | None], name: str) -> None:
    """The pipe's writer thread: the only place that may block on a worker (its pipe full);
    ends at None, or when the pipe breaks (the reader sees the worker gone and reports it)."""
    while (message := sending.get()) is not None:
        try:
            conn.send(message)
        except (OSError, ValueError):  # closed or broken: the worker is gone
            return
        except Exception:  # an unpicklable message fails alone
            log.exception("variant %s: a message could not be sent to the worker", name)


def process_spec(
    name: str,
    settings: Settings,
    parlai_overrides: dict[str, Any],
    threads: int | None,
    secrets: tuple[str, ...],
) -> ProcessSpec:
    """The spec of a variant's worker."""
    return ProcessSpec(
        variant=name,
        settings=settings,
        parlai_overrides=parlai_overrides,
        threads=threads or settings.worker_threads or settings.torch_threads,
        log_level=settings.log_level,
        log_format=settings.log_format,
        secrets=secrets,
    )


async def make_backend(
    variant: Variant, settings: Settings, store: ContextSource, secrets: tuple[str, ...]
) -> Backend:
    """The variant's model on this machine (`settings`: its own, Variant.settings): a worker
    process, or (MODEL_WORKERS=inline) a Responder in this process; ConfigError if it cannot
    load."""
    if settings.model_workers == "inline":
        try:
            backend: Backend = await resolve(INLINE_RESPONDER).start(
                settings, store, variant.parlai_overrides()
            )
        except ConfigError:
            raise
        except Exception as err:
            raise ConfigError(str(err) or type(err).__name__) from err
        return backend
    handle = ModelProcess(
        process_spec(variant.name, settings, variant.parlai_overrides(), variant.threads, secrets),
        store,
    )
    try:
        await handle.start()
    except ModelStartError as err:
        raise ConfigError(str(err)) from err
    return handle
