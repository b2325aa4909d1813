"""python-telegram-bot's request interface (`telegram.request.BaseRequest`) on aiohttp.

PTB ships one implementation, on httpx (`HTTPXRequest`), whose stack (httpx, httpcore, anyio,
h11) took about 2 ms of the event loop a request at 50 users on a 2-core machine
(docs/benchmarks.md, "sixth pass"). aiohttp, already the service's web server, parses HTTP in C
and has no anyio layer: `python -m bench.http_client` measures both on the same requests. PTB keeps
everything above the transport: the parameters, the answer's parsing and its errors (429 as
RetryAfter, 403 as Forbidden, ...). Here: the connection pool, the timeouts and what a
transport failure raises (TimedOut, NetworkError), as HTTPXRequest does.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.connector import Connection
from aiohttp.helpers import get_env_proxy_for_url
from telegram._utils.defaultvalue import DefaultValue
from telegram._utils.types import ODVInput
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, RequestData
from yarl import URL

from bot.tasks import started

# HTTPXRequest's defaults (PTB 22): seconds.
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0
POOL_TIMEOUT_S = 1.0


class BodyWithHeaders(aiohttp.ClientRequest):  # type: ignore[misc]
    """aiohttp's request, its body written in the same step as its headers.

    aiohttp holds a request's headers back to send them with its body, which it writes in a
    task of its own: on Python 3.12 and later one started at once (`eager_start`), on 3.11 one
    that waits its turn in the event loop, a pass of the loop later, behind everything else
    ready on it. Here the body writer's first step is taken at once on every Python, as aiohttp
    does where it can; what is left of it (a body larger than the socket takes at once) goes
    on in the task."""

    def write_bytes(  # type: ignore[override]
        self,
        writer: AbstractStreamWriter,
        conn: Connection,
        content_length: int | None = None,
    ) -> Coroutine[Any, Any, None]:
        return started(super().write_bytes(writer, conn, content_length))


class AiohttpRequest(BaseRequest):
    """BaseRequest on an aiohttp ClientSession with `connection_pool_size` connections."""

    def __init__(
        self,
        connection_pool_size: int = 8,
        *,
        read_timeout: float | None = READ_TIMEOUT_S,
        write_timeout: float | None = WRITE_TIMEOUT_S,
        connect_timeout: float | None = CONNECT_TIMEOUT_S,
        pool_timeout: float | None = POOL_TIMEOUT_S,
    ) -> None:
        self.connection_pool_size = connection_pool_size
        self._read_timeout = read_timeout
        self._write_timeout = write_timeout
        self._connect_timeout = connect_timeout
        self._pool_timeout = pool_timeout
        self._session: aiohttp.ClientSession | None = None
        self._proxies: dict[str, tuple[URL | None, aiohttp.BasicAuth | None]] = {}

    def _proxy(self, url: str) -> tuple[URL | None, aiohttp.BasicAuth | None]:
        """The proxy for `url` from HTTPS_PROXY and friends (NO_PROXY respected), as httpx (PTB's
        default client) reads them, looked up once per origin. aiohttp's `trust_env` looks the
        proxy and ~/.netrc up again for every request, each in a thread: two hops to a thread
        and back through the event loop, which under load waited behind everything else ready
        on the loop (docs/benchmarks.md, "eighth pass")."""
        scheme, _, origin = url.split("/", 3)[:3]
        key = f"{scheme}//{origin}"
        found = self._proxies.get(key)
        if found is None:
            try:
                found = get_env_proxy_for_url(URL(url))
            except LookupError:  # none set, or NO_PROXY names the host
                found = (None, None)
            self._proxies[key] = found
        return found

    @property
    def read_timeout(self) -> float | None:
        """The default read timeout (seconds)."""
        return self._read_timeout

    async def initialize(self) -> None:
        """Open the session (on the running event loop)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.connection_pool_size),
                headers={"User-Agent": self.USER_AGENT},
                request_class=BodyWithHeaders,
                # The proxy is given with each request (`_proxy`), not looked up by aiohttp.
                trust_env=False,
            )

    async def shutdown(self) -> None:
        """Close the session and its connections."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        write_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        connect_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        pool_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        """One request: its status code and body (PTB reads the rest)."""
        if self._session is None or self._session.closed:
            raise RuntimeError("This AiohttpRequest is not initialized!")
        read = _given(read_timeout, self._read_timeout)
        write = _given(write_timeout, self._write_timeout)
        connect = _given(connect_timeout, self._connect_timeout)
        pool = _given(pool_timeout, self._pool_timeout)
        # aiohttp has no write timeout of its own: a request whose sending stalls ends at the
        # sum of all four (`total`), which no request that keeps moving reaches.
        parts = (connect, pool, write, read)
        timeout = aiohttp.ClientTimeout(
            total=None if None in parts else sum(p for p in parts if p is not None),
            connect=None if connect is None or pool is None else connect + pool,
            sock_connect=connect,
            sock_read=read,
        )
        data: aiohttp.FormData | dict[str, str] | None = None
        if request_data is not None:
            files = request_data.multipart_data
            if files:
                form = aiohttp.FormData()
                for name, value in request_data.json_parameters.items():
                    form.add_field(name, value)
                for name, (filename, content, mimetype) in files.items():
                    form.add_field(name, content, filename=filename, content_type=mimetype)
                data = form
            else:
                data = request_data.json_parameters
        proxy, proxy_auth = self._proxy(url)
        try:
            async with self._session.request(
                method,
                url,
                data=data,
                proxy=proxy,
                proxy_auth=proxy_auth,
                timeout=timeout,
                allow_redirects=False,  # as httpx
            ) as res:
                return res.status, await res.read()
        except TimeoutError as err:
            raise TimedOut from err
        except aiohttp.ClientError as err:
            raise NetworkError(f"aiohttp.{err.__class__.__name__}: {err}") from err


def _given(value: ODVInput[float], default: float | None) -> float | None:
    """A timeout as the caller gave it, or this client's default where PTB passed none."""
    return default if isinstance(value, DefaultValue) else value
