"""A variant's model on Ray Serve (MODEL_BACKEND=ray): the router's Backend over a deployment.

Each variant is one Serve application whose replicas run bot.inference.ray_server.ModelServer:
the same Responder as a model process, speaking the same typed messages (bot/engine/pipe.py)
over Serve's handle. RAY_ADDRESS names the cluster to join; unset, the first backend starts a
local Ray instance (RAY_NUM_CPUS), owned by this process, and the last one to close stops it.
No HTTP proxy is started: the service calls its deployments through handles only.

Front-ends share a variant's application (the point of model servers). Its name is the rule
that makes them meet: `<variant>-<key>`, the key a hash of the service (its database URL, the
password left out: one database, one set of session ids, which the replicas' clone caches are
keyed by) and of what the replicas load (the variant's model, threads, generation options and
sizing, bot.engine.variants.Variant.same_model) and the protocol version. So every front-end of
one service with the same variants file joins the same application; a variant changed or
reloaded with another model, another service on the same cluster, or front-ends of another
code version each get their own. The first front-end deploys it (its settings size it: cache,
batch, stall limits), the others only take its handle. Who uses which application is kept by one
small detached actor in the cluster (`_Apps`, namespace APPS_NAMESPACE, no CPU), which serializes
deploying and deleting: the last front-end to stop deletes the application; a front-end that
stops while others use it leaves it running. A front-end killed without stopping stays counted
until it has not been heard of for USER_STALE_S (each backend says it is alive with every
status poll): until then the application outlives it, which is the safe side.

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
import hashlib
import itertools
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
import urllib.parse
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from pydantic import SecretStr

from bot.config import ConfigError, Settings
from bot.db.conversations import SessionRow
from bot.engine import pipe
from bot.engine.client import within_turn_deadline
from bot.engine.protocol import (
    ContextSource,
    ConversationContext,
    DraftSink,
    Generated,
    GenerationError,
    ModelView,
)
from bot.engine.variants import Variant

if TYPE_CHECKING:
    from bot.inference.process import ProcessSpec

log = logging.getLogger(__name__)

# A request about a session, made once its req_id and context (None: not asked for yet) are
# known; and a way to send one to the session's replica with its upkeep, returning the answer.
_Build: TypeAlias = Callable[[int, ConversationContext | None], pipe.Request]
_Call: TypeAlias = Callable[[SessionRow, pipe.Request, tuple[pipe.Message, ...]], Awaitable[Any]]

# Serve's client API is not safe in two threads at once (building a deployment's config
# registers and unregisters modules with cloudpickle: a second deploy in another thread failed
# with "... is not registered for pickle by value"). Every call of it here holds this lock
# (after _Cluster's lock, where both are held).
_SERVE = threading.Lock()

START_TIMEOUT_S = 600.0  # a zoo model downloads on its first start
MAX_LOST = 3  # a turn whose replica was lost this many times is given up
RETRY_FIRST_S = 0.5  # a lost turn is sent again after this, twice as long each time
STATUS_POLL_S = 2.0
# A status poll that has not answered by then marks the variant down (it goes on waiting).
STATUS_TIMEOUT_S = 10.0
# RAY_ADDRESS's port must accept a connection within this before ray.init is tried: ray.init
# on an address nothing answers keeps retrying for a long time.
CONNECT_TIMEOUT_S = 5.0
# ray.init joining RAY_ADDRESS takes a second or two; past this it is refused or lost.
JOIN_TIMEOUT_S = 30.0
UPKEEP_SESSIONS = 100_000  # sessions with upkeep waiting for their next request
# A variant's replicas take this many requests each at once (the batcher does the rest).
ONGOING_PER_CHAT = 4
# Why a variant's deployment was seen unhealthy (restart_reasons).
UNHEALTHY = "unhealthy"


def _ray() -> tuple[Any, Any]:
    """ray and ray.serve; ConfigError when Ray is not installed."""
    # No Ray call may connect by itself (Ray's documented switch, read when ray is imported):
    # a status poll still in its thread as the backend closes would otherwise ray.init() the
    # address of the instance just stopped, retry for minutes, and hold the process's exit.
    # Every connection is made by _Cluster.acquire; a late call raises instead.
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    try:
        import ray
        from ray import serve
    except ImportError as err:
        raise ConfigError(
            f"MODEL_BACKEND=ray needs Ray Serve: pip install '.[ray]' ({err})"
        ) from None
    return ray, serve


class _Cluster:
    """This process's one connection to Ray, shared by every RayBackend: a joined cluster
    (RAY_ADDRESS, or an instance someone else started in this process), or a local instance
    started here and stopped when the last backend closes."""

    _lock = threading.Lock()
    _users = 0
    _owned = False
    _registry: Any = None  # the handle of the cluster's _Apps actor, once asked for

    @classmethod
    def apps(cls) -> Any:
        """The cluster's _Apps actor (blocking, the first time)."""
        ray, _ = _ray()
        with cls._lock:
            if cls._registry is None:
                cls._registry = _apps(ray)
            return cls._registry

    @classmethod
    def acquire(cls, settings: Settings) -> None:
        """Connect (blocking: call it in a thread)."""
        ray, serve = _ray()
        with cls._lock:
            if not ray.is_initialized():
                address = settings.ray_address
                options: dict[str, Any] = {"include_dashboard": False}
                if address is None:
                    options["num_cpus"] = settings.ray_num_cpus
                else:
                    _check_reachable(address, CONNECT_TIMEOUT_S)
                # "local": always a new instance of our own, never one `ray start` left on this
                # host; only that one is ours to shut down (a joined cluster's other
                # applications, another replica's variants included, must survive our stop).
                if address is None:
                    ray.init(address="local", **options)
                else:
                    _join(ray, address, options, JOIN_TIMEOUT_S)
                cls._owned = address is None
                log.info("ray: %s", f"joined {address}" if address else "started a local instance")
            with _SERVE:
                serve.start(proxy_location="Disabled")
            cls._users += 1

    @classmethod
    def join(cls, app: str, user: str, spec: ProcessSpec, variant: Variant) -> bool:
        """Count `user` in the application's users, deploying it unless it is there or being
        deployed (blocking); whether this call deployed it."""
        ray, serve = _ray()
        apps = cls.apps()
        deploy: bool = ray.get(apps.join.remote(app, user))
        if deploy:
            try:
                _deploy(serve, spec, variant, app)
            finally:
                ray.get(apps.deployed.remote(app))
        return deploy

    @classmethod
    def connected(cls) -> bool:
        """Whether a backend holds the connection (call it under _lock)."""
        ray, _ = _ray()
        return cls._users > 0 and ray.is_initialized()

    @classmethod
    def touch(cls, app: str, user: str) -> None:
        """Say that `user` still uses the application (fire and forget); nothing once this
        process's last backend has let the connection go (a poll can outlive its backend's
        close in its thread)."""
        with cls._lock:  # held while sending: release() cannot shut Ray down in between
            if cls._registry is not None and cls.connected():
                cls._registry.touch.remote(app, user)

    @classmethod
    def release(cls, app: str, user: str) -> None:
        """Stop using the application (deleted after its last user); stop the local instance
        after this process's last backend (blocking). Under the lock throughout: a backend's
        leave is never cut short by another one's shutdown of the local instance."""
        ray, serve = _ray()
        with cls._lock:
            cls._users -= 1
            last = cls._users == 0
            registry, cls._registry = cls._registry, None
            if last and cls._owned:
                cls._owned = False
                with _SERVE:  # a status poll sees Serve and Ray both up, or neither
                    with contextlib.suppress(Exception):
                        serve.shutdown()
                    ray.shutdown()
                log.info("ray: the local instance stopped")
                return
            try:
                registry = registry or _apps(ray)
                left = ray.get(registry.leave.remote(app, user))
            except Exception as err:  # noqa: BLE001 - the cluster is gone: nothing to delete
                log.warning("ray: leaving application %s failed: %s", app, err)
                return
            if not last:  # else the next user may be on another connection
                cls._registry = registry
        if left:
            log.info("ray: application %s kept for its %d other front-end(s)", app, left)


