"""The admin dashboard over HTTP: the real aiohttp application on a real seeded database (SQLite
and PostgreSQL), reading through the read-only connection of `admin sql`.

Access (every route refuses without a login, the cookie's flags, logout revokes, the login is
rate-limited, cross-site posts are refused), the figures (the overview's equal `admin stats
--json`), the pages (search, pagination, transcript, variants, health), escaping, and that
nothing the dashboard does writes to the database. The browser's view is tests/e2e/
test_dashboard_browser.py.
"""

from __future__ import annotations

import asyncio
import html
import json
import math
import re
import socket
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import text

from bot.admin.cli import admin_sql_url
from bot.admin.sql import SqlRefused, readonly_engine
from bot.config import ConfigError, Settings
from bot.conversations.store import ConversationStore
from bot.dashboard import check_settings, start_dashboard
from bot.dashboard.app import DASHBOARD, build_app
from bot.dashboard.auth import COOKIE, LoginLimiter, Logins, Password, Throttled
from bot.db import migrate
from bot.db.engine import make_engine, make_sessionmaker
from bot.engine.variants import load_experiment
from bot.reports.dashboard import ConversationFilter, conversations
from tests.integration.admin.test_admin import run, snapshot
from tests.support.cli import cli_env, run_cli
from tests.support.dashboard import (
    HOSTILE_PERSONA,
    HOSTILE_REPLY,
    HOSTILE_TEXT,
    PASSWORD,
    DashboardSeed,
    dashboard_settings,
    seed_dashboard,
)
from tests.support.dbutil import (
    create_pg_database,
    drop_pg_database,
)

STAT = re.compile(r'data-stat="(\w+)" data-value="([^"]*)"')


@dataclass
class Dash:
    """A seeded database and a logged-out client of its dashboard."""

    db_url: str
    settings: Settings
    seed: DashboardSeed
    client: TestClient
    app: web.Application
    app_routes: list[tuple[str, str]]  # (method, path template)


@pytest.fixture
async def dash(db_url: str, readonly_url: str, tmp_path: Path) -> AsyncIterator[Dash]:
    """The dashboard of a seeded database, served by aiohttp's test server."""
    seed = await seed_dashboard(db_url)
    settings = dashboard_settings(tmp_path, db_url, readonly_url)
    app = build_app(
        settings,
        url=admin_sql_url(settings),
        password=PASSWORD,
        experiment=load_experiment(settings),
        listen=settings.dashboard_listen,
    )
    routes = [(r.method, r.resource.canonical) for r in app.router.routes() if r.resource]
    async with TestClient(TestServer(app)) as client:
        yield Dash(db_url, settings, seed, client, app, routes)


async def login(client: TestClient, password: str = PASSWORD) -> ClientResponse:
    """POST the login form; returns the (unfollowed) answer."""
    return await client.post(
        "/login", data={"password": password, "next": "/"}, allow_redirects=False
    )


async def page(client: TestClient, path: str) -> str:
    """GET a page that must answer 200; its HTML."""
    r = await client.get(path, allow_redirects=False)
    body = await r.text()
    assert r.status == 200, (path, r.status, body[:500])
    return body


def _concrete(path: str, seed: DashboardSeed) -> str:
    return path.replace("{session_id}", str(seed.hostile_session))


# --- access ----------------------------------------------------------------------------------


async def test_no_route_answers_without_a_login(dash: Dash) -> None:
    guarded = [
        (m, p)
        for m, p in dash.app_routes
        if m in ("GET", "POST") and p != "/login" and not p.startswith("/static")
    ]
    # every page of the dashboard is in the list (so a new route cannot slip past this test)
    assert {p for _, p in guarded} >= {
        "/",
        "/conversations",
        "/conversations/{session_id}",
        "/variants",
        "/health",
        "/audit",
        "/logout",
    }
    forged = Logins(Password(PASSWORD)).create()  # signed with another process's key
    for cookies in ({}, {COOKIE: "garbage"}, {COOKIE: forged}):
        dash.client.session.cookie_jar.clear()
        dash.client.session.cookie_jar.update_cookies(cookies)
        for method, path in guarded:
            url = _concrete(path, dash.seed)
            r = await dash.client.request(method, url, allow_redirects=False)
            body = await r.text()
            assert r.status == 303, (method, url, cookies, r.status)
            assert r.headers["Location"].startswith("/login?next="), r.headers["Location"]
            assert "bold" not in body and "pwned" not in body and "1001" not in body
    # the login page and the stylesheet are all there is without a login
    assert (await dash.client.get("/login")).status == 200
    assert (await dash.client.get("/static/dashboard.css")).status == 200


