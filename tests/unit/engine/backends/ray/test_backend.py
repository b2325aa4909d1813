"""RayBackend's bookkeeping without a Ray instance (the contract test runs it on one): the cache
upkeep a session's next request carries, and Serve's status read as alive or not."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from bot.config import Settings
from bot.engine import pipe
from bot.engine.backends.ray import backend as ray_backend
from bot.engine.backends.ray import cluster
from bot.engine.backends.ray.backend import RayBackend
from bot.engine.protocol import Generated
from tests.support.waits import until


def _backend() -> RayBackend:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    return RayBackend("a", "a-0000", handle=None, store=None, settings=settings)  # type: ignore[arg-type]


def test_upkeep_rides_on_the_next_request_evict_first_newest_stored_only() -> None:
    backend = _backend()
    backend.turn_stored(1, 10)
    backend.turn_stored(1, 12)
    assert backend._take_upkeep(1) == (pipe.Stored(1, 12),)
    assert backend._take_upkeep(1) == ()  # taken once
    backend._note(2, evict=True)  # evict() off the event loop: no immediate call
    backend.turn_stored(2, 20)
    assert backend._take_upkeep(2) == (pipe.Evict(2), pipe.Stored(2, 20))
    backend.turn_stored(3, 30)
    backend._note(3, evict=True)  # an Evict after a Stored: the clone is gone
    assert backend._take_upkeep(3) == (pipe.Evict(3),)


async def test_a_stored_is_for_the_clone_of_the_replica_that_made_the_turn() -> None:
    """Another replica's clone of the session missed the turn: the Stored names the replica
    whose reply it was, and only that replica takes it (ray_server.ModelServer._upkeep)."""
    backend = _backend()
    session = SimpleNamespace(id=6, last_message_id=None)

    async def answered_by(replica: str) -> Any:
        async def call(_session: Any, request: pipe.Request, _upkeep: Any) -> pipe.Message:
            return pipe.ReplyMessage(request.req_id, Generated("hi", [1], 1, 1.0, replica=replica))

        return await backend._round_trips(lambda i, _c: pipe.StatsRequest(i), session, call)

    await answered_by("r1")
    backend.turn_stored(6, 60)
    assert backend._take_upkeep(6) == (pipe.Stored(6, 60, "r1"),)
    await answered_by("r2")
    backend.turn_stored(6, 62)
    assert backend._take_upkeep(6) == (pipe.Stored(6, 62, "r2"),)
    backend.turn_stored(6, 64)  # no reply of ours since: for whichever clone made it
    assert backend._take_upkeep(6) == (pipe.Stored(6, 64, None),)


def test_a_failed_requests_upkeep_waits_for_the_next_one() -> None:
    backend = _backend()
    backend._give_back(4, (pipe.Evict(4), pipe.Stored(4, 40)))
    assert backend._take_upkeep(4) == (pipe.Evict(4), pipe.Stored(4, 40))
    backend.turn_stored(5, 52)  # newer than the failed request's
    backend._give_back(5, (pipe.Stored(5, 50),))
    assert backend._take_upkeep(5) == (pipe.Stored(5, 52),)


def _app(running: int, status: str = "HEALTHY") -> Any:
    deployment = SimpleNamespace(
        replica_states={"RUNNING": running}, status=status, message="replica failed"
    )
    return SimpleNamespace(deployments={"model": deployment}, message="", status="RUNNING")


def test_alive_follows_serves_status() -> None:
    backend = _backend()
    assert backend.alive and backend.state == ""
    backend._follow(_app(0, "UNHEALTHY"))
    assert not backend.alive and "no replica running" in backend.state
    assert backend.restart_reasons == {"unhealthy": 1}
    backend._follow(_app(0, "UNHEALTHY"))  # still the same episode
    assert backend.restart_reasons == {"unhealthy": 1}
    backend._follow(_app(1))
    assert backend.alive and backend.state == ""
    backend._follow(None)
    assert not backend.alive and "is gone" in backend.state


class _Serve:
    """ray.serve's status(): raising, hanging until released, or answering."""

    def __init__(self) -> None:
        self.answer: Any = ConnectionError("GCS at 10.0.0.5:6379 is gone")
        self.release = threading.Event()
        self.calls = 0

    def status(self) -> Any:
        self.calls += 1
        if self.answer == "hang":
            self.release.wait(10)
            return SimpleNamespace(applications={"a-0000": _app(1)})
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_a_cluster_that_stops_answering_marks_the_variant_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What /readyz's model check reads ("variant a: <state>"): the status poll's error, or
    its silence past STATUS_TIMEOUT_S, with one poll in flight at a time."""
    serve = _Serve()
    connected = SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setattr(cluster, "_ray", lambda: (connected, serve))
    monkeypatch.setattr(ray_backend, "STATUS_POLL_S", 0.01)
    monkeypatch.setattr(ray_backend, "STATUS_TIMEOUT_S", 0.2)
    backend = _backend()
    states: list[str] = []
    set_state = backend._set
    backend._set = lambda alive, why: (states.append(why), set_state(alive, why))  # type: ignore[method-assign]
    watcher = asyncio.create_task(backend._watch())
    try:
        await until(lambda: not backend.alive, within_s=5, what="the variant marked down")
        assert "ConnectionError: GCS at 10.0.0.5:6379 is gone" in backend.state
        serve.answer = SimpleNamespace(applications={"a-0000": _app(1)})
        await until(lambda: backend.alive, within_s=5, what="the variant back")
        serve.answer = "hang"
        await until(lambda: not backend.alive, within_s=5, what="the silent poll noticed")
        assert "no answer within 0.2 s" in backend.state
        calls, silent = serve.calls, len(states)
        await until(lambda: len(states) >= silent + 3, within_s=5, what="three more periods")
        assert serve.calls == calls  # still the one poll, waited for: no thread piles up
        serve.release.set()
        await until(lambda: backend.alive, within_s=5, what="the answer at last")
    finally:
        serve.release.set()
        backend._closed = True
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