APPS_NAMESPACE = "telegram-bot"
APPS_ACTOR = "applications"
USER_STALE_S = 60.0  # a user not heard of for this long no longer keeps an application
CLAIM_S = 60.0  # a deploy claimed this long ago and never submitted is claimed again


class _Apps:
    """The cluster's one record of which front-ends use which application (a detached actor:
    its calls run one at a time, so deploying and deleting never race)."""

    def __init__(self) -> None:
        self.users: dict[str, dict[str, float]] = {}  # app -> user -> last heard of
        self.claims: dict[str, float] = {}  # app -> when a front-end set out to deploy it

    def join(self, app: str, user: str) -> bool:
        """Count the user; True: it is to deploy the application (absent, unclaimed)."""
        from ray import serve

        now = time.monotonic()
        self.users.setdefault(app, {})[user] = now
        if app in serve.status().applications:
            return False
        if now - self.claims.get(app, -CLAIM_S) < CLAIM_S:
            return False  # another front-end is submitting it: wait for it to appear
        self.claims[app] = now
        return True

    def deployed(self, app: str) -> None:
        """The claimant submitted the application (or failed to: then it leaves)."""
        self.claims.pop(app, None)

    def touch(self, app: str, user: str) -> None:
        self.users.setdefault(app, {})[user] = time.monotonic()

    def leave(self, app: str, user: str) -> int:
        """Uncount the user; delete the application after its last one. The users left."""
        from ray import serve

        now = time.monotonic()
        users = self.users.get(app, {})
        users.pop(user, None)
        for other, seen in list(users.items()):
            if now - seen > USER_STALE_S:
                del users[other]
        if users:
            return len(users)
        self.users.pop(app, None)
        serve.delete(app)
        return 0

    def using(self) -> dict[str, int]:
        """Each application's users (for tests and operators)."""
        return {app: len(users) for app, users in self.users.items()}


