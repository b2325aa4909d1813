"""python-telegram-bot's HTTP client for the Bot API, on aiohttp (bot/tg/aiohttp_request.py),
reading its answers with a depth bound (a getUpdates answer nested too deeply for json.loads
must not stop polling for good) and counting its requests by method."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from telegram.error import TelegramError
from telegram.request import RequestData

from bot.tg.aiohttp_request import AiohttpRequest

# Telegram's updates nest a dozen levels at most; anything deeper becomes null (see loads_json).
MAX_JSON_DEPTH = 64
_METHOD = re.compile(r"[A-Za-z]{1,40}")
_JSON_TOKEN = re.compile(r'"(?:[^"\\]+|\\.)*"?|[\[{]|[\]}]|[^"\[\]{}]+')


def loads_json(text: str | bytes) -> Any:
    """json.loads, with arrays and objects nested deeper than MAX_JSON_DEPTH read as null.

    Plain json.loads raises RecursionError at about 1,000 levels, and data a few levels short
    of that breaks whatever walks it next (to_dict, json.dumps); no Telegram update comes close.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return json.loads(_bound_depth(text, MAX_JSON_DEPTH))


def _bound_depth(text: str, limit: int) -> str:
    """The JSON text with every container below depth `limit` replaced by null."""
    if text.count("[") + text.count("{") <= limit:
        return text  # cannot nest deeper (the usual case: no scan at all)
    out: list[str] = []
    depth = 0
    skipping = 0  # depth at which the container being dropped started; 0: not dropping
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > limit and not skipping:
                skipping = depth
                out.append("null")
            elif not skipping:
                out.append(token)
        elif token in ("]", "}"):
            if not skipping:
                out.append(token)
            elif depth == skipping:
                skipping = 0
            depth -= 1
        elif not skipping:
            out.append(token)
    return "".join(out)


class BoundedJsonRequest(AiohttpRequest):
    """python-telegram-bot's HTTP client (on aiohttp), reading Bot API answers with loads_json.

    A getUpdates answer too deeply nested for json.loads would otherwise raise RecursionError
    on every poll, and no update behind it could ever be fetched. `observe(method, result)`
    hears of every request (bot.service.metrics: ok, 429, error), PTB's own 429 retries included.
    """

    def __init__(
        self, *args: Any, observe: Callable[[str, str], None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.observe = observe

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[int, bytes]:
        """The HTTP request, counted by Bot API method (never by URL: it holds the token)."""
        try:
            code, payload = await super().do_request(url, method, request_data, *args, **kwargs)
        except Exception:
            self._count(url, "error")  # a timeout or a connection error
            raise
        self._count(url, "ok" if 200 <= code < 300 else "429" if code == 429 else "error")
        return code, payload

    def _count(self, url: str, result: str) -> None:
        if self.observe is not None:
            name = url.rsplit("/", 1)[-1].split("?", 1)[0]
            self.observe(name if _METHOD.fullmatch(name) else "other", result)

    @staticmethod
    def parse_json_payload(payload: bytes) -> dict[str, Any]:
        try:
            return loads_json(payload.decode("utf-8", "replace"))  # type: ignore[no-any-return]
        except ValueError as err:
            raise TelegramError("Invalid server response") from err
