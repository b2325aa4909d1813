"""The variants' backends this replica serves: started, followed as the stored experiment
changes, drained when removed or replaced (bot.engine.router's VariantResponder routes the
chats' turns over them).

Every POLL_S it reads the experiment's version and, when it moved, follows: a new variant's
backend starts in the background; a removed variant's backend stops once its turns in flight
are answered (at most DRAIN_S); a variant that cannot load is logged and shown in
`load_errors`, and tried again every RETRY_LOAD_S. A turn for a variant whose backend is
starting here waits for it (at most WAIT_LOAD_S).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import KW_ONLY, InitVar, dataclass, field

from bot.config import Settings
from bot.db import variants as stored
from bot.engine import live
from bot.engine.backends.registry import backend_kind
from bot.engine.protocol import VariantStore
from bot.engine.spec import Backend, resolve
from bot.engine.variants import Experiment, Variant
from bot.tasks import cancel_and_wait

# The logger keeps the name of the module this code came from (bot/engine/router.py): log
# filters and dashboards that select it keep working.
log = logging.getLogger("bot.engine.router")

POLL_S = 2.0  # how often a replica reads the experiment's version (a change shows within this)
DRAIN_S = 60.0  # the longest a removed variant's turns in flight keep its backend running
RETRY_LOAD_S = 30.0  # a variant that could not load is tried again after this
WAIT_LOAD_S = 120.0  # a turn for a variant whose backend is starting here waits this long


class VariantUnavailable(RuntimeError):
    """The chat's variant has no backend on this replica (it cannot load here); the turn stays
    pending and is retried, here or on a replica that serves the variant."""


@dataclass(eq=False, repr=False)
class ServedVariants:
    """The experiment's variants and the backend of each that serves here."""

    experiment: Experiment
    backends: dict[str, Backend]
    store: VariantStore
    _: KW_ONLY
    settings: InitVar[Settings | None] = None
    secrets: InitVar[tuple[str, ...]] = ()
    poll_s: float = POLL_S
    # id(backend) -> turns it is answering
    _inflight: dict[int, int] = field(init=False, default_factory=dict)
    # set when a draining backend's turns are done
    _idle: dict[int, asyncio.Event] = field(init=False, default_factory=dict)
    _loading: dict[str, asyncio.Task[None]] = field(init=False, default_factory=dict)
    _draining: set[asyncio.Task[None]] = field(init=False, default_factory=set)
    # Variants this replica cannot serve: name -> why (its status and the log say so).
    load_errors: dict[str, str] = field(init=False, default_factory=dict)
    _failed: dict[str, tuple[Variant, float]] = field(init=False, default_factory=dict)
    _follow_lock: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)
    _watcher: asyncio.Task[None] | None = field(init=False, default=None)

    def __post_init__(self, settings: Settings | None, secrets: tuple[str, ...]) -> None:
        self._settings = settings
        self._secrets = secrets
        # The definition each backend was started from (a variant removed and added again
        # with another model between two polls gets a new backend).
        self._defs: dict[str, Variant] = {v.name: v for v in self.experiment.variants}

    def follow(self) -> None:
        """Start following the database's changes of the experiment (every `poll_s`)."""
        if self._watcher is None and self._settings is not None:
            self._watcher = asyncio.create_task(self._follow_forever(), name="variants")

    async def _follow_forever(self) -> None:
        failures = 0
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.refresh()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - the database is down: try again
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    log.warning("reading the variants failed (%s: %s)", type(err).__name__, err)

    async def refresh(self) -> bool:
        """Follow the stored experiment if it changed; True if it did."""
        if self._settings is None:
            return False
        settings = self._settings
        async with self._follow_lock:
            async with self.store.sessionmaker() as db:
                version = await stored.version(db, self.experiment.name)
            retry = any(time.monotonic() - at >= RETRY_LOAD_S for _, at in self._failed.values())
            if version is None or (version == self.experiment.version and not retry):
                return False
            loaded = await live.read(self.store.sessionmaker, self.experiment.name, settings)
            if loaded is None:
                return False
            self._apply(loaded)
            return True

    def _apply(self, loaded: live.Loaded) -> None:
        new = loaded.experiment
        before = self.experiment
        for name in list(self.backends):
            if new.get(name) is None:
                log.info("variant %s was removed: no new chats; its worker stops", name)
                self._retire(name)
        self.experiment = new
        for variant in new.variants:
            name = variant.name
            if name in loaded.problems:
                self._fail(variant, loaded.problems[name])
                continue
            if name in self._loading:
                continue
            running = self._defs.get(name)
            if name in self.backends and running is not None and running.same_model(variant):
                self._defs[name] = variant  # the same backend; its identity may be new
                continue
            failed = self._failed.get(name)
            if (
                failed is not None
                and failed[0].same_model(variant)
                and time.monotonic() - failed[1] < RETRY_LOAD_S
            ):
                continue
            self._loading[name] = asyncio.create_task(
                self._load(variant), name=f"variant-start:{name}"
            )
        for name in list(self.load_errors):
            if new.get(name) is None:
                self.load_errors.pop(name, None)
                self._failed.pop(name, None)
        if before.version != new.version:
            log.info(
                "experiment %s version %d (%s allocation): %s; control %s",
                new.name,
                new.version,
                new.allocation,
                ", ".join(f"{v.name} (weight {v.weight:g})" for v in new.variants),
                new.control.name if any(v.control for v in new.variants) else "none",
            )

    def _fail(self, variant: Variant, why: str) -> None:
        if self.load_errors.get(variant.name) != why:
            log.error(
                "variant %s cannot be served here: %s; the other variants keep serving",
                variant.name,
                why,
            )
        self.load_errors[variant.name] = why
        self._failed[variant.name] = (variant, time.monotonic())

    async def _load(self, variant: Variant) -> None:
        """Start a variant's backend (off the event loop: a worker process, or a thread for
        an inline model) and serve it once it is up, if it is still wanted."""
        name = variant.name
        assert self._settings is not None
        try:
            backend = await start_backend(variant, self._settings, self.store, self._secrets)
        except Exception as err:  # noqa: BLE001 - one variant's failure, reported
            self._fail(variant, str(err) or type(err).__name__)
            return
        finally:
            self._loading.pop(name, None)
        wanted = self.experiment.get(name)
        if wanted is None or not wanted.same_model(variant):
            await backend.close()  # removed or changed again while it loaded
            return
        old = self.backends.get(name)
        self.backends[name] = backend
        self._defs[name] = wanted  # the same model; its identity as the experiment has it now
        self.load_errors.pop(name, None)
        self._failed.pop(name, None)
        if old is not None:
            self._drain(name, old)
        log.info("variant %s is serving (%s)", name, variant.model)

    def _retire(self, name: str) -> None:
        backend = self.backends.pop(name)
        self._defs.pop(name, None)
        self._drain(name, backend)

    def _drain(self, name: str, backend: Backend) -> None:
        task = asyncio.create_task(self._stop_when_idle(name, backend), name=f"variant-stop:{name}")
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    async def _stop_when_idle(self, name: str, backend: Backend) -> None:
        key = id(backend)
        if self._inflight.get(key, 0) > 0:
            idle = self._idle.setdefault(key, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(DRAIN_S):
                    await idle.wait()
        self._idle.pop(key, None)
        left = self._inflight.pop(key, 0)
        if left:
            log.warning("variant %s: stopping with %d turn(s) still in flight", name, left)
        await backend.close()
        log.info("variant %s: its old worker stopped", name)

    @contextlib.contextmanager
    def _serving(self, backend: Backend) -> Iterator[None]:
        key = id(backend)
        self._inflight[key] = self._inflight.get(key, 0) + 1
        try:
            yield
        finally:
            self._inflight[key] -= 1
            if not self._inflight[key] and key in self._idle:
                self._idle[key].set()  # a removed variant's last turn: its backend may stop

    async def _backend(self, name: str) -> Backend:
        """The variant's backend; waits for one that is starting here."""
        backend = self.backends.get(name)
        if backend is not None:
            return backend
        loading = self._loading.get(name)
        if loading is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WAIT_LOAD_S):
                    await asyncio.shield(loading)
            backend = self.backends.get(name)
            if backend is not None:
                return backend
        why = self.load_errors.get(name, "its backend is not started here")
        raise VariantUnavailable(f"variant {name} cannot answer on this replica: {why}")

    async def close(self) -> None:
        """Stop following, and stop every backend."""
        await cancel_and_wait(self._watcher, *self._loading.values(), raise_errors=False)
        await cancel_and_wait(*self._draining, raise_errors=False)
        await asyncio.gather(*(e.close() for e in self.backends.values()), return_exceptions=True)

    @property
    def ready(self) -> list[str]:
        """The variants this replica answers now, in the experiment's order."""
        return [name for name in self.experiment.names if name in self.backends]


async def start_backend(
    variant: Variant, settings: Settings, store: VariantStore, secrets: tuple[str, ...]
) -> Backend:
    """The variant's backend, by MODEL_BACKEND (bot.engine.backends), with its own settings."""
    make_backend = resolve(backend_kind(settings).factory)
    backend: Backend = await make_backend(variant, variant.settings(settings), store, secrets)
    return backend
