"""`python -m bot run`: the Telegram service, built (build_service) from the settings and wired
along a text message's way (docs/architecture.md); bot/runtime.py's Service starts and stops it.

ingest (polling or webhook) -> inbox -> inbox worker -> handlers -> use cases (+ responder)
-> outbox -> delivery. python-telegram-bot supplies the Bot API client, the rate limiter and
handler dispatch; its Updater is not used, because it acknowledges updates before they are
handled (see the ingest module).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Collection
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from telegram.error import InvalidToken, NetworkError
from telegram.ext import ApplicationBuilder

from bot.config import ConfigError, Settings
from bot.conversations.store import ConversationStore
from bot.conversations.usecases import UseCases
from bot.db import migrate
from bot.db.engine import make_engine, make_sessionmaker
from bot.logs import settings_secrets
from bot.model_files import unservable_model, zoo_refusal
from bot.runtime import Service, ServingResponder
from bot.service.access import Access
from bot.service.budget import BudgetedRateLimiter, SendBudget
from bot.service.delivery import Delivery
from bot.service.health import Health, OpsServer
from bot.service.heartbeat import Heartbeat, new_owner
from bot.service.inbox import InboxWorker
from bot.service.leases import Leases
from bot.service.metrics import Metrics
from bot.service.retry import Backoff, Interrupted, retry
from bot.tg import feedback
from bot.tg.api_request import BoundedJsonRequest
from bot.tg.handlers import App, Handlers
from bot.tg.ingest import PollingIngest, WebhookIngest
from bot.tg.poller import ElectedPolling
from bot.tg.runner import UpdateRunner

log = logging.getLogger(__name__)

# A 429 is waited out inside PTB's rate limiter this many times before delivery sees it
# (PTB's default of 0 would hand every 429 to the error handler and lose the reply).
RATE_LIMIT_RETRIES = 3
BAD_TOKEN = "the Bot API rejected TELEGRAM_BOT_TOKEN; check the token from @BotFather"


ResponderFactory = Callable[[Settings, ConversationStore], Awaitable[ServingResponder]]


async def _load_responder(settings: Settings, store: ConversationStore) -> ServingResponder:
    from bot.engine.router import VariantResponder
    from bot.logs import settings_secrets

    return await VariantResponder.start(settings, store, tuple(settings_secrets(settings)))


def build_application(
    settings: Settings,
    budget: SendBudget,
    *,
    timeout_s: float = 15.0,
    metrics: Metrics | None = None,
) -> App:
    """The PTB application: our base URL, a rate limiter with retries drawing on the bot's
    send budget (which the drafts share), and no Updater.

    `timeout_s` bounds each Bot API request (getUpdates adds its long-poll time to it). The
    HTTP clients are PTB's request interface on aiohttp (bot/tg/aiohttp_request.py), with PTB's
    pool sizes, reading answers with a depth bound.
    """

    def request(pool_size: int) -> BoundedJsonRequest:
        return BoundedJsonRequest(
            connection_pool_size=pool_size,
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
            write_timeout=timeout_s,
            pool_timeout=timeout_s,
            observe=metrics.telegram_request if metrics is not None else None,
        )

    return (
        ApplicationBuilder()
        .token(settings.require_token())
        .base_url(settings.telegram_base_url)
        .updater(None)
        .rate_limiter(BudgetedRateLimiter(budget, max_retries=RATE_LIMIT_RETRIES))
        .request(request(256))
        .get_updates_request(request(1))
        .build()
    )


def worker_pids(variants: object) -> dict[str, int]:
    """Variant -> the pid of its model worker process now, for the variants served by one
    (bot.engine.backends.local.ModelProcess, in the router's `backends`); none for inline or Ray
    backends, nor for a worker that is down."""
    from bot.engine.backends.local import ModelProcess

    backends = getattr(variants, "backends", {})
    return {
        name: backend.pid
        for name, backend in list(backends.items())  # a copy: variants load meanwhile
        if isinstance(backend, ModelProcess) and backend.pid is not None
    }


def build_labels(settings: Settings) -> dict[str, str]:
    """bot_build_info's labels: what runs here (versions read from the installed packages'
    metadata; torch and ParlAI are not imported for it)."""
    import platform
    from importlib import metadata

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "none"

    return {
        "version": version("bot"),
        "python": platform.python_version(),
        "torch": version("torch"),
        "parlai": version("parlai"),
        "model": settings.model_file,
        "model_backend": settings.model_backend,
    }


def build_service(
    settings: Settings,
    db_engine: AsyncEngine,
    sessionmaker: async_sessionmaker[AsyncSession],
    responder: ServingResponder,
    application: App,
    budget: SendBudget,
    *,
    backoff: Backoff | None,
    metrics: Metrics,
) -> Service:
    """Every part of the running bot, made from the settings and wired along a text message's
    way; the Service only starts and stops them."""
    store = ConversationStore(sessionmaker)
    cases = UseCases(store, responder, settings)
    _watch(metrics, responder, settings)
    # ALLOWED_USERS / ALLOWED_CHATS / admin access, and the quotas (bot/service/access.py).
    access = Access(settings, sessionmaker, metrics)
    handlers = Handlers(cases, settings, sessionmaker, budget, access)
    handlers.register(application)
    # Another process may use the same database (a second instance, or replicas): chat
    # leases keep every update answered once and every text sent once, and the heartbeat
    # lets the others take a dead replica's chats over within takeover_after_s.
    owner = new_owner()
    # The heartbeat has a connection of its own: a busy pool (64 chats' turns, a burst of
    # sends) must never make a healthy replica miss its heartbeats and fence itself.
    heartbeat_engine = make_engine(settings.db_url, pool_size=1, max_overflow=0)
    built: list[Service] = []  # the service, once built: the heartbeat reports its status

    async def status() -> dict[str, object]:
        return await built[0].status()

    heartbeat = Heartbeat(
        make_sessionmaker(heartbeat_engine),
        owner,
        dead_after_s=settings.takeover_after_s,
        info=status,
        on_alive=budget.share,  # the bot's send budget is split between the live replicas
    )
    took_over = metrics.lease_taken_over  # bot_lease_takeovers_total{kind}
    inbox_leases, outbox_leases = (
        Leases(sessionmaker, kind, owner=owner, heartbeat=heartbeat, on_takeover=took_over)
        for kind in ("inbox", "outbox")
    )
    delivery, inbox_worker = _queues(
        settings, application, handlers, (inbox_leases, outbox_leases), backoff, metrics
    )
    polling_leases = Leases(
        sessionmaker, "poller", owner=owner, ttl_s=10.0, heartbeat=heartbeat, on_takeover=took_over
    )
    ingest = _ingest(
        settings, application, store, inbox_worker.offer, polling_leases, backoff, metrics, access
    )
    health, ops = _health(settings, sessionmaker, responder, metrics)
    built.append(
        Service(
            settings=settings,
            metrics=metrics,
            db_engine=db_engine,
            sessionmaker=sessionmaker,
            responder=responder,
            application=application,
            budget=budget,
            store=store,
            cases=cases,
            handlers=handlers,
            owner=owner,
            heartbeat_engine=heartbeat_engine,
            heartbeat=heartbeat,
            jobs_engine=make_engine(settings.db_url, on_loop=False, pool_size=1, max_overflow=0),
            leases=(inbox_leases, outbox_leases),
            delivery=delivery,
            inbox_worker=inbox_worker,
            ingest=ingest,
            health=health,
            ops=ops,
        )
    )
    return built[0]


def _watch(metrics: Metrics, responder: ServingResponder, settings: Settings) -> None:
    """The metrics that watch the responder's model workers, and bot_build_info."""
    variants = responder.abilities.variants
    if variants is not None:  # bot_worker_restarts_total{variant,reason}
        metrics.watch_worker_restarts(variants.restart_reasons)
        # bot_model_process_*{variant}: the worker processes' memory, CPU, descriptors
        metrics.watch_model_processes(partial(worker_pids, variants))
    metrics.set_build_info(**build_labels(settings))


