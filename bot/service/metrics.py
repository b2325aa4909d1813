"""The service's Prometheus metrics: one `Metrics` per Service, each with its own registry.

A registry of its own (not prometheus_client's global one) because one process may run several
services (the tests do, and a second Service in a process must not double its counters), and
because scraping must show exactly this service's figures. bot/service/health.py serves it on
METRICS_PORT.

The turn outcome is decided deep in the use cases (bot/conversations/outcome.py) but counted
here, by the inbox worker's runner, once per update, after its handler returned.

The model-side figures (model time, batch size, the clone cache's) are labelled with the
variant and the model server that generated the reply (`model_replica`: a Ray Serve replica's
id, or "local" for the service's own model process). Ray replaces a replica under a new id,
so those labels are bounded: at most MAX_REPLICAS_PER_VARIANT per variant, the replica seen
least recently dropping its series when a new one comes (it is the one gone).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from bot.engine.protocol import Reply

# Seconds, for a reply that takes 50 ms on a GPU to one that waits a minute behind a backlog.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0)
# Turns per batch_act: BATCH_MAX_SIZE is 16 by default.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# Rebuilding a clone from stored messages: milliseconds (bench: 8 ms for 1,000 messages).
REBUILD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# model_replica values kept per variant (a variant's replicas, and the replaced ones for a while).
MAX_REPLICAS_PER_VARIANT = 32

# bot_worker_restarts_total's reasons (bot/engine/backends/local.py; unhealthy:
# bot/engine/backends/ray/backend.py).
RESTART_REASONS = ("exited", "stalled", "pipe_full", "unhealthy")
# The model-side metrics' labels.
MODEL_LABELS = ("variant", "model_replica")
# bot_build_info's labels.
BUILD_LABELS = ("version", "python", "torch", "parlai", "model", "model_backend")

# bot_telegram_requests_total's results, per HTTP request to the Bot API.
OK, RATE_LIMITED, ERROR = "ok", "429", "error"
# bot_telegram_failures_total's actions: what the caller did after a failed call.
RETRY, GAVE_UP = "retry", "gave_up"
# The Bot API methods delivery sends with (bot/service/delivery.py): their failure and 429
# series exist from the start, at 0, so an alert's increase() sees the first one.
DELIVERY_METHODS = ("sendMessage", "editMessageText")


class Metrics:
    """Every metric of one service, in one registry (`registry`, scraped by
    bot/service/health.py)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        # process_resident_memory_bytes, process_cpu_seconds_total, process_open_fds, ... of
        # this process (the front-end; with MODEL_WORKERS=inline, the models too).
        ProcessCollector(registry=r)
        self._queue_metrics(r)
        self._model_time_metrics(r)
        self._telegram_metrics(r)
        self._model_metrics: tuple[Counter | Histogram, ...] = (
            self.model_time,
            self.batch_size,
            self.cache_hits,
            self.cache_misses,
            self.cache_evictions,
            self.cache_rebuild,
        )
        # variant -> its model_replica values, the one seen least recently first.
        self._replicas: dict[str, OrderedDict[str, None]] = {}
        # The series every dashboard plots exist from the start, at 0.
        for kind in ("inbox", "outbox", "poller"):
            self.lease_takeovers.labels(kind)
        for window in ("day", "minute"):
            self.quota_hits.labels(window)
        for method in DELIVERY_METHODS:
            for action in (RETRY, GAVE_UP):
                self.telegram_failures.labels(method, action)
            self.telegram_requests.labels(method, RATE_LIMITED)

    def _queue_metrics(self, r: CollectorRegistry) -> None:
        """What runs, and the updates' way: inbox, turns, outbox."""
        self.build_info = Gauge(
            "bot_build_info",
            "Always 1; the labels say what runs: the package version, Python, torch and "
            "ParlAI versions, the model (BOT_MODEL or the default) and MODEL_BACKEND.",
            BUILD_LABELS,
            registry=r,
        )
        self.ready = Gauge(
            "bot_ready",
            "1 when /readyz would answer 200, else 0 (its checks run at every scrape).",
            registry=r,
        )
        self.updates_received = Counter(
            "bot_updates_received",
            "Updates delivered by Telegram (getUpdates or webhook), redeliveries included.",
            ["kind"],
            registry=r,
        )
        self.updates_duplicate = Counter(
            "bot_updates_duplicate",
            "Updates delivered again that the inbox held already (changed nothing).",
            registry=r,
        )
        self.updates_acknowledged = Counter(
            "bot_updates_acknowledged",
            "Updates acknowledged to Telegram after their inbox row was committed.",
            registry=r,
        )
        self.inbox_depth = Gauge(
            "bot_inbox_depth", "Updates waiting in the inbox (read at scrape time).", registry=r
        )
        self.inbox_lag = Gauge(
            "bot_inbox_lag_seconds",
            "Age of the oldest update waiting in the inbox; 0 when none (read at scrape time).",
            registry=r,
        )
        self.outbox_depth = Gauge(
            "bot_outbox_depth",
            "Texts waiting in the outbox to be sent (read at scrape time).",
            registry=r,
        )
        self.turns = Counter(
            "bot_turns",
            "Updates processed by the inbox worker, by outcome (and variant, for model turns).",
            ["outcome", "variant"],
            registry=r,
        )
        self.reply_latency = Histogram(
            "bot_reply_latency_seconds",
            "From an update's arrival in the inbox to its reply committed to the outbox.",
            ["variant"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def _model_time_metrics(self, r: CollectorRegistry) -> None:
        """The model's side of each reply: its batch, its time, the clone cache (MODEL_LABELS)."""
        self.model_time = Histogram(
            "bot_model_time_seconds",
            "Time inside the model: the batch that generated the reply.",
            MODEL_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "bot_batch_size",
            "Size of the batch each reply was generated in (one observation per reply).",
            MODEL_LABELS,
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.cache_hits = Counter(
            "bot_agent_cache_hits",
            "Replies whose conversation clone was in the worker's cache.",
            MODEL_LABELS,
            registry=r,
        )
        self.cache_misses = Counter(
            "bot_agent_cache_misses",
            "Replies whose clone was rebuilt from the database first.",
            MODEL_LABELS,
            registry=r,
        )
        self.cache_evictions = Counter(
            "bot_agent_cache_evictions",
            "Clones dropped from a worker's cache (reported with the worker's next reply).",
            MODEL_LABELS,
            registry=r,
        )
        self.cache_rebuild = Histogram(
            "bot_agent_cache_rebuild_seconds",
            "Building a clone from the stored persona and messages, on a cache miss.",
            MODEL_LABELS,
            buckets=REBUILD_BUCKETS,
            registry=r,
        )

    def _telegram_metrics(self, r: CollectorRegistry) -> None:
        """The Bot API's requests and failures, lease takeovers, access and quotas."""
        self.telegram_requests = Counter(
            "bot_telegram_requests",
            "HTTP requests to the Bot API by method and result (ok, 429, error).",
            ["method", "result"],
            registry=r,
        )
        self.telegram_failures = Counter(
            "bot_telegram_failures",
            "Failed Bot API calls by what the caller did next (retry, gave_up).",
            ["method", "action"],
            registry=r,
        )
        self.lease_takeovers = Counter(
            "bot_lease_takeovers",
            "Chat leases taken over from another process (dead or expired), by kind.",
            ["kind"],
            registry=r,
        )
        self.access_refusals = Counter(
            "bot_access_refusals",
            "Updates refused at ingest because the sender and chat are not allowed "
            "(ALLOWED_USERS, ALLOWED_CHATS, admin access); refused and silent ones alike.",
            registry=r,
        )
        self.quota_hits = Counter(
            "bot_quota_hits",
            "Messages left unanswered because the user's quota was used up, by window "
            "(day, minute).",
            ["window"],
            registry=r,
        )

    def set_build_info(self, **labels: str) -> None:
        """bot_build_info{BUILD_LABELS} = 1 (labels not given: "unknown")."""
        self.build_info.labels(*(labels.get(name) or "unknown" for name in BUILD_LABELS)).set(1)

    def watch_model_processes(self, source: Callable[[], Mapping[str, int]]) -> None:
        """bot_model_process_*{variant}: each model worker process's memory, CPU time and open
        descriptors, sampled with psutil at scrape time (`source`: variant -> pid of its
        worker now; a variant whose worker is down has no series until it is back)."""
        self.registry.register(_ModelProcesses(source))

    def watch_worker_restarts(self, source: Callable[[], Mapping[str, Mapping[str, int]]]) -> None:
        """bot_worker_restarts_total{variant,reason}, read from the workers at scrape time
        (`source`: variant -> reason -> restarts): RESTART_REASONS."""
        self.registry.register(_ModelRestarts(source))

    # --- one-line hooks for the components that count -------------------------------------

    def lease_taken_over(self, kind: str) -> None:
        """A chat lease of `kind` (inbox, outbox) was taken over from another owner."""
        self.lease_takeovers.labels(kind).inc()

    def telegram_request(self, method: str, result: str) -> None:
        """One HTTP request to the Bot API and its result (OK, RATE_LIMITED, ERROR)."""
        self.telegram_requests.labels(method, result).inc()

    def telegram_failure(self, method: str, action: str) -> None:
        """A failed Bot API call, and what its caller did next (RETRY, GAVE_UP)."""
        self.telegram_failures.labels(method, action).inc()

    def received(self, kind: str) -> None:
        """Telegram delivered an update (before it is stored)."""
        self.updates_received.labels(kind).inc()

    def access_refused(self) -> None:
        """An update from a sender not allowed was dropped at ingest."""
        self.access_refusals.inc()

    def quota_hit(self, window: str) -> None:
        """A message went unanswered over the user's quota of `window` (day, minute)."""
        self.quota_hits.labels(window).inc()

    def duplicate(self) -> None:
        """A delivered update was in the inbox already."""
        self.updates_duplicate.inc()

    def acknowledged_updates(self, count: int = 1) -> None:
        """Updates acknowledged to Telegram (their inbox rows are committed)."""
        self.updates_acknowledged.inc(count)

    def turn(self, outcome: str, variant: str = "") -> None:
        """Count one processed update."""
        self.turns.labels(outcome, variant).inc()

    def replied(self, reply: Reply, received_at: datetime | None) -> None:
        """The figures of one stored reply: latency, model time, batch size, cache."""
        variant = reply.variant or ""
        if received_at is not None:
            waited = (datetime.now(UTC) - received_at).total_seconds()
            self.reply_latency.labels(variant).observe(max(waited, 0.0))
        model = (variant, self._replica(variant, reply.model_replica or ""))
        if reply.model_ms is not None:
            self.model_time.labels(*model).observe(reply.model_ms / 1000.0)
        if reply.batch_size is not None:
            self.batch_size.labels(*model).observe(reply.batch_size)
        if reply.cache_hit is not None:
            (self.cache_hits if reply.cache_hit else self.cache_misses).labels(*model).inc()
        if reply.rebuild_ms is not None:
            self.cache_rebuild.labels(*model).observe(reply.rebuild_ms / 1000.0)
        if reply.cache_evictions:
            self.cache_evictions.labels(*model).inc(reply.cache_evictions)

    def _replica(self, variant: str, replica: str) -> str:
        """Note `replica` as the variant's most recent; drop the series of the one seen least
        recently when the variant has more than MAX_REPLICAS_PER_VARIANT."""
        seen = self._replicas.setdefault(variant, OrderedDict())
        seen[replica] = None
        seen.move_to_end(replica)
        while len(seen) > MAX_REPLICAS_PER_VARIANT:
            gone, _ = seen.popitem(last=False)
            for metric in self._model_metrics:
                with contextlib.suppress(KeyError):  # a series it never had
                    metric.remove(variant, gone)
        return replica

    def set_backlog(self, inbox_depth: int, inbox_lag_s: float, outbox_depth: int) -> None:
        """The queue gauges, as just read from the database."""
        self.inbox_depth.set(inbox_depth)
        self.inbox_lag.set(inbox_lag_s)
        self.outbox_depth.set(outbox_depth)


class _ModelRestarts(Collector):
    """The model workers' restarts, counted by their handles (bot/engine/backends/local.py)."""

    def __init__(self, source: Callable[[], Mapping[str, Mapping[str, int]]]) -> None:
        self._source = source

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "bot_worker_restarts",
            "Model worker processes restarted, by variant and why: exited (died), stalled "
            "(answered no ping or made no decoding step for WORKER_STALL_S), pipe_full; on "
            "Ray, unhealthy (Serve saw the variant's deployment unhealthy and replaces replicas).",
            labels=["variant", "reason"],
        )
        for variant, reasons in sorted(self._source().items()):
            for reason in RESTART_REASONS:
                family.add_metric([variant, reason], reasons.get(reason, 0))
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("bot_worker_restarts", "", labels=["variant", "reason"])


class _ModelProcesses(Collector):
    """The model worker processes' figures, read from the OS (psutil) at scrape time: the
    parent samples its children by pid, so the worker needs no message for it, and a worker
    that hangs is measured all the same. The names follow prometheus_client's
    ProcessCollector (process_*), prefixed bot_model_ and labelled by variant."""

    def __init__(self, source: Callable[[], Mapping[str, int]]) -> None:
        self._source = source

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        rss, cpu, fds = self._families()
        for variant, pid in sorted(self._source().items()):
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    memory = proc.memory_info().rss
                    times = proc.cpu_times()
                    open_fds = proc.num_fds()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # it died between the two reads: it has no figures now
            rss.add_metric([variant], memory)
            # user + system of the process itself, as process_cpu_seconds_total counts them
            cpu.add_metric([variant], times.user + times.system)
            fds.add_metric([variant], open_fds)
        yield from (rss, cpu, fds)

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._families()

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, CounterMetricFamily, GaugeMetricFamily]:
        labels = ["variant"]
        return (
            GaugeMetricFamily(
                "bot_model_process_resident_memory_bytes",
                "Resident memory of the variant's model worker process, in bytes.",
                labels=labels,
            ),
            CounterMetricFamily(
                "bot_model_process_cpu_seconds",
                "User and system CPU time of the variant's model worker process (it starts "
                "again at 0 when the worker is restarted).",
                labels=labels,
            ),
            GaugeMetricFamily(
                "bot_model_process_open_fds",
                "Open file descriptors of the variant's model worker process.",
                labels=labels,
            ),
        )