async def test_login_sets_a_strict_httponly_cookie_and_logout_revokes_it(dash: Dash) -> None:
    r = await login(dash.client, "wrong")
    assert r.status == 401 and "Wrong password" in await r.text()
    assert COOKIE not in {c.key for c in dash.client.session.cookie_jar}

    r = await login(dash.client)
    assert r.status == 303 and r.headers["Location"] == "/"
    set_cookie = r.headers["Set-Cookie"]
    assert set_cookie.startswith(f"{COOKIE}=")
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
    assert PASSWORD not in set_cookie
    cookie = r.cookies[COOKIE].value
    assert (await dash.client.get("/", allow_redirects=False)).status == 200

    # a cross-site form post carries an Origin of another site: refused, session kept
    r = await dash.client.post(
        "/logout", headers={"Origin": "https://evil.example"}, allow_redirects=False
    )
    assert r.status == 403
    assert (await dash.client.get("/", allow_redirects=False)).status == 200

    r = await dash.client.post("/logout", allow_redirects=False)
    assert r.status == 303 and r.headers["Location"] == "/login"
    # the old cookie, replayed, is dead: logout ended the login on the server
    dash.client.session.cookie_jar.update_cookies({COOKIE: cookie})
    r = await dash.client.get("/", allow_redirects=False)
    assert r.status == 303 and r.headers["Location"].startswith("/login")


async def test_failed_logins_slow_guessing_without_locking_the_operator_out(dash: Dash) -> None:
    """Regression: five wrong guesses locked the address out for 5 minutes, and behind ssh -L
    or a proxy every client has the operator's address, 127.0.0.1."""
    for _ in range(5):
        assert (await login(dash.client, "guess")).status == 401
    r = await login(dash.client, "guess")
    assert r.status == 429 and 0 < int(r.headers["Retry-After"]) <= 2
    # while throttled even the right password is not checked ...
    r = await login(dash.client)
    assert r.status == 429 and COOKIE not in r.cookies
    # ... but after Retry-After it gets in, for all those failures
    await asyncio.sleep(int(r.headers["Retry-After"]))
    r = await login(dash.client)
    assert r.status == 303 and COOKIE in r.cookies


async def test_failed_logins_are_limited_across_addresses(dash: Dash) -> None:
    """Regression: the limit was per peer address, so from 40 other loopback addresses every
    guess was checked. Now about one guess a second gets checked, from wherever it comes."""
    try:
        socket.create_server(("127.0.0.2", 0)).close()
    except OSError:  # Linux answers on all of 127.0.0.0/8; macOS only on 127.0.0.1
        pytest.skip("no loopback address but 127.0.0.1 here")
    loop = asyncio.get_running_loop()
    started, checked, throttled = loop.time(), 0, 0
    for i in range(2, 42):
        connector = aiohttp.TCPConnector(local_addr=(f"127.0.0.{i}", 0))
        async with aiohttp.ClientSession(connector=connector) as client:
            for _ in range(5):
                async with client.post(
                    dash.client.make_url("/login"), data={"password": "guess"}
                ) as r:
                    checked += r.status == 401
                    throttled += r.status == 429
    elapsed_s = loop.time() - started
    assert checked + throttled == 200
    assert checked <= 5 + 1 + elapsed_s, (checked, elapsed_s)


