"""The model-side metrics: model_replica set from the reply, bounded per variant (Ray
replaces a replica under a new id; the series of the one seen least recently are dropped), and
a Ray variant's unhealthy episodes among the restarts."""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import generate_latest

from bot.engine.protocol import Reply
from bot.service import metrics as service_metrics
from bot.service.metrics import Metrics


def _reply(variant: str, replica: str | None) -> Reply:
    return Reply(
        "hi", 10.0, variant, 5.0, batch_size=2, cache_hit=False, rebuild_ms=1.0,
        cache_evictions=1, model_replica=replica,
    )  # fmt: skip


def _replicas(m: Metrics, variant: str) -> set[str]:
    return {
        sample.labels["model_replica"]
        for family in m.registry.collect()
        if family.name == "bot_agent_cache_misses"
        for sample in family.samples
        if sample.labels.get("variant") == variant
    }


def test_every_model_side_series_names_the_replica() -> None:
    m = Metrics()
    m.replied(_reply("a", "k3x9q2zd"), datetime.now(UTC))
    text = generate_latest(m.registry).decode()
    for name in (
        "bot_model_time_seconds_count",
        "bot_batch_size_count",
        "bot_agent_cache_misses_total",
        "bot_agent_cache_rebuild_seconds_count",
        "bot_agent_cache_evictions_total",
    ):
        assert f'{name}{{model_replica="k3x9q2zd",variant="a"}} 1.0' in text, name
    # The reply's latency is the front-end's figure (queue included), not the model's.
    assert 'bot_reply_latency_seconds_count{variant="a"} 1.0' in text


def test_replicas_past_the_bound_drop_the_least_recently_seen() -> None:
    m = Metrics()
    bound = service_metrics.MAX_REPLICAS_PER_VARIANT
    m.replied(_reply("b", "keep"), None)  # another variant's are its own
    for i in range(bound):
        m.replied(_reply("a", f"r{i}"), None)
    m.replied(_reply("a", "r0"), None)  # seen again: now the most recent
    m.replied(_reply("a", "new"), None)
    kept = _replicas(m, "a")
    assert len(kept) == bound and "r1" not in kept and {"r0", "new"} <= kept
    assert _replicas(m, "b") == {"keep"}


def test_a_ray_variants_unhealthy_episodes_are_counted_as_restarts() -> None:
    m = Metrics()
    m.watch_worker_restarts(lambda: {"a": {"unhealthy": 2}, "b": {"exited": 1}})
    text = generate_latest(m.registry).decode()
    assert 'bot_worker_restarts_total{reason="unhealthy",variant="a"} 2.0' in text
    assert 'bot_worker_restarts_total{reason="exited",variant="b"} 1.0' in text
    assert 'bot_worker_restarts_total{reason="unhealthy",variant="b"} 0.0' in text
