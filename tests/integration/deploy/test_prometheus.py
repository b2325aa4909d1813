"""deploy/prometheus/alerts.yml through promtool: the rules load (`promtool check rules`),
fire as deploy/prometheus/alerts_test.yml says (`promtool test rules`), and those tests can
fail; every Grafana query in deploy/grafana/ is valid PromQL. Skipped where promtool is
missing, failed under CI=true (.ci/run installs Debian's `prometheus` package). That the
series they name are the service's own: tests/e2e/test_ops_metrics.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.support.deployfiles import (
    ALERTS,
    ALERTS_TEST,
    alert_exprs,
    dashboard_exprs,
    metric_names,
    require_tool,
)

INSTALL = "sudo apt-get install prometheus"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    tool = require_tool("promtool", INSTALL)
    return subprocess.run(
        [tool, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_alert_rules_load_and_pass_their_unit_tests() -> None:
    checked = promtool("check", "rules", ALERTS.name, cwd=ALERTS.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_exprs())} rules found" in checked.stdout
    tested = promtool("test", "rules", ALERTS_TEST.name, cwd=ALERTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_is_tested_firing() -> None:
    """Each rule of alerts.yml has a case in alerts_test.yml where it fires."""
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert fired == set(alert_exprs())


def test_the_unit_tests_fail_when_a_threshold_moves(tmp_path: Path) -> None:
    """The tests can fail: the inbox-lag alert at 50 s instead of 30 s no longer fires on
    alerts_test.yml's 40 s, and promtool says so."""
    text = ALERTS.read_text()
    assert "(bot_inbox_lag_seconds) > 30" in text
    (tmp_path / ALERTS.name).write_text(
        text.replace("(bot_inbox_lag_seconds) > 30", "(bot_inbox_lag_seconds) > 50")
    )
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    tested = promtool("test", "rules", ALERTS_TEST.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "alertname: BotInboxLag, time: 7m" in tested.stdout + tested.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """Each Grafana query (its variables given values) as a recording rule: `promtool check
    rules` parses it; and each names at least one metric."""
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    for expr in exprs:
        assert metric_names(expr), expr
    rules = [{"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promtool("check", "rules", path.name, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The check does parse: a broken query is refused.
    path.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "d", "rules": [{"record": "x:y", "expr": "rate(x[5m]"}]}]}
        )
    )
    assert promtool("check", "rules", path.name, cwd=tmp_path).returncode != 0
