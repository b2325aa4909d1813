"""A variant's model on Ray Serve (MODEL_BACKEND=ray): the router's Backend over a deployment.

Each variant is one Serve application (bot.engine.backends.ray.cluster deploys it, and says how
front-ends share it); this backend sends it the same typed messages as a model process's pipe
(bot/engine/pipe.py) over Serve's handle.

No database in the replicas: a replica with no up-to-date clone of a conversation answers
NeedContext, and the turn is sent again with the conversation's tail (read from the store
here), as over a model process's pipe. That round trip costs one message on a cache miss only;
sending the tail with every turn would cost it always, to save a round trip on misses.

Sticky routing by Serve's model multiplexing, keyed on the session id: every request about a
session carries `multiplexed_model_id="session-<id>"`, the replica registers it (`_pin`), and
Serve's router sends the session's next requests to the replica that holds it, while that
replica lives, has it in its LRU (as long as its clone cache) and is not saturated; a new id
goes to the replica holding the fewest. A hash over the replicas would need the replica list,
which a handle does not expose, and would move most sessions whenever the replica count
changes; multiplexing follows Serve's own view of the replicas, and moves only what it must.
Stickiness is a matter of speed, never of correctness: a replica that is not the one holding
the clone rebuilds it from the context, and a stale clone is never used (see Responder).

Cache upkeep is ordered by riding on the session's next request (see ray_server): Stored is
only sent that way; Evict is also sent at once, to free the clone's memory. Each front-end
keeps its own: a chat whose next turn another front-end takes (its lease moved) costs at most
one rebuild, never a stale clone.

Drafts stream back over the handle (`stream=True`) into the turn's `on_draft`. A replica that
dies during a turn (its actor lost) fails the call; the turn is sent again (at most MAX_LOST
times), to a replica Serve keeps or starts, which asks for the context. Every turn has a
deadline (GENERATION_TIMEOUT_S). A replica that stalls (no decoding step while it has work)
or stops answering is replaced by Serve's health check, sized from WORKER_STALL_S
(_health_check_s), and its turns are sent again the same way. `alive` and `state` follow
Serve's status of the application, read every STATUS_POLL_S off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import socket
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

from bot.config import ConfigError, Settings
from bot.db.conversations import SessionRow
from bot.engine import pipe
from bot.engine.backends.deadline import within_turn_deadline
from bot.engine.backends.ray import cluster
from bot.engine.protocol import (
    ContextSource,
    ConversationContext,
    DraftSink,
    Generated,
    GenerationError,
    ModelView,
)
from bot.engine.spec import Backend, ProcessSpec
from bot.engine.variants import Variant
from bot.tasks import cancel_and_wait

# The logger keeps the name of the module this code came from (bot/engine/ray_backend.py):
# log filters and dashboards that select it keep working.
log = logging.getLogger("bot.engine.ray_backend")

# A request about a session, made once its req_id and context (None: not asked for yet) are
# known; and a way to send one to the session's replica with its upkeep, returning the answer.
_Build: TypeAlias = Callable[[int, ConversationContext | None], pipe.Request]
_Call: TypeAlias = Callable[[SessionRow, pipe.Request, tuple[pipe.Message, ...]], Awaitable[Any]]

START_TIMEOUT_S = 600.0  # a zoo model downloads on its first start
MAX_LOST = 3  # a turn whose replica was lost this many times is given up
RETRY_FIRST_S = 0.5  # a lost turn is sent again after this, twice as long each time
STATUS_POLL_S = 2.0
# A status poll that has not answered by then marks the variant down (it goes on waiting).
STATUS_TIMEOUT_S = 10.0
UPKEEP_SESSIONS = 100_000  # sessions with upkeep waiting for their next request
# Why a variant's deployment was seen unhealthy (restart_reasons).
UNHEALTHY = "unhealthy"


class RayBackend:
    """One variant's Serve application, as the router sees it (bot.engine.router.Backend)."""

    def __init__(
        self,
        name: str,
        app: str,
        handle: Any,
        store: ContextSource,
        settings: Settings,
        user: str = "",
    ) -> None:
        self.name = name
        self.app = app
        self.user = user  # this backend, among the application's users (_Apps)
        self.store = store
        self.turn_timeout_s = settings.generation_timeout_s
        self.info: dict[str, Any] = {}
        self.restart_reasons: Counter[str] = Counter()
        self.lost_turns = 0  # requests sent again because their replica was lost
        self._handle = handle
        self._ids = itertools.count(1)
        # session id -> the Evict/Stored its next request carries (the newest Stored only).
        self._upkeep: OrderedDict[int, tuple[bool, pipe.Stored | None]] = OrderedDict()
        # session id -> the replica that made its latest reply (whose clone a Stored is for).
        self._made_by: OrderedDict[int, str | None] = OrderedDict()
        self._calls: set[asyncio.Task[None]] = set()
        self._alive = True
        self._state = ""
        self._unhealthy = False
        self._closed = False
        self._watcher: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, variant: Variant, settings: Settings, store: ContextSource) -> RayBackend:
        """Deploy the variant (`settings`: its own, bot.engine.variants.Variant.settings) and
        wait until its replicas have loaded the model; ConfigError if they cannot."""
        _, serve = cluster._ray()
        spec = ProcessSpec(
            variant=variant.name,
            settings=cluster._without_secrets(settings),
            parlai_overrides=variant.parlai_overrides(),
            threads=variant.threads or settings.worker_threads or settings.torch_threads,
            log_level=settings.log_level,
            log_format=settings.log_format,  # no secrets: the settings' are cleared above
        )
        app = cluster.app_name(variant, settings)
        user = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        await asyncio.to_thread(cluster._Cluster.acquire, settings)
        cluster._sigterm_to_python()
        try:
            deployed = await asyncio.to_thread(cluster._Cluster.join, app, user, spec, variant)
            await cluster._wait_running(
                serve,
                app,
                START_TIMEOUT_S,
                alive=lambda: cluster._Cluster.touch(app, user),
                ours=deployed,
            )
            handle = await asyncio.to_thread(cluster._app_handle, serve, app)
            ready = await handle.ready.remote()
        except BaseException as err:
            await asyncio.to_thread(cluster._Cluster.release, app, user)
            if isinstance(err, Exception):
                raise ConfigError(f"ray: variant {variant.name} did not deploy: {err}") from err
            raise
        if not isinstance(ready, pipe.Ready) or ready.version != pipe.PROTOCOL_VERSION:
            await asyncio.to_thread(cluster._Cluster.release, app, user)
            raise ConfigError(
                f"ray: variant {variant.name}'s replicas speak another protocol "
                f"({getattr(ready, 'version', ready)!r}, this service {pipe.PROTOCOL_VERSION}): "
                "install the same code on the cluster"
            )
        backend = cls(variant.name, app, handle, store, settings, user)
        backend.info = dict(ready.info)
        backend._watcher = asyncio.create_task(backend._watch(), name=f"ray-status:{app}")
        how = "deployed" if deployed else "joined"
        log.info("variant %s: ray application %s %s, serving", variant.name, app, how)
        return backend

    # --- the router's Backend ----------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether Serve has a running replica of the variant (as of its last status)."""
        return self._alive and not self._closed

    @property
    def state(self) -> str:
        """Why it takes no turns now ("" while it does), for /readyz."""
        return "" if self.alive else self._state or "ray application stopped"

    async def close(self) -> None:
        """Leave the application: deleted after its last front-end (and the local Ray instance
        stopped after this process's last backend)."""
        if self._closed:
            return
        self._closed = True
        await cancel_and_wait(self._watcher, *self._calls, raise_errors=False)
        await asyncio.to_thread(cluster._Cluster.release, self.app, self.user)

    async def generate(
        self, session: SessionRow, user_text: str, *, on_draft: DraftSink | None = None
    ) -> Generated:
        """One turn on this variant; drafts of the reply to `on_draft` when one is given."""
        stream = on_draft is not None

        def build(req_id: int, context: ConversationContext | None) -> pipe.Request:
            return pipe.TurnRequest(req_id, session, user_text, stream, context)

        result = await self._with_context(build, session, self._turn_call(on_draft))
        assert isinstance(result, Generated)
        return result

    async def inspect(self, session: SessionRow) -> ModelView:
        """What this variant's model reads now for the conversation."""

        def build(req_id: int, context: ConversationContext | None) -> pipe.Request:
            return pipe.Inspect(req_id, session, context)

        result = await self._with_context(build, session, self._inspect_call)
        assert isinstance(result, ModelView)
        return result

    def evict(self, session_id: int) -> None:
        """Drop the clone: at once (best effort), and with the session's next request."""
        self._note(session_id, evict=True)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # not on the loop: the next request carries it
        response = self._session(session_id).evict.remote(session_id)
        task = asyncio.create_task(self._settle(response), name=f"ray-evict:{self.name}")
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    def turn_stored(self, session_id: int, last_message_id: int) -> None:
        """The clone is in step up to `last_message_id`: said with the session's next request,
        to the clone of the replica that made the turn only. The next request may land on
        another replica, whose clone of the session (if it has one) missed this turn: taking
        the Stored there would make that stale clone look fresh (found by the contract test)."""
        replica = self._made_by.pop(session_id, None)
        self._note(session_id, stored=pipe.Stored(session_id, last_message_id, replica))

    def set_persona(self, session_id: int, persona: str) -> None:
        """Nothing to do: every turn carries the session's persona, and the replica follows."""

    # --- requests ----------------------------------------------------------------------------

    def _session(self, session_id: int) -> Any:
        """The handle for requests about a session: to the replica that holds it."""
        return self._handle.options(multiplexed_model_id=f"session-{session_id}")

    def _note(
        self, session_id: int, *, evict: bool = False, stored: pipe.Stored | None = None
    ) -> None:
        was_evicted, was_stored = self._upkeep.pop(session_id, (False, None))
        # An Evict drops whatever the clone had; a later Stored names the newest turn.
        self._upkeep[session_id] = (was_evicted or evict, None if evict else stored or was_stored)
        while len(self._upkeep) > UPKEEP_SESSIONS:
            self._upkeep.popitem(last=False)

    def _take_upkeep(self, session_id: int) -> tuple[pipe.Message, ...]:
        evict, stored = self._upkeep.pop(session_id, (False, None))
        messages: list[pipe.Message] = [pipe.Evict(session_id)] if evict else []
        if stored is not None:
            messages.append(stored)
        return tuple(messages)

    def _give_back(self, session_id: int, upkeep: tuple[pipe.Message, ...]) -> None:
        """A request that failed: its upkeep waits for the next one, before what came since."""
        old_evict = any(isinstance(m, pipe.Evict) for m in upkeep)
        old_stored = next((m for m in upkeep if isinstance(m, pipe.Stored)), None)
        evict, stored = self._upkeep.pop(session_id, (False, None))
        if stored is None and not evict:
            stored = old_stored
        if old_evict or evict or stored is not None:
            self._upkeep[session_id] = (old_evict or evict, stored)

    async def _with_context(
        self, build: _Build, session: SessionRow, call: _Call
    ) -> Generated | ModelView:
        """A request about a session, sent again with its context when the replica asks for it,
        and after a lost replica, within the turn's deadline."""
        return await within_turn_deadline(self, session.id, self._round_trips(build, session, call))

    async def _round_trips(
        self, build: _Build, session: SessionRow, call: _Call
    ) -> Generated | ModelView:
        context: ConversationContext | None = None
        lost = asked = 0
        while True:
            upkeep = self._take_upkeep(session.id)
            try:
                answer = await call(session, build(next(self._ids), context), upkeep)
            except _Lost as err:
                self._give_back(session.id, upkeep)
                lost += 1
                self.lost_turns += 1
                if lost >= MAX_LOST:
                    raise GenerationError(
                        f"variant {self.name}: its replica was lost {lost} times during this "
                        f"turn ({err})"
                    ) from None
                log.warning("variant %s: replica lost (%s); sending the turn again", self.name, err)
                context = None
                await asyncio.sleep(RETRY_FIRST_S * 2 ** (lost - 1))
                continue
            except BaseException:
                self._give_back(session.id, upkeep)
                raise
            if isinstance(answer, pipe.NeedContext):
                # The request went to a replica without the clone; the one with it may get the
                # request sent again and needs the upkeep too (its Stored above all: without
                # it, its clone would look stale and be rebuilt; found by the contract test).
                self._give_back(session.id, upkeep)
                asked += 1
                if asked > MAX_LOST:  # the context it was sent did not serve: not a loop forever
                    raise GenerationError(f"variant {self.name}: the replica refused the context")
                context = await self.store.load_context(
                    session.id, answer.tail, session.last_message_id or 0
                )
                continue
            if isinstance(answer, pipe.Error):
                raise GenerationError(f"variant {self.name}: {answer.message}")
            if not isinstance(answer, pipe.ReplyMessage):
                raise GenerationError(f"variant {self.name}: unexpected answer {answer!r}")
            if isinstance(answer.result, Generated):
                self._made_by.pop(session.id, None)
                self._made_by[session.id] = answer.result.replica
                while len(self._made_by) > UPKEEP_SESSIONS:
                    self._made_by.popitem(last=False)
            return answer.result

    def _turn_call(self, on_draft: DraftSink | None) -> _Call:
        async def call(
            session: SessionRow, request: pipe.Request, upkeep: tuple[pipe.Message, ...]
        ) -> pipe.Message | None:
            stream = self._session(session.id).options(stream=True).turn.remote(request, upkeep)
            answer: pipe.Message | None = None
            try:
                async for message in _errors_mapped(stream):
                    if isinstance(message, pipe.Draft):
                        self._draft(on_draft, message.text)
                    else:
                        answer = message
            finally:
                if answer is None:  # cancelled, timed out or lost: the replica stops the turn
                    _cancel(stream)
            return answer

        return call

    async def _inspect_call(
        self, session: SessionRow, request: pipe.Request, upkeep: tuple[pipe.Message, ...]
    ) -> Any:
        response = self._session(session.id).inspect.remote(request, upkeep)
        try:
            return await _mapped(response)
        except asyncio.CancelledError:
            _cancel(response)
            raise

    def _draft(self, sink: DraftSink | None, text: str) -> None:
        if sink is None:
            return
        try:
            sink(text)
        except Exception:
            log.exception("variant %s: a draft could not be handed on", self.name)

    async def _settle(self, response: Any) -> None:
        with contextlib.suppress(Exception):
            await response

    # --- status ------------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Poll Serve's status. A poll that does not answer within STATUS_TIMEOUT_S (a cluster
        whose head is gone can leave it waiting for a minute or more) marks the variant down
        and is waited for further: never two polls at once, so no thread piles up."""
        _, serve = cluster._ray()
        poll: asyncio.Future[Any] | None = None
        try:
            while not self._closed:
                await asyncio.sleep(STATUS_POLL_S)
                if poll is None:
                    poll = asyncio.ensure_future(asyncio.to_thread(self._poll, serve))
                done, _ = await asyncio.wait({poll}, timeout=STATUS_TIMEOUT_S)
                if not done:
                    self._set(
                        False,
                        f"ray status: no answer within {STATUS_TIMEOUT_S:g} s "
                        "(is the cluster reachable?)",
                    )
                    continue
                finished, poll = poll, None
                try:
                    status = finished.result()
                except Exception as err:  # noqa: BLE001 - the cluster does not answer
                    self._set(False, f"ray status unknown ({type(err).__name__}: {err})")
                    continue
                self._follow(status.applications.get(self.app))
        finally:
            if poll is not None:
                poll.cancel()

    def _poll(self, serve: Any) -> Any:
        """Serve's status, and this backend's word that it still uses the application
        (blocking)."""
        status = cluster._status(serve)
        if self.user:
            cluster._Cluster.touch(self.app, self.user)
        return status

    def _follow(self, app: Any) -> None:
        """Serve's view of the application: running while a replica of it runs."""
        if app is None:
            self._set(False, f"ray application {self.app} is gone")
            return
        running, why, unhealthy = 0, str(getattr(app, "message", "") or ""), False
        for deployment in app.deployments.values():
            states = {str(k).rsplit(".", 1)[-1]: n for k, n in deployment.replica_states.items()}
            running += int(states.get("RUNNING", 0))
            status = str(deployment.status).rsplit(".", 1)[-1]
            unhealthy = unhealthy or status == "UNHEALTHY"
            why = why or str(deployment.message or status)
        if unhealthy and not self._unhealthy:
            self.restart_reasons[UNHEALTHY] += 1  # once per episode: Serve replaces replicas
        self._unhealthy = unhealthy
        if running:
            self._set(True, "")
        else:
            self._set(False, f"ray: no replica running ({why or app.status})")

    def _set(self, alive: bool, why: str) -> None:
        if alive != self._alive:
            if alive:
                log.info("variant %s: ray replicas are back", self.name)
            else:
                log.error("variant %s: takes no turns: %s", self.name, why)
        self._alive, self._state = alive, why


