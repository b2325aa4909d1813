"""The dashboard in a real browser: Debian's Chromium, driven by Selenium, against the dashboard
served the way `run` serves it (its own thread and event loop) on a seeded SQLite database.

Skipped with the reason where Chromium is missing, failed under CI=true (tests/support/
browser.py). DASHBOARD_SCREENSHOTS=docs/images writes each page's screenshot there (the
README's); by default they go to the test's temporary folder.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.dashboard.server import DashboardThread
from bot.db import migrate
from tests.support.browser import require_chromium, start_chromium
from tests.support.dashboard import (
    HOSTILE_PERSONA,
    HOSTILE_REPLY,
    HOSTILE_TEXT,
    PASSWORD,
    DashboardSeed,
    dashboard_settings,
    seed_dashboard,
)

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("/", "/conversations", "/variants", "/health")
MAX_SCREENSHOT_BYTES = 200_000


@dataclass
class Live:
    """A served dashboard, its database, and a browser."""

    base: str
    db_url: str
    data_dir: Path
    seed: DashboardSeed
    driver: Any
    shots: Path

    def go(self, path: str) -> None:
        """Open a page of the dashboard."""
        self.driver.get(self.base + path)

    def path(self) -> str:
        """The path (and query) the browser is at."""
        from urllib.parse import urlsplit

        parts = urlsplit(self.driver.current_url)
        return parts.path + (f"?{parts.query}" if parts.query else "")

    def shot(self, name: str) -> None:
        """A screenshot of the whole page (up to 1600 px high), small enough for the README."""
        import base64

        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        clip = {"x": 0, "y": 0, "width": 1280, "height": min(int(height), 1600), "scale": 1}
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": clip},
        )
        target = self.shots / f"dashboard-{name}.png"
        target.write_bytes(base64.b64decode(shot["data"]))
        assert target.stat().st_size < MAX_SCREENSHOT_BYTES, (target, target.stat().st_size)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """One seeded database, one dashboard and one browser for the module's tests."""
    require_chromium()
    tmp = tmp_path_factory.mktemp("dashboard_browser")
    db_url = f"sqlite+aiosqlite:///{tmp / 'bot.sqlite3'}"
    migrate.upgrade(db_url)
    seed = asyncio.run(seed_dashboard(db_url))
    settings = dashboard_settings(tmp, db_url, db_url)
    served = DashboardThread(settings)
    served.start()
    driver = start_chromium()
    shots = Path(os.environ.get("DASHBOARD_SCREENSHOTS") or tmp)
    if not shots.is_absolute():
        shots = ROOT / shots
    shots.mkdir(parents=True, exist_ok=True)
    try:
        assert served.url is not None
        yield Live(served.url.rstrip("/"), db_url, tmp, seed, driver, shots)
    finally:
        driver.quit()
        served.stop()


def _by(kind: str) -> Any:
    from selenium.webdriver.common.by import By

    return getattr(By, kind)


def _log_in(live: Live) -> None:
    live.driver.delete_all_cookies()
    live.go("/")
    assert live.path().startswith("/login"), live.path()
    live.driver.find_element(_by("ID"), "password").send_keys(PASSWORD)
    _submit(live, "login")
    assert live.path() == "/", (live.path(), live.driver.page_source[-800:])


def _submit(live: Live, button: str) -> None:
    """Click a form's button and wait for the next page to replace this one."""
    _follow(live, live.driver.find_element(_by("ID"), button))


