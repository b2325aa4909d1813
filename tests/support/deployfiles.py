"""The deployment files' queries (deploy/prometheus, deploy/grafana) as the tests read them:
each PromQL expression, and the metric names it selects; and the external tools that check
them (promtool, systemd-analyze), skipped where missing but required under CI=true, as
tests/support/browser.py does for Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERTS_TEST = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "telegram-bot.json"
UNIT = ROOT / "deploy" / "systemd" / "telegram-bot@.service"
VERIFY = ROOT / "deploy" / "systemd" / "verify"

# Series Prometheus writes itself for every scrape target, not the service.
SCRAPE_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})
# PromQL words that look like names but are not metrics.
_KEYWORDS = frozenset(
    [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan",
    ]
)
# Grafana's variables, as a value PromQL accepts, so a query can be checked as written.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m"}


def unit_values(unit: Path, name: str) -> list[str]:
    """Every value of `name=` in a systemd unit file, in order."""
    return [
        line.split("=", 1)[1]
        for line in unit.read_text().splitlines()
        if line.startswith(f"{name}=")
    ]


def require_tool(name: str, install: str) -> str:
    """The tool's path; skip (or, under CI=true, fail) where it is missing."""
    path = shutil.which(name)
    if path is not None:
        return path
    why = f"{name} is not installed ({install})"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why} -- required under CI=true (.ci/run installs it)")
    pytest.skip(why)


def verify_units(*units: Path) -> subprocess.CompletedProcess[str]:
    """deploy/systemd/verify (systemd-analyze verify) on `units`, or on all of deploy/systemd's
    units when none is given; skips without systemd-analyze (fails under CI=true)."""
    require_tool("systemd-analyze", "sudo apt-get install systemd")
    return subprocess.run(
        [str(VERIFY), *map(str, units)], capture_output=True, text=True, timeout=60
    )


def assert_units_verified(*names: str) -> None:
    """verify_units on all of deploy/systemd's units passes and says `<name>: OK` for each."""
    done = verify_units()
    assert done.returncode == 0, done.stdout + done.stderr
    for name in names:
        assert f"{name}: OK" in done.stdout


def assert_misspelling_refused(
    tmp_path: Path, unit: Path, key: str, misspelt: str, *beside: Path
) -> None:
    """verify_units on a copy of `unit` whose `key=` is spelt `misspelt=` (with the units
    `beside` it): it fails and names the unknown key."""
    broken = tmp_path / unit.name
    broken.write_text(unit.read_text().replace(f"{key}=", f"{misspelt}="))
    done = verify_units(*beside, broken)
    assert done.returncode == 1
    assert f"Unknown key '{misspelt}'" in done.stderr


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once strings, label
    matchers, ranges, grouping clauses, function calls, keywords and numbers are taken out."""
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in _KEYWORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]", word) or word.startswith("$"):
            continue
        names.add(word)
    return names


def alert_exprs() -> dict[str, str]:
    """alerts.yml: alert name -> its expression."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def alert_test_series() -> list[str]:
    """alerts_test.yml: every input series, as written (`name{labels}`)."""
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    return [s["series"] for test in tests for s in test["input_series"]]


def dashboard_exprs() -> list[str]:
    """The Grafana dashboard: every panel query and variable query, Grafana's variables
    replaced by values PromQL accepts."""
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            # label_values(METRIC, LABEL) is Grafana's, not PromQL: its metric is the selector.
            found = re.fullmatch(r"label_values\((.+),\s*\w+\)", query["query"])
            assert found, f"variable {variable['name']}: unexpected query {query['query']}"
            exprs.append(found.group(1))
    out = []
    for expr in exprs:
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        out.append(expr.replace('"$instance"', '".*"'))
    return out