def test_the_login_limit_is_a_delay_after_a_few_failures() -> None:
    now = [1000.0]
    limiter = LoginLimiter(free_failures=3, window_s=60, delay_s=2, clock=lambda: now[0])
    for _ in range(3):
        assert limiter.check() is None
        limiter.failed()
    assert limiter.check() == Throttled(2)
    now[0] += 1.5
    assert limiter.check() == Throttled(1)
    now[0] += 0.5
    assert limiter.check() is None  # one try per delay_s from now on
    limiter.failed()
    assert limiter.check() == Throttled(2)
    now[0] += 60  # no failure for a window: free tries again
    for _ in range(3):
        assert limiter.check() is None
        limiter.failed()
    assert limiter.check() is not None


async def test_only_its_own_host_names_are_answered(
    dash: Dash, db_url: str, readonly_url: str, tmp_path: Path
) -> None:
    """Regression (DNS rebinding: evil.example made to resolve to 127.0.0.1 is same-origin to
    the browser, Origin check included): a login posted with Host: evil.example got a login."""
    r = await dash.client.post(
        "/login",
        data={"password": PASSWORD, "next": "/"},
        headers={"Host": "evil.example", "Origin": "http://evil.example"},
        allow_redirects=False,
    )
    assert r.status == 421 and COOKIE not in r.cookies
    assert r.headers["X-Frame-Options"] == "DENY"  # refused with the usual headers
    for host in ("evil.example:8090", "127.0.0.1.evil.example", "localhost.evil.example", ""):
        r = await dash.client.get("/login", headers={"Host": host})
        assert r.status == 421, host
    # loopback names (ssh -L, a proxy on this machine), with any port
    for host in ("127.0.0.1:8090", "localhost", "LOCALHOST:1234", "[::1]:8090", "127.0.0.7"):
        assert (await dash.client.get("/login", headers={"Host": host})).status == 200, host

    # the listen address and DASHBOARD_ALLOWED_HOSTS (what a TLS proxy passes on)
    settings = dashboard_settings(
        tmp_path, db_url, readonly_url, dashboard_allowed_hosts="Dash.Example.org, [fd00::1]"
    )
    assert settings.dashboard_allowed_hosts == ["dash.example.org", "fd00::1"]
    app = build_app(
        settings,
        url=admin_sql_url(settings),
        password=PASSWORD,
        experiment=load_experiment(settings),
        listen="10.1.2.3",
    )
    async with TestClient(TestServer(app)) as client:
        for host in ("dash.example.org", "DASH.example.ORG:443", "[fd00::1]:8090", "10.1.2.3:80"):
            r = await client.post(
                "/login",
                data={"password": PASSWORD, "next": "/"},
                headers={"Host": host},
                allow_redirects=False,
            )
            assert r.status == 303 and COOKIE in r.cookies, host
        for host in ("evil.example", "example.org", "10.1.2.4"):
            assert (await client.get("/login", headers={"Host": host})).status == 421, host


def test_allowed_hosts_are_bare_host_names() -> None:
    for bad in ("dash.example.org:443", "https://dash.example.org", "a/b", "x y"):
        with pytest.raises(ValueError, match="DASHBOARD_ALLOWED_HOSTS"):
            Settings(_env_file=None, dashboard_allowed_hosts=bad)  # type: ignore[call-arg]


async def test_login_redirects_only_within_the_site(dash: Dash) -> None:
    for target, expected in (
        ("/conversations?persona=x", "/conversations?persona=x"),
        ("https://evil.example/", "/"),
        ("//evil.example/", "/"),
        ("/\t/evil.example", "/"),  # normalised to //evil.example in Location (review)
        ("/ /evil.example", "/"),
        ("/\\evil.example", "/"),
    ):
        dash.client.session.cookie_jar.clear()
        r = await dash.client.post(
            "/login", data={"password": PASSWORD, "next": target}, allow_redirects=False
        )
        assert r.headers["Location"] == expected


# --- pages -------------------------------------------------------------------------------------