def _follow(live: Live, element: Any) -> None:
    """Click a link or button and wait until the next page has replaced this one."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    old = live.driver.find_element(_by("TAG_NAME"), "html")
    element.click()

    def replaced(driver: Any) -> bool:
        try:
            old.is_enabled()
        except WebDriverException:  # stale, or (chromedriver) "does not belong to the document"
            return bool(driver.execute_script("return document.readyState") == "complete")
        return False

    # a script run while the next page loads may fail too: WebDriverWait then tries again
    WebDriverWait(live.driver, 30, ignored_exceptions=(WebDriverException,)).until(replaced)


def _admin_stats_json(live: Live) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "ADMIN_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "bot", "admin", "stats", "--json"],
        cwd=live.data_dir,
        env={**env, "PYTHONPATH": str(ROOT), "DATABASE_URL": live.db_url},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def test_no_page_without_logging_in(live: Live) -> None:
    live.driver.delete_all_cookies()
    for path in (*PAGES, f"/conversations/{live.seed.hostile_session}"):
        live.go(path)
        assert live.path().startswith("/login?next="), (path, live.path())
        assert live.driver.find_elements(_by("ID"), "password")
    live.shot("login")


def test_log_in_and_the_overview_equals_admin_stats(live: Live) -> None:
    _log_in(live)
    expected = _admin_stats_json(live)
    figures = live.driver.find_elements(_by("CSS_SELECTOR"), "[data-stat]")
    shown = {f.get_attribute("data-stat"): f.get_attribute("data-value") for f in figures}
    compared = [k for k in shown if k in expected]
    assert len(compared) >= 14, compared
    for key in compared:
        value = expected[key]
        assert shown[key] == ("" if value is None else str(value)), key
    # the visible text says the same as the attribute
    chats = live.driver.find_element(_by("CSS_SELECTOR"), '[data-stat="chats"] .value')
    assert chats.text == f"{expected['chats']:,}"
    for chart in ("chart-messages", "chart-latency"):
        svg = live.driver.find_element(_by("ID"), chart)
        assert svg.is_displayed() and svg.size["width"] > 300
    live.shot("overview")


def test_search_and_open_a_transcript(live: Live) -> None:
    _log_in(live)
    _follow(live, live.driver.find_element(_by("LINK_TEXT"), "Conversations"))
    rows = live.driver.find_elements(_by("CSS_SELECTOR"), "#conversations tbody tr")
    assert len(rows) > 5
    live.shot("conversations")

    box = live.driver.find_element(_by("ID"), "q-chat")
    box.send_keys("1001")
    _submit(live, "q-go")
    rows = live.driver.find_elements(_by("CSS_SELECTOR"), "#conversations tbody tr")
    s1, s2, _, _ = live.seed.admin_sessions
    assert [r.get_attribute("data-session") for r in rows] == [str(s2), str(s1)]
    assert "chat_id=1001" in live.path()

    _follow(live, rows[1].find_element(_by("TAG_NAME"), "a"))
    assert live.path() == f"/conversations/{s1}"
    lines = live.driver.find_elements(_by("CSS_SELECTOR"), "#transcript li .text")
    assert [x.text for x in lines] == [
        "hi",
        "hello there",
        "do you like cats?",
        "i love cats.",
        "bye",
        "goodbye",
    ]
    assert "cats" in live.driver.find_element(_by("ID"), "persona").text.lower()


def test_markup_in_a_conversation_is_text_and_no_script_runs(live: Live) -> None:
    _log_in(live)
    live.go(f"/conversations/{live.seed.hostile_session}")
    texts = [x.text for x in live.driver.find_elements(_by("CSS_SELECTOR"), "#transcript li .text")]
    assert texts == [HOSTILE_TEXT, HOSTILE_REPLY]  # the DOM's text: the characters as sent
    assert live.driver.find_element(_by("ID"), "persona").text == HOSTILE_PERSONA
    # nothing became an element, and nothing ran
    assert live.driver.execute_script("return document.scripts.length") == 0
    assert live.driver.find_elements(_by("CSS_SELECTOR"), "main img, main b") == []
    assert live.driver.execute_script("return typeof window.__pwned") == "undefined"
    live.shot("transcript")


def test_variants_chart(live: Live) -> None:
    _log_in(live)
    _follow(live, live.driver.find_element(_by("LINK_TEXT"), "Variants"))
    svg = live.driver.find_element(_by("ID"), "chart-variants")
    assert svg.is_displayed() and svg.size["width"] > 300 and svg.size["height"] > 100
    groups = svg.find_elements(_by("CSS_SELECTOR"), "g.interval")
    names = [g.get_attribute("data-variant") for g in groups]
    assert names[:2] == ["beam (control)", "nucleus"]
    # each variant with votes has its rate drawn inside its interval
    for g in groups:
        rates = g.find_elements(_by("CSS_SELECTOR"), "circle.rate")
        for rate in rates:
            assert rate.is_displayed()
    live.shot("variants")


def test_health_page(live: Live) -> None:
    _log_in(live)
    _follow(live, live.driver.find_element(_by("LINK_TEXT"), "Health"))
    states = {
        r.get_attribute("data-owner"): r.find_element(_by("CSS_SELECTOR"), "td.state").text
        for r in live.driver.find_elements(_by("CSS_SELECTOR"), "#replicas tbody tr")
    }
    assert states == {"hostA:11:aa": "alive", "hostB:22:bb": "dead"}
    live.shot("health")


def test_log_out(live: Live) -> None:
    _log_in(live)
    _submit(live, "logout")
    assert live.path() == "/login"
    live.go("/")
    assert live.path().startswith("/login?next=")