def _apps(ray: Any) -> Any:
    """The cluster's _Apps actor, started by the first front-end that asks for it."""
    return (
        ray.remote(num_cpus=0, max_restarts=-1)(_Apps)
        .options(name=APPS_ACTOR, namespace=APPS_NAMESPACE, lifetime="detached", get_if_exists=True)
        .remote()
    )


# The settings that shape a replica's model and search (the rest are the front-end's own).
REPLICA_SETTINGS = (
    "model_device",
    "torch_threads",
    "worker_threads",
    "batch_max_size",
    "batch_max_wait_ms",
    "scheduler",
    "inference",
    "beam_size",
    "beam_min_length",
    "beam_block_ngram",
    "beam_context_block_ngram",
    "search_impl",
    "quantize",
    "dtype",
    "encoder_buckets",
)


def bot_version() -> str:
    """This code's version, as installed (a new release gets its own applications)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bot")
    except PackageNotFoundError:
        return "unknown"


def app_name(variant: Variant, settings: Settings) -> str:
    """The Serve application of `variant` for the service of `settings` (its own settings,
    the database URL still in them): one name for every front-end of the service, see above."""
    from sqlalchemy.engine import URL, make_url

    url = make_url(settings.db_url)  # its password left out (URL.set cannot clear one)
    service = URL.create(url.drivername, url.username, None, url.host, url.port, url.database)
    rendered = service.render_as_string(hide_password=False)
    # What the replicas load and search with beyond the variant's own keys: a front-end
    # restarted with another DTYPE or beam size must not join replicas made with the old one.
    model = {key: getattr(settings, key) for key in REPLICA_SETTINGS}
    loaded = json.dumps(
        [pipe.PROTOCOL_VERSION, bot_version(), rendered, model, *variant.loaded()],
        default=str,
        sort_keys=True,
    )
    return f"{variant.name}-{hashlib.sha256(loaded.encode()).hexdigest()[:12]}"


def _sigterm_to_python() -> None:
    """Give SIGTERM back to Python's handler (the service's graceful stop). ray.init installs
    absl's failure signal handler in this process, for SIGTERM too: it prints a stack, calls
    the previous handler, and arms an alarm that aborts the process 3 s later (SIGABRT, in the
    middle of the drain). Its other signals (SIGSEGV, ...) keep it. Only the main thread may
    set a handler: the event loop's, where RayBackend.start runs under `python -m bot run`."""
    with contextlib.suppress(ValueError):  # not the main thread: nothing to give back here
        handler = signal.getsignal(signal.SIGTERM)
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