async def test_overview_figures_equal_admin_stats_json(dash: Dash) -> None:
    await login(dash.client)
    body = await page(dash.client, "/")
    shown = dict(STAT.findall(body))
    status, out = await run(dash.db_url, "stats", "--json")
    assert status == 0
    expected = json.loads(out)
    compared = [k for k in shown if k in expected]
    assert len(compared) >= 14, compared
    for key in compared:
        value = expected[key]
        assert shown[key] == ("" if value is None else str(value)), key
    # beyond admin stats: the outbox depth, and the cache hit rate of the live replica only
    # "buried" (still being retried), the hostile chat's notice and reply (never sent)
    assert shown["outbox_depth"] == "3"
    assert float(shown["cache_hit_rate"]) == pytest.approx(30 / 40)
    assert 'id="chart-messages"' in body and 'id="chart-latency"' in body
    assert body.count('class="bar"') == 14  # one per day of the default 14


async def test_conversations_search_and_pages(dash: Dash) -> None:
    await login(dash.client)
    body = await page(dash.client, "/conversations?chat_id=1001")
    sessions = re.findall(r'data-session="(\d+)"', body)
    s1, s2, _, _ = dash.seed.admin_sessions
    assert sessions == [str(s2), str(s1)]  # most recent first

    body = await page(dash.client, "/conversations?persona=PIRATE")  # case-insensitive
    assert len(re.findall(r'data-session="(\d+)"', body)) == 2
    body = await page(dash.client, "/conversations?persona=100%25")  # % is no wildcard
    assert 'id="no-results"' in body

    today = datetime.now(UTC).date().isoformat()
    on_today = re.findall(
        r'data-session="(\d+)"', await page(dash.client, f"/conversations?on={today}")
    )
    assert str(s2) in on_today and str(s1) not in on_today  # s1 was three days ago

    # keyset pages: every conversation once, in order, whatever the page size
    engine = readonly_engine(admin_sql_url(dash.settings))
    try:
        async with make_sessionmaker(engine)() as db:
            everything = (await conversations(db, ConversationFilter(), limit=1000)).rows
            walked, where = [], ConversationFilter()
            while True:
                got = await conversations(db, where, limit=7)
                walked += got.rows
                if got.next_before is None:
                    break
                where = ConversationFilter(before=got.next_before)
    finally:
        await engine.dispose()
    assert [r.id for r in walked] == [r.id for r in everything]
    assert len(everything) > 7
    stamps = [(r.updated_at, r.id) for r in everything]
    assert stamps == sorted(stamps, reverse=True)

    # the page's own "older" links lead through the same list
    dash.app[DASHBOARD].page_size = 4
    shown: list[str] = []
    link: str | None = "/conversations"
    while link is not None:
        body = await page(dash.client, link)
        shown += re.findall(r'data-session="(\d+)"', body)
        older = re.search(r'href="([^"]+)" id="next-page"', body)
        link = html.unescape(older.group(1)) if older else None
    assert shown == [str(r.id) for r in everything]


async def test_search_input_out_of_range_is_a_400_that_says_why(dash: Dash) -> None:
    """Regression: 2**63 as a chat id or page link, or the last day there is, was a 500 with a
    traceback (the driver's or datetime's OverflowError)."""
    await login(dash.client)
    for query, message in (
        ("chat_id=9223372036854775808", "chat id is out of range"),
        ("chat_id=-9223372036854775809", "chat id is out of range"),
        ("chat_id=abc", "must be a whole number"),
        ("on=9999-12-31", "date is out of range"),
        ("on=2026-02-30", "must be YYYY-MM-DD"),
        ("before=2026-01-01T00:00:00%7C9223372036854775808", "page link is broken"),
        ("before=9999-12-31T23:59:59-05:00%7C1", "page link is broken"),
        ("before=nonsense", "page link is broken"),
    ):
        r = await dash.client.get(f"/conversations?{query}", allow_redirects=False)
        body = await r.text()
        assert (r.status, message in body) == (400, True), (query, r.status, body[-800:])
        assert "Traceback" not in body
    # the extremes that fit are searched as usual
    for query in ("chat_id=9223372036854775807", "chat_id=-9223372036854775808", "on=9999-12-30"):
        assert 'id="no-results"' in await page(dash.client, f"/conversations?{query}")


