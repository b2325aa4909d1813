"""The dashboard's aiohttp application: routes, the login, and the pages.

Every page is a GET that reads through the read-only engine (bot.admin.sql.readonly_engine,
docs/guarantees.md, invariant 9) and renders one Jinja2 template with autoescaping on; charts
are inline SVG drawn on the server (bot.dashboard.charts). Only /login and /static/ answer without a
login; everything else redirects to the login page.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from aiohttp import web
from jinja2 import Environment, PackageLoader, StrictUndefined
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bot.admin.sql import SqlRefused, readonly_engine
from bot.config import Settings
from bot.dashboard import charts
from bot.dashboard.auth import COOKIE, LoginLimiter, Logins, Password, is_loopback
from bot.db import audit
from bot.db.engine import make_sessionmaker, safe_url
from bot.db.models import utcnow
from bot.engine.variants import Experiment
from bot.reports import dashboard as queries
from bot.reports.admin import AdminError
from bot.reports.stats import stats

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
DEFAULT_DAYS = 14
VARIANTS_TTL_S = 30.0
PAST_DAYS_TTL_S = 300.0
MAX_DAYS = 90
# What a chat or session id can be (BIGINT on PostgreSQL, INTEGER on SQLite): a larger number
# would be the driver's OverflowError, a 500.
BIGINT = range(-(2**63), 2**63)
PUBLIC_PATHS = ("/login",)
# No script runs on any page, whatever a message contains: there is none of ours, and the
# policy forbids any other. Styles only from our own stylesheet.
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)


@dataclass
class Dashboard:
    """What the handlers share; one per application."""

    url: str
    engine: AsyncEngine | None
    sessionmaker: async_sessionmaker[AsyncSession] | None
    hosts: frozenset[str]  # the Host names it answers to, besides loopback's
    password: Password
    logins: Logins
    limiter: LoginLimiter
    templates: Environment
    experiment: Experiment
    retention_days: int | None
    alive_s: float = queries.REPLICA_ALIVE_S  # TAKEOVER_AFTER_S
    page_size: int = queries.PAGE_SIZE
    variants: TtlCache = field(default_factory=lambda: TtlCache(VARIANTS_TTL_S))
    past_days: TtlCache = field(default_factory=lambda: TtlCache(PAST_DAYS_TTL_S))


DASHBOARD = web.AppKey("dashboard", Dashboard)


class TtlCache:
    """Values computed at most once per `ttl_s` per key, and one computation at a time.

    For what moves slowly and costs a scan: the variants report (`admin variants` reads every
    timed reply of the experiment for its percentiles: 100,000 rows take about 250 ms) and the
    overview's completed days (they change only when /forget or retention deletes messages).
    0 computes every time.
    """

    def __init__(self, ttl_s: float, max_keys: int = 16) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._values: dict[Any, tuple[float, datetime, Any]] = {}
        self._lock = asyncio.Lock()

    async def get(self, key: Any, compute: Callable[[], Awaitable[Any]]) -> tuple[Any, datetime]:
        """The value for `key` and when it was computed: cached, or computed now."""
        async with self._lock:  # concurrent reloads wait for one computation
            found = self._values.get(key)
            if found is not None and time.monotonic() - found[0] < self.ttl_s:
                return found[2], found[1]
            value = await compute()
            if len(self._values) >= self.max_keys:
                self._values.clear()
            self._values[key] = (time.monotonic(), utcnow(), value)
            return value, self._values[key][1]


# --- formatting for the templates ----------------------------------------------------------------


def _when(value: datetime | None) -> str:
    if value is None:
        return ""
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S}"


def _ms(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.0f} ms"


def _pct(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.{digits}f}%"


def _num(value: float | None, spec: str = ",") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, spec)


def _raw(value: Any) -> str:
    """A figure as `admin stats --json` has it, for data-value attributes (tests read them)."""
    return "" if value is None else str(value)


def make_templates() -> Environment:
    """The Jinja2 environment: autoescaping for every template (HTML and inline SVG)."""
    env = Environment(
        loader=PackageLoader("bot.dashboard", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=_when, ms=_ms, pct=_pct, num=_num, raw=_raw)
    return env


def _render(request: web.Request, name: str, status: int = 200, **context: Any) -> web.Response:
    dash = request.app[DASHBOARD]
    html = dash.templates.get_template(name).render(
        path=request.path, logged_in=context.pop("logged_in", True), **context
    )
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")


# --- middlewares -------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _harden(response: web.StreamResponse, path: str) -> None:
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    # same-origin, not no-referrer: with no-referrer a browser sends `Origin: null` on our own
    # form posts, and the Origin check below could no longer tell them from forged ones.
    response.headers["Referrer-Policy"] = "same-origin"
    if not path.startswith("/static/"):
        response.headers["Cache-Control"] = "no-store"


async def _security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """CSP, no framing, no sniffing, no caching: on every answer, redirects and errors too."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        _harden(exc, request.path)
        raise
    _harden(response, request.path)
    return response