def _queues(
    settings: Settings,
    application: App,
    handlers: Handlers,
    leases: tuple[Leases, Leases],
    backoff: Backoff | None,
    metrics: Metrics,
) -> tuple[Delivery, InboxWorker]:
    """The outbox's delivery and the inbox's worker (which runs each update through the
    handlers), under the chats' inbox and outbox leases."""
    inbox_leases, outbox_leases = leases
    delivery = Delivery(
        handlers.sessionmaker,
        application.bot,
        max_concurrent=settings.max_concurrent_chats,
        concurrency=settings.delivery_concurrency,
        backoff=backoff,
        leases=outbox_leases,
        markup=feedback.outbox_markup(settings.feedback_buttons),
        metrics=metrics,
        # Texts a dead replica committed but did not send are found by the others' scan:
        # once a second, like the inbox (one indexed query).
        poll_interval_s=1.0,
    )
    inbox_worker = InboxWorker(
        handlers.sessionmaker,
        UpdateRunner(application, handlers, handlers.sessionmaker, metrics),
        max_concurrent=settings.max_concurrent_chats,
        on_processed=delivery.offer,
        backoff=backoff,
        leases=inbox_leases,
        metrics=metrics,
        # A slot share per variant, and no turn for one that is down.
        lanes=handlers.cases.core.responder.abilities.variants,
        # Another replica may have stored the rows (it polls, or nginx sent it the POST):
        # look often enough that its chats never wait long for a free replica.
        poll_interval_s=1.0,
    )
    return delivery, inbox_worker