async def test_transcript_shows_persona_votes_delivery_and_escapes_markup(dash: Dash) -> None:
    await login(dash.client)
    r = await dash.client.get(f"/conversations/{dash.seed.hostile_session}")
    body = await r.text()
    assert "script-src" not in r.headers["Content-Security-Policy"]  # default-src 'none'
    assert "default-src 'none'" in r.headers["Content-Security-Policy"]
    for hostile in (HOSTILE_PERSONA, HOSTILE_TEXT, HOSTILE_REPLY):
        assert hostile not in body and hostile in html.unescape(body)
    assert "<script>" not in body and "<img" not in body and "<b>" not in body
    assert "321 ms" in body and "votes: 1 up, 0 down" in body and ">beam<" in body
    assert "sending" in body  # never sent
    # The persona its one reply read, above it, escaped like the persona now.
    assert body.count('class="persona-change"') == 1
    assert html.unescape(body).count(HOSTILE_PERSONA) == 2

    s1, s2, s3, _ = dash.seed.admin_sessions
    body = await page(dash.client, f"/conversations/{s3}")
    assert "given up" not in body and "after 2 attempt(s)" in body  # "buried", retried twice
    body = await page(dash.client, f"/conversations/{s2}")
    assert "given up" in body and "blocked by the user" in body  # "arr matey"
    body = await page(dash.client, f"/conversations/{s1}")
    assert body.count('class="delivery delivered"') == 3
    assert body.count('class="persona-change"') == 1  # set before the first reply, kept
    assert f'href="/conversations/{s2}"' in body  # the chat's other conversation
    r = await dash.client.get("/conversations/987654", allow_redirects=False)
    assert r.status == 404


async def test_variants_page_is_the_admin_variants_report(dash: Dash) -> None:
    await login(dash.client)
    body = await page(dash.client, "/variants")
    from bot.reports.variants import variant_report
    from bot.reports.variants_json import report_json

    engine = make_engine(dash.db_url)
    try:
        report = report_json(
            await variant_report(make_sessionmaker(engine), load_experiment(dash.settings))
        )
    finally:
        await engine.dispose()
    for v in report["variants"]:
        assert f'data-variant="{v["name"]}"' in body
        rate = "n/a" if v["up_rate"] is None else f"{100 * v['up_rate']:.1f}%"
        row = re.search(rf'<tr data-variant="{v["name"]}">(.*?)</tr>', body, re.S)
        assert row is not None and rate in row.group(1), (v["name"], rate)
    assert 'id="chart-variants"' in body
    assert body.count('class="rate"') == sum(1 for v in report["variants"] if v["votes"])
    assert "nucleus vs beam" in body and "Sample ratio" in body
    # Each comparison with the same verdict as the text report: always valid beside fixed horizon.
    from bot.reports.variants import Comparison
    from bot.reports.variants_text import verdict

    for c in report["comparisons"]:
        item = re.search(rf'<li data-variant="{c["variant"]}">(.*?)</li>', body, re.S)
        assert item is not None
        if c["lift"] is None:
            continue
        fields = {k: (math.nan if v is None else v) for k, v in c.items()}
        words = verdict(Comparison(**fields))
        assert words in item.group(1), (words, item.group(1))
        if min(c["control_chats"], c["variant_chats"]) < 5:
            assert "n/a (too few)" in item.group(1)
        else:
            assert "always valid (read any time)" in item.group(1)
            assert "fixed horizon (read once)" in item.group(1)