def _unreachable(address: str, why: str) -> str:
    return (
        f"ray: cannot join the Ray cluster at RAY_ADDRESS={address} ({why}). Start its head "
        "(`ray start --head` on the model machine) or correct RAY_ADDRESS (host:6379, or "
        "ray://host:10001); unset it to start a local Ray instance here"
    )


def _join(ray: Any, address: str, options: dict[str, Any], timeout_s: float) -> None:
    """ray.init(address), within `timeout_s`; ConfigError naming RAY_ADDRESS if it fails or
    does not return in time. A GCS that answers but refuses us (token authentication without
    our token) has ray.init retry for minutes: it runs in a daemon thread, which a process
    that gives up and exits does not wait for."""
    outcome: list[BaseException | None] = []
    done = threading.Event()

    def init() -> None:
        try:
            ray.init(address=address, **options)
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            outcome.append(err)
        finally:
            done.set()

    # Its port answers (_check_reachable): a refusal is most often the token.
    auth = (
        "; a cluster with token authentication (Ray's default) also needs RAY_AUTH_MODE=token "
        "and its token here, in RAY_AUTH_TOKEN or ~/.ray/auth_token"
    )
    threading.Thread(target=init, name="ray-join", daemon=True).start()
    if not done.wait(timeout_s):
        raise ConfigError(
            _unreachable(address, f"ray.init did not return within {timeout_s:g} s{auth}")
        )
    err = outcome[0]
    if err is not None:
        why = f"{type(err).__name__}: {err}{auth}"
        raise ConfigError(_unreachable(address, why)) from err


