"""RayBackend's bookkeeping without a Ray instance (the contract test runs it on one): the cache
upkeep a session's next request carries, the secrets a replica never gets, Serve's status read
as alive or not, the application name front-ends meet on, the health check's share of
WORKER_STALL_S, and a clear error where Ray is not installed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import SecretStr

from bot.config import ConfigError, Settings
from bot.engine import pipe, ray_backend
from bot.engine.protocol import Generated
from bot.engine.ray_backend import (
    HEALTH_CHECK_FAILURES,
    RayBackend,
    _check_reachable,
    _health_check_s,
    _join,
    _ray,
    _without_secrets,
    app_name,
)
from bot.engine.variants import Variant
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


def test_a_replica_gets_no_secret() -> None:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        telegram_bot_token=SecretStr("123:abc"),
        database_url=SecretStr("postgresql://u:p@h/db"),
        dashboard_password=SecretStr("a long enough password"),
    )
    cleared = _without_secrets(settings)
    assert all(not isinstance(value, SecretStr) for _, value in cleared)
    assert cleared.generation_timeout_s == settings.generation_timeout_s


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


def test_without_ray_installed_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ConfigError, match=r"pip install '\.\[ray\]'"):
        _ray()


def test_an_unreachable_ray_address_is_a_clear_error_before_ray_init() -> None:
    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
            with pytest.raises(ConfigError, match=f"RAY_ADDRESS={re.escape(address)}") as err:
                _check_reachable(address, 1.0)
            assert "ray start --head" in str(err.value)
    _check_reachable("auto", 1.0)  # no port to try: left to ray.init


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
    monkeypatch.setattr(ray_backend, "_ray", lambda: (connected, serve))
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


def test_a_poll_that_outlives_its_backend_neither_connects_nor_holds_the_exit() -> None:
    """A status poll runs in a thread that close() cannot stop. Once the process has let Ray
    go (the local instance stopped), its status read and its touch must not ray.init() on
    their own: that joined the stopped instance's address and retried for minutes, so the
    service did not exit on SIGTERM (CI, stop 29). Run in a fresh interpreter: where ray is
    imported already, its switch was read then."""
    code = """if True:
        from bot.engine import ray_backend
        ray, serve = ray_backend._ray()  # the service's first import of ray
        ray_backend._Cluster.touch("a-0000", "front-end")  # nothing: not connected
        try:
            ray_backend._status(serve)
        except RuntimeError as err:
            print("status:", err)
        try:
            ray.get_actor("applications", namespace="telegram-bot")
        except Exception as err:
            print("get_actor:", type(err).__name__)
        print("initialized:", ray.is_initialized())
    """
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:9"}  # if it did connect: refused there
    env.pop("RAY_ENABLE_AUTO_CONNECT", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "status: not connected to Ray" in out.stdout, out.stdout
    assert "get_actor: " in out.stdout, out.stdout  # raised rather than ray.init()
    assert "initialized: False" in out.stdout, out.stdout


def test_joining_is_bounded_and_its_failure_names_ray_address_and_the_token() -> None:
    """ray.init on a GCS that answers but refuses (token authentication) retries for long:
    the join gives up after its timeout, or says why ray.init failed."""
    release = threading.Event()

    class Hangs:
        def init(self, **_: Any) -> None:
            release.wait(10)

    class Refused:
        def init(self, **_: Any) -> None:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379")

    try:
        with pytest.raises(ConfigError, match=r"did not return within 0\.1 s") as err:
            _join(Hangs(), "10.0.0.5:6379", {}, 0.1)
        assert "RAY_ADDRESS=10.0.0.5:6379" in str(err.value)
    finally:
        release.set()
    with pytest.raises(ConfigError, match="ConnectionError: Failed to connect") as err:
        _join(Refused(), "10.0.0.5:6379", {}, 5)
    assert "RAY_AUTH_MODE=token" in str(err.value)


def _front_end(url: str, **own: Any) -> Settings:
    return Settings(_env_file=None, database_url=SecretStr(url), **own)  # type: ignore[call-arg]


def test_front_ends_of_one_service_name_a_variants_application_alike() -> None:
    a = Variant("a", "zoo:blender/blender_90M/model")
    url = "postgresql+asyncpg://bot:secret@db:5432/bot"
    name = app_name(a, _front_end(url, data_dir="/srv/one", metrics_port=9101))
    # What is each front-end's own (its folder, its port, the password it is given) is not in it.
    assert name == app_name(a, _front_end(url.replace("secret", "other"), data_dir="/srv/two"))
    assert name.startswith("a-") and "secret" not in name
    others = [
        app_name(a, _front_end("postgresql+asyncpg://bot:secret@db:5432/other")),  # a service
        app_name(Variant("a", "zoo:blender/blender_400Mdistill/model"), _front_end(url)),
        app_name(Variant("a", a.model, replicas=2), _front_end(url)),
        app_name(Variant("a", a.model, generation={"beam_size": 3}), _front_end(url)),
        app_name(Variant("b", a.model), _front_end(url)),
    ]
    assert len({name, *others}) == 1 + len(others)


def test_a_stalled_replica_is_replaced_within_the_stall_limit() -> None:
    # Serve replaces a replica after HEALTH_CHECK_FAILURES checks in a row time out.
    assert HEALTH_CHECK_FAILURES * _health_check_s(10.0) == pytest.approx(10.0)
    assert _health_check_s(2.0) == 1.0  # not below a second