async def test_variants_page_shows_the_guards_and_the_autopilots_decisions(dash: Dash) -> None:
    from bot.db import autopilot as autopilot_rows
    from bot.reports.variants import variant_report
    from bot.reports.variants_json import report_json

    experiment = load_experiment(dash.settings)
    engine = make_engine(dash.db_url)
    try:
        sessionmaker = make_sessionmaker(engine)
        async with sessionmaker.begin() as db:
            await autopilot_rows.record(
                db,
                experiment=experiment.name,
                based_on=3,
                variant="nucleus",
                control="beam",
                action="rollback",
                reason="guard breached: <distinct> 10.0% < 0.9 x the control's",
                figures={},
                decided_by="replica-7",
            )
        report = report_json(await variant_report(sessionmaker, experiment))
    finally:
        await engine.dispose()
    await login(dash.client)
    body = await page(dash.client, "/variants")
    for v in report["variants"]:
        row = re.search(rf'<tr data-guard="{v["name"]}">(.*?)</tr>', body, re.S)
        assert row is not None, v["name"]
        share = v["distinct_share"]
        assert ("n/a" if share is None else f"{100 * share:.1f}%") in row.group(1)
    assert "Off (<code>python -m bot admin variants autopilot on</code>" in body
    decision = re.search(r'<li data-decision="\d+">(.*?)</li>', body, re.S)
    assert decision is not None
    assert "<strong>rollback</strong> nucleus (control beam, version 3, by replica-7)" in (
        decision.group(1)
    )
    assert "&lt;distinct&gt;" in decision.group(1)  # escaped


async def test_health_page_shows_replicas_workers_and_leases(dash: Dash) -> None:
    await login(dash.client)
    body = await page(dash.client, "/health")
    alive = re.search(r'<tr data-owner="hostA:11:aa" class="(\w+)">(.*?)</tr>', body, re.S)
    dead = re.search(r'<tr data-owner="hostB:22:bb" class="(\w+)">(.*?)</tr>', body, re.S)
    assert alive is not None and alive.group(1) == "alive" and "ready" in alive.group(2)
    assert dead is not None and dead.group(1) == "dead" and "not ready" in dead.group(2)
    assert "model worker nucleus is restarting" in body
    assert re.search(r"<td>beam</td>.*?<td class=\"n\">2</td>", body, re.S)  # restarts
    leases = re.search(r'<table class="list" id="leases">(.*?)</table>', body, re.S)
    assert leases is not None
    rows = re.findall(
        r"<tr><td>([^<]+)</td><td>(\w+)</td><td class=\"n\">(\d+)</td><td class=\"n\">(\d+)</td>",
        leases.group(1),
    )
    assert sorted(rows) == [
        ("hostA:11:aa", "inbox", "1", "0"),
        ("hostA:11:aa", "outbox", "1", "0"),
        ("hostB:22:bb", "inbox", "0", "1"),
    ]


async def test_audit_page_shows_the_admin_changes_newest_first_and_escaped(dash: Dash) -> None:
    from bot.db import audit
    from bot.db.models import AuditSource

    await login(dash.client)
    assert 'id="no-audit"' in await page(dash.client, "/audit")
    # A real admin change, then a row with markup in every free-text field.
    assert (await run(dash.db_url, "forget", "999", "--yes"))[0] == 0
    engine = make_engine(dash.db_url)
    try:
        async with make_sessionmaker(engine).begin() as db:
            await audit.record(
                db,
                actor="<b>mallory</b>",
                source=AuditSource.TELEGRAM,
                action="variants weight",
                target="<script>x</script>",
                details={"note": "<i>w</i>"},
                result="error: <img src=x onerror=alert(1)>",
            )
    finally:
        await engine.dispose()
    body = await page(dash.client, "/audit")
    rows = re.findall(r'<tr data-audit="(\d+)" class="(\w+)">(.*?)</tr>', body, re.S)
    assert [(cls, "forget" in cells) for _, cls, cells in rows] == [
        ("failed", False),
        ("ok", True),
    ]
    assert int(rows[0][0]) > int(rows[1][0])
    assert f"<td>{html.escape(audit.os_actor())}</td>" in rows[1][2] and "yes=True" in rows[1][2]
    hostile = rows[0][2]
    for raw in ("<b>mallory</b>", "<script>x</script>", "<i>w</i>", "<img src=x"):
        assert raw not in body
        assert html.escape(raw, quote=False) in hostile or html.escape(raw) in hostile, raw