def _check_reachable(address: str, timeout_s: float) -> None:
    """ConfigError unless RAY_ADDRESS's port (GCS, or the Ray Client server for ray://)
    accepts a TCP connection within `timeout_s`. "auto" and other forms without a port are
    left to ray.init."""
    target = address.removeprefix("ray://")
    parts = urllib.parse.urlsplit(f"//{target}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or port is None:
        return
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError(
            _unreachable(address, f"no answer on {host}:{port}: {err.strerror or err}")
        ) from None


def _without_secrets(settings: Settings) -> Settings:
    """The settings a replica gets: every secret cleared (it never talks to Telegram or the
    database, and the deployment's arguments are stored in the cluster)."""
    cleared = {name: None for name, value in settings if isinstance(value, SecretStr)}
    return settings.model_copy(update=cleared)


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
        from bot.inference.process import ProcessSpec

        _, serve = _ray()
        spec = ProcessSpec(
            variant=variant.name,
            settings=_without_secrets(settings),
            parlai_overrides=variant.parlai_overrides(),
            threads=variant.threads or settings.worker_threads or settings.torch_threads,
            log_level=settings.log_level,
            log_format=settings.log_format,  # no secrets: the settings' are cleared above
        )
        app = app_name(variant, settings)
        user = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        await asyncio.to_thread(_Cluster.acquire, settings)
        _sigterm_to_python()
        try:
            deployed = await asyncio.to_thread(_Cluster.join, app, user, spec, variant)
            await _wait_running(
                serve, app, START_TIMEOUT_S, alive=lambda: _Cluster.touch(app, user), ours=deployed
            )
            handle = await asyncio.to_thread(_app_handle, serve, app)
            ready = await handle.ready.remote()
        except BaseException as err:
            await asyncio.to_thread(_Cluster.release, app, user)
            if isinstance(err, Exception):
                raise ConfigError(f"ray: variant {variant.name} did not deploy: {err}") from err
            raise
        if not isinstance(ready, pipe.Ready) or ready.version != pipe.PROTOCOL_VERSION:
            await asyncio.to_thread(_Cluster.release, app, user)
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
        tasks = [t for t in (self._watcher, *self._calls) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.to_thread(_Cluster.release, self.app, self.user)

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
        _, serve = _ray()
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
        status = _status(serve)
        if self.user:
            _Cluster.touch(self.app, self.user)
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
    ray, _ = _ray()
    from ray.serve.exceptions import ReplicaUnavailableError

    return (
        ray.exceptions.RayActorError,
        ray.exceptions.WorkerCrashedError,
        ray.exceptions.NodeDiedError,
        ReplicaUnavailableError,
    )


def _other_errors() -> tuple[type[BaseException], ...]:
    ray, _ = _ray()
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


def _deploy(serve: Any, spec: ProcessSpec, variant: Variant, app: str) -> None:
    """Submit the variant's application (blocking, briefly: the replicas load meanwhile, see
    _wait_running)."""
    from bot.inference.ray_server import ModelServer

    ongoing = max(ONGOING_PER_CHAT * spec.settings.max_concurrent_chats, 16)
    with _SERVE:
        _submit(serve, ModelServer, spec, variant, app, ongoing)


def _app_handle(serve: Any, app: str) -> Any:
    with _SERVE:
        return serve.get_app_handle(app)


HEALTH_CHECK_FAILURES = 3  # Serve's REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD


def _health_check_s(stall_s: float) -> float:
    """The period and the timeout of a replica's health check: a replica whose process stops
    answering is replaced about WORKER_STALL_S later (three checks unanswered); one whose
    inference thread is stuck fails its checks once stuck for WORKER_STALL_S, so it is
    replaced about twice that after its last decoding step."""
    return max(1.0, stall_s / HEALTH_CHECK_FAILURES)


def _submit(
    serve: Any, server: type, spec: ProcessSpec, variant: Variant, app: str, ongoing: int
) -> Any:
    deployment = serve.deployment(
        server,
        name="model",
        num_replicas=variant.replicas,
        ray_actor_options={"num_cpus": variant.num_cpus, "num_gpus": variant.num_gpus},
        max_ongoing_requests=ongoing,
        # WORKER_STALL_S for a replica: Serve replaces one after HEALTH_CHECK_FAILURES checks
        # in a row failed (bot.inference.ray_server.check_health: no decoding step while it
        # has work) or went unanswered (a stopped or wedged process), so each check is given a
        # share of it; the turns it held fail as lost and are sent again (_round_trips).
        health_check_period_s=_health_check_s(spec.settings.worker_stall_s),
        health_check_timeout_s=_health_check_s(spec.settings.worker_stall_s),
        # The router drains a backend's turns before it closes it (DRAIN_S): what is left
        # when the application is deleted is given a few seconds only.
        graceful_shutdown_wait_loop_s=0.5,
        graceful_shutdown_timeout_s=5.0,
    )
    return serve._run(deployment.bind(spec), _blocking=False, name=app, route_prefix=None)


def _status(serve: Any) -> Any:
    """Serve's status; RuntimeError once this process has no connection to Ray."""
    ray, _ = _ray()
    with _SERVE:
        if not ray.is_initialized():
            raise RuntimeError("not connected to Ray")
        return serve.status()


async def _wait_running(
    serve: Any, app: str, timeout_s: float, *, alive: Callable[[], None], ours: bool
) -> None:
    """Wait until the application runs; ConfigError if it fails to deploy, or in time.
    `alive` says meanwhile that this front-end still uses it (a start can take minutes, and
    _Apps forgets a user not heard of for a minute); an application another front-end
    deployed (`ours` False) may be UNHEALTHY a while, as Serve replaces a replica: only its
    failed deploy is final."""
    started = time.monotonic()
    fatal = ("DEPLOY_FAILED", "UNHEALTHY") if ours else ("DEPLOY_FAILED",)
    while time.monotonic() - started < timeout_s:
        status = await asyncio.to_thread(_status, serve)
        await asyncio.to_thread(alive)
        overview = status.applications.get(app)
        state = str(getattr(overview, "status", "")).rsplit(".", 1)[-1]
        if state == "RUNNING":
            return
        if state in fatal:
            raise ConfigError(str(overview.message or state))
        await asyncio.sleep(0.5)
    raise ConfigError(f"its replicas did not load within {timeout_s:.0f} s")