class _Lost(Exception):
    """The replica serving a request was lost (its actor died, or is unreachable)."""


def _lost_errors() -> tuple[type[BaseException], ...]:
    ray, _ = cluster._ray()
    from ray.serve.exceptions import ReplicaUnavailableError

    return (
        ray.exceptions.RayActorError,
        ray.exceptions.WorkerCrashedError,
        ray.exceptions.NodeDiedError,
        ReplicaUnavailableError,
    )


def _other_errors() -> tuple[type[BaseException], ...]:
    ray, _ = cluster._ray()
    from ray.serve.exceptions import RayServeException

    return (ray.exceptions.RayError, RayServeException)


async def _mapped(response: Awaitable[Any]) -> Any:
    """A unary call's answer; _Lost or GenerationError for Ray's failures."""
    try:
        return await response
    except _lost_errors() as err:
        raise _Lost(f"{type(err).__name__}: {err}") from err
    except _other_errors() as err:
        raise GenerationError(f"ray: {type(err).__name__}: {err}") from err


async def _errors_mapped(stream: Any) -> AsyncIterator[Any]:
    """A streaming call's messages; _Lost or GenerationError for Ray's failures."""
    try:
        async for message in stream:
            yield message
    except _lost_errors() as err:
        raise _Lost(f"{type(err).__name__}: {err}") from err
    except _other_errors() as err:
        raise GenerationError(f"ray: {type(err).__name__}: {err}") from err


def _cancel(response: Any) -> None:
    """Cancel a call, off the event loop (Serve's cancel may wait for the replica's answer)."""
    with contextlib.suppress(RuntimeError):
        asyncio.get_running_loop().run_in_executor(None, response.cancel)


async def make_backend(
    variant: Variant, settings: Settings, store: ContextSource, _secrets: tuple[str, ...]
) -> Backend:
    """The variant's Serve application (its replicas get no secret: `_secrets` unused)."""
    return await RayBackend.start(variant, settings, store)
