"""MODEL_BACKEND=ray in a cluster the service joins: one local Ray instance of 2 CPUs for the
module, started here (as `ray start` would be), whose replicas generate slowly
(tests/support/slow_bot.py as its workers' setup hook) and mark the batches they start.

- front-ends of one service share a variant's application: the second joins what the first
  deployed, and the application outlives the first one's stop while the second uses it.

Replicas failing under the real service (the tiny model, SQLite, the loopback Bot API):

- a replica SIGKILLed while it generates: its turns are sent again to the other replica (or a
  restarted one), every update is answered exactly once, and the rebuilt model input is the
  one the cached clone would have read (invariant 5);
- a replica SIGSTOPped: WORKER_STALL_S applies (Serve's health check replaces it), the variant
  is not alive meanwhile (/readyz), and the turn it held is answered by the new replica."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.db import migrate
from bot.db.engine import make_engine, make_sessionmaker
from bot.engine.variants import Variant
from tests.support import slow_bot
from tests.support.fakebotapi import FakeBotAPI
from tests.support.service_harness import make_settings, rows, running_service, settled
from tests.support.waits import until

ROOT = Path(__file__).resolve().parents[3]
DELAY_MS = 500
PERSONA = "i love pizza ."


@pytest.fixture(scope="module")
def marks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A local Ray instance of 2 CPUs for the module, slowed down; yields the folder where its
    processes mark the batches they start (a file named by the pid)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install '.[ray]')")
    from ray import serve

    mark_dir = tmp_path_factory.mktemp("ray-marks")
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        runtime_env={
            "worker_process_setup_hook": "tests.support.slow_bot.ray_setup",
            "env_vars": {
                slow_bot.ENV: str(DELAY_MS),
                slow_bot.MARK_ENV: str(mark_dir),
                "PYTHONPATH": path,
            },
        },
    )
    try:
        yield mark_dir
    finally:
        serve.shutdown()
        ray.shutdown()


def _ray_settings(
    sqlite_url: str, api: FakeBotAPI, tmp_path: Path, model: str, replicas: int, **overrides: Any
) -> Settings:
    """The service on Ray, one variant `a` on `model` in `replicas` replicas sharing a CPU, one
    worker thread, generations given 120 s (the slowed-down batches); `overrides` on top."""
    variants = tmp_path / "v.toml"
    variants.write_text(
        f'[[variants]]\nname = "a"\nmodel = "{model}"\ncontrol = true\n'
        f"replicas = {replicas}\nnum_cpus = {1 / replicas}\n"
    )
    return make_settings(
        sqlite_url,
        api,
        tmp_path,
        variants_file=variants,
        model_backend="ray",
        worker_threads=1,
        generation_timeout_s=120,
        **overrides,
    )


def _generating(mark_dir: Path) -> int | None:
    """The pid of a process that started a batch since the marks were cleared."""
    found = [int(p.name) for p in mark_dir.iterdir()]
    return found[0] if found else None


def _clear(mark_dir: Path) -> None:
    for mark in mark_dir.iterdir():
        mark.unlink()


def _record_inputs(backend: Any) -> list[tuple[int, str, tuple[int, ...]]]:
    """(session id, text, model input) of every turn the backend answers."""
    seen: list[tuple[int, str, tuple[int, ...]]] = []
    generate = backend.generate

    async def recorded(session: Any, text: str, **kwargs: Any) -> Any:
        result = await generate(session, text, **kwargs)
        seen.append((session.id, text, tuple(result.model_input)))
        return result

    backend.generate = recorded
    return seen


async def _answered_once(service: Any, api: FakeBotAPI, chats: list[int], turns: int) -> None:
    """Every update done (none apologised for), every model turn answered by one reply, and
    what each chat received is its outbox, in order, each text once."""
    updates = len(chats) * (turns + 1)  # the /persona command and the turns
    assert await rows(service, "SELECT status, count(*) FROM inbox GROUP BY status") == [
        ("done", updates)
    ]
    replies = await rows(
        service, "SELECT update_id, count(*) FROM outbox WHERE kind = 'reply' GROUP BY update_id"
    )
    assert len(replies) == len(chats) * turns and all(n == 1 for _, n in replies), replies
    for chat in chats:
        sent = await rows(
            service, "SELECT text FROM outbox WHERE chat_id = :chat ORDER BY id", chat=chat
        )
        assert api.texts(chat) == [text for (text,) in sent]


async def test_a_replica_killed_mid_generation_loses_and_repeats_nothing(
    marks: Path, sqlite_url: str, tmp_path: Path, api: FakeBotAPI, tiny_model_file: str
) -> None:
    settings = _ray_settings(sqlite_url, api, tmp_path, tiny_model_file, 2, agent_cache_size=8)
    chats = [101, 102, 103, 104]
    async with running_service(settings, None, timeout_s=120) as service:
        backend = service.responder.backends["a"]
        inputs = _record_inputs(backend)
        for chat in chats:
            api.user_message(chat, f"/persona {PERSONA}")
            api.user_message(chat, "hello how are you today")
        await settled(service, api, within_s=90)
        first = {sid: inp for sid, text, inp in inputs if text.startswith("hello")}
        assert len(first) == len(chats)

        _clear(marks)
        for chat in chats:
            api.user_message(chat, "what do you like to eat")
        await until(lambda: _generating(marks) is not None, within_s=60, what="a batch started")
        victim = _generating(marks)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        await settled(service, api, within_s=120)
        assert backend.lost_turns >= 1  # the killed replica held turns: they were sent again
        await _answered_once(service, api, chats, turns=2)
    second = [inp for _, text, inp in inputs if text.startswith("what")]
    assert len(second) == len(chats)  # one answer per turn: none generated twice over the spy
    # The same persona and the same turns in every chat: the rebuilt (on the other replica)
    # and the cached model inputs are one and the same (invariant 5).
    assert len(set(first.values())) == 1
    assert len(set(second)) == 1, "a rebuilt model input differs from the cached one"


# About 30 s beyond the module's Ray start: deselected from `make test` (the stall limit's
# sizing is unit-tested in tests/unit/engine/backends/ray/test_cluster.py).
@pytest.mark.slow
async def test_a_stopped_replica_is_replaced_within_the_stall_limit(
    marks: Path, sqlite_url: str, tmp_path: Path, api: FakeBotAPI, tiny_model_file: str
) -> None:
    from bot.service.health import model_check

    settings = _ray_settings(sqlite_url, api, tmp_path, tiny_model_file, 1, worker_stall_s=3)
    chat = 201
    async with running_service(settings, None, timeout_s=120) as service:
        backend = service.responder.backends["a"]
        api.user_message(chat, f"/persona {PERSONA}")
        api.user_message(chat, "hello how are you today")
        await settled(service, api, within_s=60)
        _clear(marks)
        api.user_message(chat, "what do you like to eat")
        await until(lambda: _generating(marks) is not None, within_s=60, what="a batch started")
        victim = _generating(marks)
        assert victim is not None
        os.kill(victim, signal.SIGSTOP)
        try:
            # Serve's health check goes unanswered: the replica is replaced, and /readyz's
            # model check fails until the new one runs.
            await until(
                lambda: not model_check(service.responder)[0], within_s=30, what="not ready"
            )
            assert "no replica running" in model_check(service.responder)[1]
            await settled(service, api, within_s=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        # Serve's status, polled every few seconds, catches up with the new replica.
        await until(lambda: model_check(service.responder)[0], within_s=30, what="ready again")
        assert backend.restart_reasons["unhealthy"] == 1
        assert backend.lost_turns >= 1  # the stopped replica's turn was sent again
        await _answered_once(service, api, [chat], turns=2)


async def test_front_ends_share_a_variants_application(
    marks: Path, tmp_path: Path, tiny_model_file: str
) -> None:
    import ray
    from ray import serve

    from bot.engine.backends.ray.backend import RayBackend
    from bot.engine.backends.ray.cluster import _apps, app_name

    url = f"sqlite+aiosqlite:///{tmp_path / 'shared.sqlite3'}"
    await asyncio.to_thread(migrate.upgrade, url)
    engine = make_engine(url)
    store = ConversationStore(make_sessionmaker(engine))
    variant = Variant("a", tiny_model_file)

    def front_end(index: int) -> Settings:
        return Settings(  # type: ignore[call-arg]
            _env_file=None,
            bot_model=tiny_model_file,
            database_url=url,
            data_dir=tmp_path / f"front-{index}",  # front-ends differ in what is their own
            metrics_port=9100 + index,
            worker_threads=1,
        )

    def applications() -> dict[str, Any]:
        return dict(serve.status().applications)

    first = await RayBackend.start(variant, front_end(1), store)
    try:
        second = await RayBackend.start(variant, front_end(2), store)
        try:
            assert first.app == second.app == app_name(variant, front_end(3))
            assert [a for a in applications() if a.startswith("a-")] == [first.app]
            assert first.info["pid"] == second.info["pid"]  # one replica serves both
            assert ray.get(_apps(ray).using.remote())[first.app] == 2
            await first.close()
            assert first.app in applications()  # kept: the second still uses it
            session = await store.active_session(301, 301)
            assert (await second.generate(session, "hello how are you today")).text.strip()
        finally:
            await second.close()
        assert first.app not in applications()  # its last user stopped: deleted
    finally:
        await first.close()
        await engine.dispose()
