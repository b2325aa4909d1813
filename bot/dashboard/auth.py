"""The dashboard's access control: one password, signed login cookies, a login rate limit.

- The password is compared as SHA-256 digests with hmac.compare_digest: constant time, and
  the same length whatever was typed. It is never stored beyond the settings, never logged.
- A login makes a random login id, kept in this process (with its expiry) and sent as a
  cookie signed by itsdangerous with a key derived from the password and a random secret made
  at start. Logout removes the id, so a copied cookie dies with the logout (a signed cookie
  alone would stay valid until it expires); a restart or a new password ends every login.
  The price: logins are per process, so several dashboard processes behind one address
  would each ask for a login (the dashboard listens on loopback by default).
- The cookie is HttpOnly and SameSite=Strict (and Secure over HTTPS): a cross-site page can
  neither read it nor make the browser send it, so a forged cross-site POST to /logout or
  /login arrives without a login. POSTs whose Origin header names another site are refused
  as well.
- Failed logins are limited for all clients together (LoginLimiter): a client's address
  tells nothing behind `ssh -L` or a proxy, and X-Forwarded-For is anyone's to set.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer

COOKIE = "dashboard_session"  # the cookie's name on the wire, kept so logins survive upgrades
LOGIN_MAX_AGE_S = 12 * 3600
LOGIN_FREE_FAILURES = 5
LOGIN_WINDOW_S = 300.0
LOGIN_DELAY_S = 1.0


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class Password:
    """The dashboard password, compared by digest."""

    def __init__(self, password: str) -> None:
        if not password:
            raise ValueError("empty dashboard password")
        self._digest = _digest(password)

    def matches(self, given: str) -> bool:
        """Whether `given` is the password (constant time)."""
        return hmac.compare_digest(_digest(given), self._digest)

    @property
    def key_material(self) -> bytes:
        """What the cookie key is derived from (the digest, not the password)."""
        return self._digest


class Logins:
    """Live logins of this process: signed cookie values for random ids."""

    def __init__(self, password: Password, *, max_age_s: float = LOGIN_MAX_AGE_S) -> None:
        secret = secrets.token_bytes(32)
        key = hmac.new(secret, password.key_material, hashlib.sha256).digest()
        self._signer = URLSafeTimedSerializer(key, salt="bot-dashboard-session")
        self._expiry: dict[str, float] = {}
        self.max_age_s = max_age_s

    def create(self) -> str:
        """A new login; returns the cookie value."""
        self._prune()
        sid = secrets.token_urlsafe(24)
        self._expiry[sid] = time.monotonic() + self.max_age_s
        return self._signer.dumps(sid)

    def _sid(self, cookie: str | None) -> str | None:
        if not cookie:
            return None
        try:
            sid = self._signer.loads(cookie, max_age=int(self.max_age_s))
        except BadSignature:  # also SignatureExpired
            return None
        return sid if isinstance(sid, str) else None

    def valid(self, cookie: str | None) -> bool:
        """Whether the cookie is a live login of this process."""
        sid = self._sid(cookie)
        expiry = self._expiry.get(sid) if sid is not None else None
        return expiry is not None and expiry > time.monotonic()

    def revoke(self, cookie: str | None) -> None:
        """End the login of this cookie (logout)."""
        sid = self._sid(cookie)
        if sid is not None:
            self._expiry.pop(sid, None)

    def _prune(self) -> None:
        now = time.monotonic()
        for sid in [s for s, t in self._expiry.items() if t <= now]:
            del self._expiry[sid]


@dataclass(frozen=True, slots=True)
class Throttled:
    """A refused login attempt: try again after this many seconds."""

    retry_after_s: int


class LoginLimiter:
    """Failed logins, from every address together: while the latest `free_failures` of them
    fall within `window_s`, one attempt per `delay_s` (counted from the last failure).

    Not per address: behind `ssh -L` or a TLS proxy every client is 127.0.0.1, so locking an
    address out would lock the operator out with the guesser, and from this machine any of
    127.0.0.0/8 will do as a new address. So guessing gets about one try a second, from
    wherever it comes, and the right password waits at most `delay_s` after a wrong one.
    The app checks and counts with no await in between: concurrent posts cannot slip past.
    """

    def __init__(
        self,
        *,
        free_failures: int = LOGIN_FREE_FAILURES,
        window_s: float = LOGIN_WINDOW_S,
        delay_s: float = LOGIN_DELAY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free_failures = free_failures
        self.window_s = window_s
        self.delay_s = delay_s
        self._clock = clock
        self._failures: deque[float] = deque(maxlen=free_failures)  # the latest ones

    def check(self) -> Throttled | None:
        """None if a login may be tried now, else how long to wait."""
        now = self._clock()
        failures = self._failures
        if len(failures) < self.free_failures or failures[0] <= now - self.window_s:
            return None
        wait_s = failures[-1] + self.delay_s - now
        return Throttled(math.ceil(wait_s)) if wait_s > 0 else None

    def failed(self) -> None:
        """Count a failed login."""
        self._failures.append(self._clock())


def is_loopback(host: str) -> bool:
    """Whether `host` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a host name or 0.0.0.0: reachable from elsewhere
