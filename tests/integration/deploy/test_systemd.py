"""deploy/systemd: `systemd-analyze verify` passes on the unit (deploy/systemd/verify, also run
by .ci/run) and fails on a misspelt setting; the unit stops restarting on a configuration
error (exit status 2, which `python -m bot run` really returns for one), passes the token as
the credential Settings reads, keeps its state in StateDirectory=, and takes its ports from a
per-replica file whose scheme gives valid, distinct ports for every replica number it
accepts (and nginx's upstream is replicas 1-3 of it). systemd-analyze missing: skipped, or
failed under CI=true."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from bench.scaleout import unit_command
from bot.config import TOKEN_CREDENTIAL
from tests.support.cli import run_cli
from tests.support.deployfiles import (
    ROOT,
    UNIT,
    assert_misspelling_refused,
    assert_units_verified,
    unit_values,
)

REPLICA_ENV = ROOT / "deploy" / "systemd" / "replica-env"
NGINX = ROOT / "deploy" / "nginx" / "telegram-bot.conf"


def settings(name: str) -> list[str]:
    """Every value of `name=` in the unit, in order."""
    return unit_values(UNIT, name)


def replica_env(arg: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPLICA_ENV), arg], capture_output=True, text=True, timeout=10, check=False
    )


def test_systemd_analyze_verifies_the_unit_and_refuses_a_misspelt_setting(
    tmp_path: Path,
) -> None:
    assert_units_verified("telegram-bot@12345.service")
    assert_misspelling_refused(tmp_path, UNIT, "RestartSec", "RestartSecs")


def test_a_configuration_error_exits_2_and_is_not_restarted(tmp_path: Path) -> None:
    assert "2" in settings("RestartPreventExitStatus")[0].split()
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "TELEGRAM_BOT_TOKEN": "1:x",
        "WEBHOOK_SECRET": "too short",  # refused before anything loads
        "DATA_DIR": str(tmp_path),
    }
    done = run_cli("run", cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "WEBHOOK_SECRET must be" in done.stderr


def test_token_credential_state_directory_and_hardening() -> None:
    assert settings("LoadCredential") == [f"{TOKEN_CREDENTIAL}:/etc/telegram-bot/token"]
    assert not [line for line in settings("Environment") if "TOKEN" in line]
    [state] = settings("StateDirectory")
    assert f"DATA_DIR=%S/{state}" in settings("Environment")
    assert settings("ProtectSystem") == ["strict"]
    # What the model worker processes need stays: /dev/shm and the GPUs' device nodes.
    for closing in ("PrivateDevices", "DeviceAllow", "DevicePolicy", "ProtectClock"):
        assert not settings(closing), closing
    assert not settings("MemoryDenyWriteExecute")
    assert not [p for p in settings("InaccessiblePaths") if "/dev" in p]


def test_the_port_scheme_is_valid_for_every_replica_number_it_accepts() -> None:
    assert "/etc/telegram-bot/replica-%i.env" in settings("EnvironmentFile")
    assert not [line for line in settings("Environment") if "PORT" in line]
    webhook: set[int] = set()
    metrics: set[int] = set()
    for n in (1, 2, 9, 10, 11, 99, 100, 658, 659):
        done = replica_env(str(n))
        assert done.returncode == 0, done.stderr
        env = dict(line.split("=", 1) for line in done.stdout.splitlines())
        assert set(env) == {"WEBHOOK_PORT", "METRICS_PORT"}
        webhook.add(int(env["WEBHOOK_PORT"]))
        metrics.add(int(env["METRICS_PORT"]))
    ports = webhook | metrics
    assert len(ports) == 18 and all(1024 < p < 65536 for p in ports)  # no two the same
    # Every accepted N: the formula's ranges do not meet (8441..9099 and 9101..9759).
    assert max(8440 + n for n in range(1, 660)) < min(9100 + n for n in range(1, 660))
    for refused in ("0", "660", "01", "x", "", "-1"):
        done = replica_env(refused)
        assert done.returncode == 2 and "by hand" in done.stderr, refused
    # nginx balances over replicas 1-3; bench/scaleout starts replica 12 with its ports.
    upstream = [int(p) for p in re.findall(r"server 127\.0\.0\.1:(\d+)", NGINX.read_text())]
    assert upstream == [8441, 8442, 8443]
    _, env = unit_command(12)
    assert (env["WEBHOOK_PORT"], env["METRICS_PORT"]) == ("8452", "9112")
    assert not [v for v in env.values() if "%i" in v]