def _health(
    settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    responder: ServingResponder,
    metrics: Metrics,
) -> tuple[Health, OpsServer | None]:
    """The readiness checks, and the ops server that serves them with the metrics."""
    health = Health(
        sessionmaker,
        responder,
        max_inbox_lag_s=settings.ready_max_inbox_lag_s,
        secrets=settings_secrets(settings),
        metrics=metrics,
    )
    # METRICS_PORT: /metrics, /healthz, /readyz (bot/service/health.py), from start() to stop().
    ops = (
        OpsServer(metrics, health, listen=settings.metrics_listen, port=settings.metrics_port)
        if settings.metrics_port is not None
        else None
    )
    return health, ops


def _ingest(
    settings: Settings,
    application: App,
    store: ConversationStore,
    on_stored: Callable[[Collection[int]], None],
    polling_leases: Leases,
    backoff: Backoff | None,
    metrics: Metrics,
    access: Access,
) -> ElectedPolling | WebhookIngest:
    """Where updates come in: the webhook (WEBHOOK_URL), else getUpdates polling, by the
    replica that holds `polling_leases`."""
    bot = application.bot
    if settings.webhook_url:
        secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret else ""
        return WebhookIngest(
            bot,
            store,
            on_stored,
            url=settings.webhook_url,
            secret=secret,
            listen=settings.webhook_listen,
            port=settings.webhook_port,
            backoff=backoff,
            metrics=metrics,
            access=access,
        )
    # getUpdates allows one consumer: the replicas elect one poller; all of them process.
    return ElectedPolling(
        polling_leases,
        lambda: PollingIngest(
            bot, store, on_stored, backoff=backoff, metrics=metrics, access=access
        ),
    )


async def open_service(
    settings: Settings,
    *,
    responder_factory: ResponderFactory | None = None,
    backoff: Backoff | None = None,
    timeout_s: float = 15.0,
    stop: asyncio.Event | None = None,
) -> Service:
    """Connect to the database and Telegram (getMe), load the responder, and build the service.

    Raises Interrupted if `stop` is set while getMe is still being retried.
    """
    settings.require_token()
    db_engine = make_engine(settings.db_url)
    sessionmaker = make_sessionmaker(db_engine)
    metrics = Metrics()
    budget = SendBudget()
    application = build_application(settings, budget, timeout_s=timeout_s, metrics=metrics)
    try:
        where = bot_api_address(settings.telegram_base_url)
        await _initialize(application, backoff or Backoff(), stop, where)
        log.info("connected to the Bot API as @%s", application.bot.username)
        responder = await (responder_factory or _load_responder)(
            settings, ConversationStore(sessionmaker)
        )
    except BaseException:
        with contextlib.suppress(Exception):
            await application.shutdown()
        await db_engine.dispose()
        raise
    return build_service(
        settings,
        db_engine,
        sessionmaker,
        responder,
        application,
        budget,
        backoff=backoff,
        metrics=metrics,
    )


def bot_api_address(base_url: str) -> str:
    """TELEGRAM_BASE_URL as the logs name it: scheme, host, port and path only. The token is
    never part of it (every request URL is this plus `<token>/<method>`), and a user or password
    written into it is left out too."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # not a number: the request fails and says so; the name needs no port
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


async def _initialize(
    application: App, backoff: Backoff, stop: asyncio.Event | None, where: str
) -> None:
    """application.initialize() (getMe), retried while the Bot API is unreachable; `where`
    (bot_api_address) names it in each retry's warning.

    Raises Interrupted as soon as `stop` is set, even in the middle of a request; a wrong
    token (InvalidToken) is not retried.
    """
    await retry(
        application.initialize,
        what=f"getMe (cannot reach the Bot API at {where})",
        backoff=backoff,
        on=(NetworkError,),
        stop=stop,
    )


async def serve(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    responder_factory: ResponderFactory | None = None,
) -> int:
    """Run the service until SIGTERM/SIGINT (or `stop`); returns the exit status."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        return await _serve(settings, stop, responder_factory)
    finally:
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