async def test_the_dashboard_writes_nothing(dash: Dash) -> None:
    store = ConversationStore(make_sessionmaker(make_engine(dash.db_url)))
    before = await snapshot(store)
    await login(dash.client)
    paths = ["/", "/?days=90", "/conversations", "/conversations?persona=a&on=2026-01-10"]
    paths += [f"/conversations/{dash.seed.hostile_session}", "/variants", "/health", "/audit"]
    for path in paths:
        await page(dash.client, path)
    await dash.client.post("/logout")
    assert await snapshot(store) == before
    await store.sessionmaker.kw["bind"].dispose()

    # and its connection could not have: the database refuses a write on it
    engine = readonly_engine(admin_sql_url(dash.settings))
    try:
        async with engine.connect() as conn:
            with pytest.raises(Exception, match=r"read-only|not authorized|readonly"):
                await conn.execute(text("DELETE FROM messages"))
    finally:
        await engine.dispose()


@pytest.mark.postgres
def test_postgres_refuses_a_role_that_can_write(tmp_path: Path) -> None:
    db_url = create_pg_database()
    settings = dashboard_settings(tmp_path, db_url, db_url)  # the tests' superuser

    async def check() -> None:
        with pytest.raises(ConfigError, match=r"read-only PostgreSQL role.*superuser"):
            await start_dashboard(settings, listen="127.0.0.1", port=settings.dashboard_port or 0)
        engine = readonly_engine(db_url)
        try:
            with pytest.raises(SqlRefused):
                async with engine.connect():
                    pass
        finally:
            await engine.dispose()

    try:
        migrate.upgrade(db_url)
        asyncio.run(check())
    finally:
        drop_pg_database(db_url)


# --- settings and the command line -------------------------------------------------------------


def test_settings_decide_whether_there_is_a_dashboard(tmp_path: Path) -> None:
    bare = Settings(_env_file=None, data_dir=tmp_path)  # type: ignore[call-arg]
    assert check_settings(bare, listen="127.0.0.1", required=False) is False
    assert check_settings(bare, listen="::1", required=False) is False
    with pytest.raises(ConfigError, match="without DASHBOARD_PASSWORD"):
        check_settings(bare, listen="0.0.0.0", required=False)
    with pytest.raises(ConfigError, match="needs DASHBOARD_PASSWORD"):
        check_settings(bare, listen="127.0.0.1", required=True)
    secured = Settings(_env_file=None, data_dir=tmp_path, dashboard_password="x" * 12)  # type: ignore[call-arg]
    assert check_settings(secured, listen="0.0.0.0", required=True) is True
    for short in ("Xq", "eleven-char", "   padd3d   "):
        with pytest.raises(ConfigError, match="DASHBOARD_PASSWORD must have at least 12") as err:
            Settings(_env_file=None, dashboard_password=short)  # type: ignore[call-arg]
        assert short not in str(err.value)


def _cli(tmp_path: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        *argv, cwd=tmp_path, env=cli_env(tmp_path, strip=("DASHBOARD_", "TELEGRAM_"), **env)
    )


def test_a_public_address_without_a_password_is_refused_at_start(tmp_path: Path) -> None:
    proc = _cli(
        tmp_path,
        {"TELEGRAM_BOT_TOKEN": "123:abc", "DASHBOARD_PORT": "8099", "DASHBOARD_LISTEN": "0.0.0.0"},
        "run",
    )
    assert proc.returncode == 2, proc.stderr
    assert "refusing to serve the dashboard on 0.0.0.0 without DASHBOARD_PASSWORD" in proc.stderr
    proc = _cli(tmp_path, {}, "dashboard")
    assert proc.returncode == 2 and "needs DASHBOARD_PASSWORD" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_short_dashboard_password_is_refused_at_start(tmp_path: Path) -> None:
    """Regression: DASHBOARD_PASSWORD=a was accepted, on 0.0.0.0 too."""
    for argv, env in (
        (["dashboard"], {}),
        (["run"], {"TELEGRAM_BOT_TOKEN": "123:abc", "DASHBOARD_PORT": "8099"}),
    ):
        proc = _cli(
            tmp_path, {**env, "DASHBOARD_PASSWORD": "a", "DASHBOARD_LISTEN": "0.0.0.0"}, *argv
        )
        assert proc.returncode == 2, proc.stderr
        assert "DASHBOARD_PASSWORD must have at least 12 characters" in proc.stderr
        assert "Traceback" not in proc.stderr