def _known_host(request: web.Request) -> bool:
    try:
        name = urlsplit("//" + request.headers.get("Host", "")).hostname
    except ValueError:  # "[::1" and the like
        return False
    return name is not None and (is_loopback(name) or name in request.app[DASHBOARD].hosts)


async def _allowed_hosts(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Only the dashboard's own Host names: DNS rebinding (evil.example made to resolve to
    this address) makes another site's page same-origin, Origin header and all."""
    if not _known_host(request):
        raise web.HTTPMisdirectedRequest(
            text="not a host name of this dashboard (DASHBOARD_ALLOWED_HOSTS)"
        )
    return await handler(request)


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:
        # Browsers send Origin with every POST; a client without one is not a browser tricked
        # by another site (and still needs the password or a login cookie).
        return True
    return bool(urlsplit(origin).netloc == request.host)


async def _require_login(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every path but the login page and the stylesheet needs a live login."""
    if request.method == "POST" and not _same_origin(request):
        raise web.HTTPForbidden(text="cross-site request refused")
    if request.path in PUBLIC_PATHS or request.path.startswith("/static/"):
        return await handler(request)
    dash = request.app[DASHBOARD]
    if not dash.logins.valid(request.cookies.get(COOKIE)):
        target = request.path_qs if request.method == "GET" else "/"
        raise web.HTTPSeeOther("/login?" + urlencode({"next": target}))
    return await handler(request)


async def _database_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A database that cannot be read is a 503 page that says why, not a traceback."""
    try:
        return await handler(request)
    except (SqlRefused, AdminError) as err:
        return _render(request, "error.html", status=503, message=str(err))
    except (OperationalError, DBAPIError, OSError) as err:
        dash = request.app[DASHBOARD]
        log.warning("dashboard: database %s: %s", safe_url(dash.url), err)
        text = str(err.orig) if isinstance(err, DBAPIError) and err.orig is not None else str(err)
        return _render(
            request,
            "error.html",
            status=503,
            message=f"cannot read the database {safe_url(dash.url)}: {text}",
        )


# aiohttp's own decorator, applied here: aiohttp is untyped for mypy (follow_imports = skip).
security_headers = web.middleware(_security_headers)
allowed_hosts = web.middleware(_allowed_hosts)
require_login = web.middleware(_require_login)
database_errors = web.middleware(_database_errors)


# --- login / logout ------------------------------------------------------------------------------


def _next(value: str | None) -> str:
    # Only a path of this site: never an absolute or protocol-relative URL (open redirect).
    # Whitespace and control characters are refused too: "/\t/evil" would be normalised to
    # "//evil" on its way into the Location header.
    if (
        value
        and value.startswith("/")
        and not value.startswith("//")
        and "\\" not in value
        and all(c.isprintable() and not c.isspace() for c in value)
    ):
        return value
    return "/"


async def login_page(request: web.Request) -> web.StreamResponse:
    """The login form (already logged in: straight on)."""
    dash = request.app[DASHBOARD]
    target = _next(request.query.get("next"))
    if dash.logins.valid(request.cookies.get(COOKIE)):
        raise web.HTTPSeeOther(target)
    return _render(request, "login.html", logged_in=False, next=target, error=None)


async def login(request: web.Request) -> web.StreamResponse:
    """Check the password (failed logins slow down the next ones: LoginLimiter) and start a
    login."""
    dash = request.app[DASHBOARD]
    address = request.remote or "unknown"
    form = await request.post()
    target = _next(str(form.get("next", "/")))
    throttled = dash.limiter.check()
    if throttled is not None:
        response = _render(
            request,
            "login.html",
            status=429,
            logged_in=False,
            next=target,
            error=f"Too many failed logins. Try again in {throttled.retry_after_s} s.",
        )
        response.headers["Retry-After"] = str(throttled.retry_after_s)
        return response
    if not dash.password.matches(str(form.get("password", ""))):
        dash.limiter.failed()
        log.warning("dashboard: failed login from %s", address)
        return _render(
            request, "login.html", status=401, logged_in=False, next=target, error="Wrong password."
        )
    response = web.HTTPSeeOther(target)
    response.set_cookie(
        COOKIE,
        dash.logins.create(),
        max_age=int(dash.logins.max_age_s),
        path="/",
        httponly=True,
        samesite="Strict",
        secure=request.secure,
    )
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    """End the login (POST only, from the dashboard's own form)."""
    dash = request.app[DASHBOARD]
    dash.logins.revoke(request.cookies.get(COOKIE))
    response = web.HTTPSeeOther("/login")
    response.del_cookie(COOKIE, path="/")
    raise response


# --- pages ---------------------------------------------------------------------------------------


def _sessionmaker(request: web.Request) -> async_sessionmaker[AsyncSession]:
    dash: Dashboard = request.app[DASHBOARD]
    if dash.sessionmaker is None:
        raise AdminError("the dashboard's database engine is not open")
    return dash.sessionmaker


def _days(request: web.Request) -> int:
    try:
        days = int(request.query.get("days", DEFAULT_DAYS))
    except ValueError:
        return DEFAULT_DAYS
    return min(MAX_DAYS, max(1, days))


async def overview(request: web.Request) -> web.StreamResponse:
    """Chats, sessions, messages, latency, queues, cache and safety at a glance, two charts."""
    dash: Dashboard = request.app[DASHBOARD]
    sm = _sessionmaker(request)
    now = utcnow()
    days = _days(request)

    first = queries.first_day(now, days)
    today = now.astimezone(UTC).date()

    async def past_days() -> list[queries.DayPoint]:
        async with sm() as db:
            return await queries.daily_series(db, first=first, days=days - 1)

    async def daily() -> list[queries.DayPoint]:
        # Completed days from the cache (see TtlCache), today's counted now.
        past, _ = await dash.past_days.get((first, today), past_days)
        async with sm() as db:
            return [*past, *await queries.daily_series(db, first=today, days=1)]

    async def queues_and_replicas() -> tuple[int, queries.HealthPage]:
        async with sm() as db:
            depth = await queries.outbox_depth(db)
            return depth, await queries.health(db, now=now, alive_s=dash.alive_s)

    # Three connections at once (readers do not block each other): the page takes as long as
    # its slowest part, not their sum.
    figures, series, (depth, health) = await asyncio.gather(
        stats(sm, now=now, retention_days=dash.retention_days),
        daily(),
        queues_and_replicas(),
    )
    return _render(
        request,
        "overview.html",
        stats=figures,
        days=days,
        outbox_depth=depth,
        health=health,
        past_days_ttl_s=dash.past_days.ttl_s,
        messages_chart=charts.messages_chart(series),
        latency_chart=charts.latency_chart(series),
    )


def _page_link(link: str) -> tuple[datetime, int]:
    """A page link's (updated_at in UTC, session id); ValueError if the query could not use it."""
    at, _, sid = link.rpartition("|")
    stamp, session_id = datetime.fromisoformat(at), int(sid)
    if session_id not in BIGINT:
        raise ValueError("session id out of range")
    try:
        # to UTC here: a stamp that has no UTC time (9999-12-31T23:00-05:00) fails now, not in
        # the driver
        return stamp.replace(tzinfo=stamp.tzinfo or UTC).astimezone(UTC), session_id
    except OverflowError as err:
        raise ValueError("timestamp out of range") from err


def _filter(request: web.Request) -> tuple[queries.ConversationFilter, list[str], str | None]:
    """The search form's filter, the fields it could not read, and a notice."""
    q = request.query
    errors: list[str] = []
    notice = None
    chat_id: int | None = None
    on: date | None = None
    before: tuple[datetime, int] | None = None
    if q.get("chat_id", "").strip():
        try:
            chat_id = int(q["chat_id"].strip())
        except ValueError:
            errors.append("The chat id must be a whole number.")
        else:
            if chat_id not in BIGINT:
                errors.append("The chat id is out of range.")
    if q.get("on", "").strip():
        try:
            on = date.fromisoformat(q["on"].strip())
        except ValueError:
            errors.append("The date must be YYYY-MM-DD.")
        else:
            if on == date.max:  # the search runs to the next day's midnight
                errors.append("The date is out of range.")
    if q.get("before"):
        try:
            before = _page_link(q["before"])
        except ValueError:
            notice = "That page link is broken; this is the first page."
    persona = q.get("persona", "").strip()[:200]
    return queries.ConversationFilter(chat_id, persona, on, before), errors, notice


async def conversation_list(request: web.Request) -> web.StreamResponse:
    """Conversations, most recently active first, searchable, PAGE_SIZE a page."""
    where, errors, notice = _filter(request)
    page = queries.ConversationPage([], None)
    if not errors:
        async with _sessionmaker(request)() as db:
            page = await queries.conversations(db, where, limit=request.app[DASHBOARD].page_size)
    search = {
        k: v
        for k, v in (
            ("chat_id", "" if where.chat_id is None else str(where.chat_id)),
            ("persona", where.persona),
            ("on", "" if where.on is None else where.on.isoformat()),
        )
        if v
    }
    next_url = None
    if page.next_before is not None:
        at, sid = page.next_before
        next_url = "/conversations?" + urlencode({**search, "before": f"{at.isoformat()}|{sid}"})
    return _render(
        request,
        "conversations.html",
        status=400 if errors or notice else 200,
        page=page,
        search=search,
        errors=errors,
        notice=notice,
        next_url=next_url,
        first_url="/conversations?" + urlencode(search) if where.before else None,
    )


async def conversation(request: web.Request) -> web.StreamResponse:
    """One conversation's transcript."""
    session_id = int(request.match_info["session_id"])
    async with _sessionmaker(request)() as db:
        view = await queries.transcript(db, session_id)
    if view is None:
        return _render(request, "error.html", status=404, message=f"No conversation {session_id}.")
    return _render(request, "transcript.html", t=view)


async def variants(request: web.Request) -> web.StreamResponse:
    """`admin variants` in a page: the same report, with the interval chart."""
    # numpy and scipy load with the first variants page, as with `admin variants`
    from bot.reports import variants as variant_report
    from bot.reports.variant_stats import MIN_CHATS, SRM_ALPHA
    from bot.reports.variants_text import verdict

    dash: Dashboard = request.app[DASHBOARD]
    sm = _sessionmaker(request)

    async def compute() -> variant_report.VariantReport:
        from bot.config import get_settings
        from bot.engine import live

        # The variants as the replicas serve them now (the database), not the file's seed.
        experiment = await live.current(sm, dash.experiment, get_settings())
        return await variant_report.variant_report(sm, experiment)

    report, computed_at = await dash.variants.get(None, compute)
    return _render(
        request,
        "variants.html",
        report=report,
        computed_at=computed_at,
        ttl_s=dash.variants.ttl_s,
        by_name={f.name: f for f in report.variants},
        chart=charts.interval_chart(report),
        srm_alpha=SRM_ALPHA,
        verdicts={c.variant: verdict(c) for c in report.comparisons},
        min_chats=MIN_CHATS,
    )


async def health_page(request: web.Request) -> web.StreamResponse:
    """Replicas (readiness, workers and their restarts) and the leases each holds."""
    dash = request.app[DASHBOARD]
    async with _sessionmaker(request)() as db:
        health = await queries.health(db, now=utcnow(), alive_s=dash.alive_s)
    return _render(request, "health.html", health=health, alive_s=dash.alive_s)


AUDIT_ROWS = 200


async def audit_page(request: web.Request) -> web.StreamResponse:
    """The audit log (`admin audit`): the newest admin changes and autopilot decisions."""
    missing = None
    rows: list[audit.AuditRow] = []
    try:
        async with _sessionmaker(request)() as db:
            rows = await audit.recent(db, AUDIT_ROWS)
    except DBAPIError as err:
        text = str(err.orig) if err.orig is not None else str(err)
        if "audit_log" not in text:
            raise
        missing = "There is no audit log in this database yet: run `python -m bot db upgrade`."
    return _render(request, "audit.html", rows=rows, missing=missing, limit=AUDIT_ROWS)


# --- the application -----------------------------------------------------------------------------


async def _open(app: web.Application) -> None:
    dash = app[DASHBOARD]
    if dash.engine is None:
        dash.engine = readonly_engine(dash.url)
        dash.sessionmaker = make_sessionmaker(dash.engine)


async def _close(app: web.Application) -> None:
    dash = app[DASHBOARD]
    if dash.engine is not None:
        await dash.engine.dispose()
        dash.engine = None
        dash.sessionmaker = None


def build_app(
    settings: Settings, *, url: str, password: str, experiment: Experiment, listen: str
) -> web.Application:
    """The dashboard for the database at `url` (read-only; see bot.admin.sql.readonly_engine),
    served on the address `listen`."""
    pw = Password(password)
    app = web.Application(
        middlewares=[security_headers, allowed_hosts, require_login, database_errors],
        client_max_size=64 * 1024,
    )
    app[DASHBOARD] = Dashboard(
        url=url,
        engine=None,
        sessionmaker=None,
        hosts=frozenset([listen.strip().strip("[]").lower(), *settings.dashboard_allowed_hosts]),
        password=pw,
        logins=Logins(pw),
        limiter=LoginLimiter(),
        templates=make_templates(),
        experiment=experiment,
        retention_days=settings.retention_days,
        alive_s=settings.takeover_after_s,
    )
    app.on_startup.append(_open)
    app.on_cleanup.append(_close)
    app.router.add_get("/login", login_page)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_get("/", overview)
    app.router.add_get("/conversations", conversation_list)
    app.router.add_get(r"/conversations/{session_id:\d{1,18}}", conversation)
    app.router.add_get("/variants", variants)
    app.router.add_get("/health", health_page)
    app.router.add_get("/audit", audit_page)
    app.router.add_static("/static/", STATIC_DIR, append_version=False)
    return app
