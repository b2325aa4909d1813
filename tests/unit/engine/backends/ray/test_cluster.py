"""The Ray cluster's side without a Ray instance: the secrets a replica never gets, the
application name front-ends meet on, the health check's share of WORKER_STALL_S, joining
RAY_ADDRESS within bounds, and a clear error where Ray is not installed."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from typing import Any

import pytest
from pydantic import SecretStr

from bot.config import ConfigError, Settings
from bot.engine.backends.ray.cluster import (
    HEALTH_CHECK_FAILURES,
    _check_reachable,
    _health_check_s,
    _join,
    _ray,
    _without_secrets,
    app_name,
)
from bot.engine.variants import Variant


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


def test_a_poll_that_outlives_its_backend_neither_connects_nor_holds_the_exit() -> None:
    """A status poll runs in a thread that close() cannot stop. Once the process has let Ray
    go (the local instance stopped), its status read and its touch must not ray.init() on
    their own: that joined the stopped instance's address and retried for minutes, so the
    service did not exit on SIGTERM (CI, stop 29). Run in a fresh interpreter: where ray is
    imported already, its switch was read then."""
    code = """if True:
        from bot.engine.backends.ray import cluster
        ray, serve = cluster._ray()  # the service's first import of ray
        cluster._Cluster.touch("a-0000", "front-end")  # nothing: not connected
        try:
            cluster._status(serve)
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