async def test_daily_series_counts_and_ranks_per_utc_day(dash: Dash) -> None:
    from datetime import timedelta

    from sqlalchemy import func, select

    from bot.db.models import Message
    from bot.reports.dashboard import daily_series, first_day, nearest_rank

    now = datetime.now(UTC)
    engine = readonly_engine(admin_sql_url(dash.settings))
    try:
        async with make_sessionmaker(engine)() as db:
            points = await daily_series(db, first=first_day(now, 14), days=14)
            # the overview's split: 13 completed days (cached) and today, counted alike
            split = [
                *await daily_series(db, first=first_day(now, 14), days=13),
                *await daily_series(db, first=now.date(), days=1),
            ]
            assert split == points
            stamps = list(await db.scalars(select(Message.created_at)))
            assert await db.scalar(select(func.count()).select_from(Message)) == len(stamps)
    finally:
        await engine.dispose()
    assert [p.day for p in points] == [(now - timedelta(days=13 - i)).date() for i in range(14)]
    for p in points:
        assert p.messages == sum(1 for t in stamps if t.astimezone(UTC).date() == p.day)
    by_day = {p.day: p for p in points}
    today = now.date()
    # seeded replies: 100, 200, 300 ms three days ago; 1000 two days ago; today 400, 500, 600
    # and the hostile chat's 321 (nearest rank, as bot.reports.stats: p50 = 2nd of 4, p95 = 4th)
    assert (by_day[today].latency_samples, by_day[today].latency_p50_ms) == (4, 400.0)
    assert by_day[today].latency_p95_ms == 600.0
    three = by_day[today - timedelta(days=3)]
    assert (three.latency_samples, three.latency_p50_ms, three.latency_p95_ms) == (3, 200, 300)
    assert by_day[today - timedelta(days=2)].latency_p50_ms == 1000.0
    assert by_day[today - timedelta(days=5)].latency_p50_ms is None
    # above a second the buckets are 10 ms wide
    assert nearest_rank([(1230.0, 1), (990.0, 3)], 50) == 990.0
    assert nearest_rank([], 50) is None


async def test_each_read_only_layer_of_the_sqlite_engine_holds_alone(sqlite_url: str) -> None:
    engine = readonly_engine(sqlite_url)
    try:
        async with engine.connect() as conn:
            # the authorizer: what mode=ro lets through is refused before it runs
            with pytest.raises(Exception, match="not authorized"):
                await conn.execute(text("SELECT fts3_tokenizer('simple')"))
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            sqlite_conn = raw.driver_connection._conn  # the sqlite3 connection under aiosqlite
            await raw.driver_connection._execute(sqlite_conn.set_authorizer, None)
            # mode=ro alone: the file itself refuses the write
            with pytest.raises(Exception, match="readonly database"):
                await conn.execute(text("DELETE FROM messages"))
            await conn.invalidate()  # never hand this connection out again
    finally:
        await engine.dispose()


async def test_a_missing_database_is_a_503_page_that_says_why(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'nowhere.sqlite3'}"
    settings = dashboard_settings(tmp_path, url, url)
    app = build_app(
        settings,
        url=url,
        password=PASSWORD,
        experiment=load_experiment(settings),
        listen=settings.dashboard_listen,
    )
    async with TestClient(TestServer(app)) as client:
        await login(client)
        for path in ("/", "/conversations", "/variants", "/health", "/audit"):
            r = await client.get(path, allow_redirects=False)
            body = await r.text()
            assert r.status == 503 and "no database at" in body, (path, r.status)
            assert "Traceback" not in body
    assert not (tmp_path / "nowhere.sqlite3").exists()  # reading never creates it
