"""MODEL_BACKEND=ray's cluster side: this process's connection to Ray, the applications the
front-ends share, and a variant's deployment (bot.engine.backends.ray.backend is the router's
Backend over it).

Each variant is one Serve application whose replicas run bot.inference.ray_server.ModelServer
(named by bot.engine.spec.RAY_SERVER: the service never imports the model's side). RAY_ADDRESS
names the cluster to join; unset, the first backend starts a local Ray instance (RAY_NUM_CPUS),
owned by this process, and the last one to close stops it. No HTTP proxy is started: the service
calls its deployments through handles only.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from bot.config import ConfigError, Settings
from bot.engine import pipe
from bot.engine.spec import RAY_SERVER, ProcessSpec, resolve

if TYPE_CHECKING:
    from bot.engine.variants import Variant

# The logger keeps the name of the module this code came from (bot/engine/ray_backend.py):
# log filters and dashboards that select it keep working.
log = logging.getLogger("bot.engine.ray_backend")

# Serve's client API is not safe in two threads at once (building a deployment's config
# registers and unregisters modules with cloudpickle: a second deploy in another thread failed
# with "... is not registered for pickle by value"). Every call of it here holds this lock
# (after _Cluster's lock, where both are held).
_SERVE = threading.Lock()

# RAY_ADDRESS's port must accept a connection within this before ray.init is tried: ray.init
# on an address nothing answers keeps retrying for a long time.
CONNECT_TIMEOUT_S = 5.0
# ray.init joining RAY_ADDRESS takes a second or two; past this it is refused or lost.
JOIN_TIMEOUT_S = 30.0
# A variant's replicas take this many requests each at once (the batcher does the rest).
ONGOING_PER_CHAT = 4


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


def _deploy(serve: Any, spec: ProcessSpec, variant: Variant, app: str) -> None:
    """Submit the variant's application (blocking, briefly: the replicas load meanwhile, see
    _wait_running)."""
    ongoing = max(ONGOING_PER_CHAT * spec.settings.max_concurrent_chats, 16)
    with _SERVE:
        _submit(serve, resolve(RAY_SERVER), spec, variant, app, ongoing)


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
