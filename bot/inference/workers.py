"""The service's side of a model worker process (bot.inference.worker): start it, send it
turns, restart it when it dies.

A worker that dies (kill -9, out of memory, a CUDA error) fails the turns it was working on
with WorkerLost; `generate` waits for the restarted worker and sends them again, so they are
answered once it is back, while other variants' workers keep answering. The restart waits with
exponential backoff, so a worker that cannot come up does not spin.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from bot.config import Settings
from bot.conversations.actions import GenerationError
from bot.conversations.drafts import DraftSink
from bot.db.conversations import SessionRow
from bot.inference.batcher import Generated, ModelView
from bot.inference.worker import WorkerSpec
from bot.tg.backoff import Backoff

if TYPE_CHECKING:  # the service process never imports torch or ParlAI: the workers do
    from bot.inference.responder import ContextSource

log = logging.getLogger(__name__)

# A turn whose worker died this many times is given up (it may be what kills the worker).
MAX_LOST = 3
START_TIMEOUT_S = 600.0  # a zoo model downloads on its first start
STOP_TIMEOUT_S = 10.0
RESTART_BACKOFF = Backoff(initial_s=0.5, factor=2.0, cap_s=30.0)


class WorkerStartError(Exception):
    """The worker could not load its model; the message says why."""


class WorkerLost(Exception):
    """The worker process died while a request was in flight."""


class _NeedContext:
    def __init__(self, tail: int | None) -> None:
        self.tail = tail


class WorkerHandle:
    """One variant's worker process, as the service sees it (the engine interface of
    bot.variants.router: generate, evict, turn_stored, set_persona, close)."""

    def __init__(self, spec: WorkerSpec, store: ContextSource) -> None:
        self.spec = spec
        self.name = spec.variant
        self.store = store
        self.restarts = 0
        self.info: dict[str, Any] = {}
        self._ready = asyncio.Event()
        self._lost = asyncio.Event()
        self._closing = False
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._drafts: dict[int, DraftSink] = {}  # req_id -> where its drafts go
        self._conn: Connection | None = None
        self._proc: BaseProcess | None = None
        self._supervisor: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        """The worker's process id (None while it is down)."""
        return self._proc.pid if self._proc is not None and self._ready.is_set() else None

    @property
    def alive(self) -> bool:
        """Whether the worker is up and taking turns."""
        return self._ready.is_set()

    async def start(self) -> None:
        """Start the worker and wait until its model is loaded; WorkerStartError if it cannot."""
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(), name=f"worker:{self.name}")

    async def close(self) -> None:
        """Stop the worker: ask, then terminate, then kill."""
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        proc, conn = self._proc, self._conn
        self._ready.clear()
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        if proc is not None:
            await asyncio.to_thread(proc.join, STOP_TIMEOUT_S)
            if proc.is_alive():
                log.warning("variant %s: worker %s did not stop; killing it", self.name, proc.pid)
                proc.kill()
                await asyncio.to_thread(proc.join, STOP_TIMEOUT_S)
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
        result = await self._with_context(
            "turn", session, user_text, on_draft is not None, on_draft=on_draft
        )
        assert isinstance(result, Generated)
        return result

    async def inspect(self, session: SessionRow) -> ModelView:
        """What this variant's model reads now for the conversation."""
        result = await self._with_context("inspect", session)
        assert isinstance(result, ModelView)
        return result

    async def _with_context(
        self, kind: str, session: SessionRow, *args: Any, on_draft: DraftSink | None = None
    ) -> Any:
        """A request about a session, with its context sent when the worker asks for it."""
        context = None
        lost = 0
        while True:
            await self._ready.wait()
            try:
                result = await self._request((kind, session, *args, context), on_draft)
            except WorkerLost:
                lost += 1
                if lost >= MAX_LOST:
                    raise GenerationError(
                        f"variant {self.name}: its worker died {lost} times during this turn"
                    ) from None
                context = None  # the new worker has an empty cache: it will ask
                continue
            if isinstance(result, _NeedContext):
                context = await self.store.load_context(
                    session.id, result.tail, session.last_message_id or 0
                )
                continue
            return result

    async def stats(self) -> dict[str, Any]:
        """The worker's cache, batch and memory figures."""
        await self._ready.wait()
        result: dict[str, Any] = await self._request(("stats",))
        return result

    def evict(self, session_id: int) -> None:
        """Drop a conversation's clone in the worker (a restarted one has none anyway)."""
        self._tell(("evict", session_id))

    def turn_stored(self, session_id: int, last_message_id: int) -> None:
        """The worker's clone is in step with the database up to `last_message_id`."""
        self._tell(("stored", session_id, last_message_id))

    def set_persona(self, session_id: int, persona: str) -> None:
        """Nothing to do: every turn carries the session's persona, and the worker follows."""

    def _tell(self, message: tuple[Any, ...]) -> None:
        if self._conn is None or not self._ready.is_set():
            return
        with contextlib.suppress(OSError):  # dying: the reader notices and restarts it
            self._conn.send(message)

    async def _request(self, message: tuple[Any, ...], on_draft: DraftSink | None = None) -> Any:
        assert self._conn is not None
        req_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = future
        if on_draft is not None:
            self._drafts[req_id] = on_draft
        try:
            try:
                self._conn.send((message[0], req_id, *message[1:]))
            except OSError:
                raise WorkerLost from None
            return await future
        finally:
            self._pending.pop(req_id, None)
            self._drafts.pop(req_id, None)

    def _on_message(self, message: tuple[Any, ...]) -> None:
        kind, req_id = message[0], message[1]
        if kind == "draft":
            sink = self._drafts.get(req_id)
            if sink is not None:
                try:
                    sink(message[2])
                except Exception:
                    log.exception("variant %s: a draft could not be handed on", self.name)
            return
        future = self._pending.get(req_id)
        if future is None or future.done():
            return  # its caller gave up (cancelled): the answer is dropped
        if kind == "reply" or kind == "stats":
            future.set_result(message[2])
        elif kind == "context":
            future.set_result(_NeedContext(message[2]))
        elif kind == "error":
            future.set_exception(GenerationError(f"variant {self.name}: {message[2]}"))

    def _on_lost(self, conn: Connection) -> None:
        if conn is not self._conn:
            return
        self._ready.clear()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(WorkerLost())
        self._lost.set()

    # --- the process -----------------------------------------------------------------------

    async def _spawn(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        from bot.inference.worker import main

        proc = ctx.Process(
            target=main, args=(child, self.spec), name=f"bot-variant-{self.name}", daemon=True
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
        if first[0] != "ready":
            await asyncio.to_thread(proc.join, STOP_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                await asyncio.to_thread(proc.join, STOP_TIMEOUT_S)
            parent.close()
            raise WorkerStartError(str(first[1]))
        self.info = dict(first[1])
        self._conn, self._proc = parent, proc
        self._lost.clear()
        loop = asyncio.get_running_loop()
        threading.Thread(
            target=_read, args=(parent, loop, self), name=f"worker-pipe:{self.name}", daemon=True
        ).start()
        self._ready.set()

    async def _supervise(self) -> None:
        failures = 0
        started = time.monotonic()
        while not self._closing:
            await self._lost.wait()
            if time.monotonic() - started > 60:
                failures = 0  # it stayed up a while: the next restart starts from a short delay
            proc = self._proc
            if proc is not None:
                await asyncio.to_thread(proc.join, STOP_TIMEOUT_S)
                log.error(
                    "variant %s: worker %s died (exit code %s); restarting it",
                    self.name,
                    proc.pid,
                    proc.exitcode,
                )
            if self._conn is not None:
                self._conn.close()
            self._proc = None
            while not self._closing:
                failures += 1
                await asyncio.sleep(RESTART_BACKOFF.delay(failures))
                try:
                    await self._spawn()
                except WorkerStartError as err:
                    log.error("variant %s: restarting the worker failed: %s", self.name, err)
                    continue
                self.restarts += 1
                log.info("variant %s: worker restarted (pid %s)", self.name, self.pid)
                started = time.monotonic()
                break


def _first_message(conn: Connection, proc: BaseProcess) -> tuple[Any, ...]:
    """The worker's ready/failed message, or why there is none."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if conn.poll(0.2):
                message: tuple[Any, ...] = conn.recv()
                return message
        except (EOFError, OSError):
            time.sleep(0.05)  # it died, or the start was cancelled (pipe closed): see below
        if not proc.is_alive():
            return ("failed", f"the worker process exited with code {proc.exitcode} while loading")
    return ("failed", f"the model did not load within {START_TIMEOUT_S:.0f} s")


def _read(conn: Connection, loop: asyncio.AbstractEventLoop, handle: WorkerHandle) -> None:
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


def worker_spec(
    name: str,
    settings: Settings,
    parlai_overrides: dict[str, Any],
    threads: int | None,
    secrets: tuple[str, ...],
) -> WorkerSpec:
    """The spec of a variant's worker."""
    return WorkerSpec(
        variant=name,
        settings=settings,
        parlai_overrides=parlai_overrides,
        threads=threads or settings.worker_threads or settings.torch_threads,
        log_level=settings.log_level,
        log_format=settings.log_format,
        secrets=secrets,
    )