async def _serve(
    settings: Settings, stop: asyncio.Event, responder_factory: ResponderFactory | None
) -> int:
    # Alembic is the only thing that creates tables; running it here makes `make run` just work.
    await asyncio.to_thread(migrate.upgrade, settings.db_url)
    try:
        service = await open_service(settings, responder_factory=responder_factory, stop=stop)
    except InvalidToken:
        log.error(BAD_TOKEN)
        return 1
    except Interrupted:
        log.info("stopped during start-up, before the Bot API answered getMe")
        return 0
    status = 0
    try:
        if not stop.is_set():  # a signal during start-up (the model loads for a while)
            await service.start(stop)
            await service.wait(stop)
    except InvalidToken:
        log.error(BAD_TOKEN)
        status = 1
    except Interrupted:
        log.info("stopped during start-up, before the Bot API took the webhook setting")
    finally:
        try:
            await service.stop()
        finally:
            await service.close()
    log.info("stopped")
    return status


def run_service(settings: Settings) -> int:
    """Serve Telegram until stopped; returns the exit status (logging is set up by the caller,
    bot/__main__.py)."""
    try:
        settings.require_token()
        return asyncio.run(serve(settings))
    except ConfigError as err:
        log.error("%s", err)
        return 2


def check_offline(settings: Settings, *, models: bool = True) -> None:
    """Every check that needs neither the network nor the model, for `run` and `chat` to call
    before their first connection (the database's, the Bot API's): the variants file (its
    numbers, and that the model files it names exist), the personas file and the privacy
    notice. A mistake there stops the start at once (ConfigError: exit status 2), not after
    getMe, which is retried for as long as the Bot API cannot be reached. The one network call:
    a `zoo:` model not staged in DATA_DIR/parlai probes ParlAI's download host for a few
    seconds, and is refused, naming where to stage it, when that cannot be reached.

    Settings themselves were validated when they were read (bot.config). `models=False`
    leaves the model files out (a first start checks them after it has trained the default
    model, which the variants file may name), so the rest still fails before training.
    """
    from bot.engine.backends.registry import models_load_here
    from bot.engine.variants import load_experiment
    from bot.presets import load_presets

    here = models and models_load_here(settings)
    # its models complete (BOT_MODEL where a variant names none), where they load here
    experiment = load_experiment(settings, check_model=None if models else False)
    model = settings.model_file
    if here:
        # A zoo model neither staged nor downloadable: a probe of a few seconds, not ParlAI's
        # retries after getMe (bot.model_files.zoo_refusal).
        datapath = settings.data_dir / "parlai"
        for zoo in sorted({v.model for v in experiment.variants if v.model.startswith("zoo:")}):
            if (refusal := zoo_refusal(datapath.resolve(), zoo)) is not None:
                raise ConfigError(f"BOT_MODEL {refusal}" if zoo == model else refusal)
    local = here and settings.variants_file is None
    if local and not model.startswith("zoo:"):
        named = "BOT_MODEL" if settings.bot_model else "the default model (BOT_MODEL is unset)"
        remedy = (
            "set BOT_MODEL to a complete model file or a zoo: path"
            if settings.bot_model
            else "run `python -m bot train` to train one, or restore models/chitchat/ from the "
            "repository"
        )
        if not Path(model + ".opt").is_file():
            raise ConfigError(f"{named}: no ParlAI model at {model} (no {model}.opt); {remedy}")
        why = unservable_model(model)
        if why is not None:
            raise ConfigError(f"{named}: {why}; {remedy}")
    load_presets(settings.personas_file, settings.persona_max_chars)
    if settings.privacy_file is not None:
        try:
            settings.privacy_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            path = settings.privacy_file
            raise ConfigError(f"PRIVACY_FILE {path} cannot be read: {err}") from None


def must_train(settings: Settings) -> bool:
    """Whether ensure_model will train: BOT_MODEL is unset and no default model exists (neither
    one trained here nor the one shipped in models/chitchat/)."""
    return not settings.bot_model and not Path(settings.model_file + ".opt").exists()


def ensure_model(settings: Settings) -> None:
    """Train the default model once when BOT_MODEL is unset and none exists yet.

    Imports the training pipeline only then: a normal start never loads it.
    """
    if not must_train(settings):
        return
    from bot.training import TrainingError, train_cli

    log.warning(
        "BOT_MODEL is not set and no default model exists yet: training one now "
        "(at most %.0f minutes; set BOT_MODEL to skip)",
        settings.train_minutes,
    )
    import torch

    # Training has a fixed time: it gets every core (TORCH_THREADS aside), not the one thread
    # this process serves with (bot/__main__.py set it before).
    serving = torch.get_num_threads()
    torch.set_num_threads(settings.torch_threads or os.cpu_count() or 1)
    try:
        train_cli(settings, minutes=None, if_missing=True, out=None)
    except TrainingError as err:
        raise ConfigError(
            f"{err}. Run `python -m bot train` to try again, or set BOT_MODEL to an existing "
            "ParlAI model."
        ) from err
    finally:
        torch.set_num_threads(serving)
