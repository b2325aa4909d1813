"""The event loop's time per Bot API request: PTB on httpx (its own) against PTB on aiohttp.

    python -m bench.http_client [--requests 400] [--rounds 3]

At 50 users the bot's event loop is what a burst of replies waits for, and drafts and sends
through PTB and httpx were a third of its time (docs/benchmarks.md, "sixth pass"). This sends
the same requests through one `telegram.Bot` with each request class (HTTPXRequest, what the
service used, and bot/tg/aiohttp_request.py's AiohttpRequest) to a loopback Bot API in a process
of its own (a minimal aiohttp server answering at once, so that only the client's work is on
this process's thread), and measures this thread's CPU time (time.thread_time) and the wall
time per request: `sendMessageDraft` (answered `true`) and `sendMessage` (answered with a
Message, which PTB parses), one at a time and 8 at a time, the two clients taking turns in each
round. RESULT lines: `http_{draft,send}_cpu_ms_{httpx,aiohttp}` (medians over the rounds, one
at a time) and `http_draft_cpu_ms_concurrent_{httpx,aiohttp}`.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from telegram import Bot
from telegram.request import BaseRequest, HTTPXRequest

from bench import common
from bot.tg.aiohttp_request import AiohttpRequest
from tests.support.botprocess import free_port

TOKEN = "123456:bench"

# The loopback Bot API: every method answers at once; sendMessage with a Message.
SERVER = r"""
import json, sys, time
from aiohttp import web

async def handle(request):
    method = request.match_info["method"]
    if method == "sendMessage":
        form = await request.post()
        result = {"message_id": 1, "date": int(time.time()), "text": form.get("text", ""),
                  "chat": {"id": int(form.get("chat_id", 1)), "type": "private",
                           "first_name": "U"}}
    else:
        await request.read()
        result = True
    return web.json_response({"ok": True, "result": result})

app = web.Application()
app.router.add_post("/bot{token}/{method}", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def _wait_for(port: int, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the loopback Bot API did not listen on {port}") from None
            time.sleep(0.05)


def _clients() -> dict[str, type[BaseRequest]]:
    return {"httpx": HTTPXRequest, "aiohttp": AiohttpRequest}


async def _measure(bot: Bot, method: str, n: int, concurrent: int) -> tuple[float, float]:
    """(CPU ms, wall ms) of this thread per request, `n` requests `concurrent` at a time."""

    async def one(i: int) -> None:
        if method == "draft":
            await bot.send_message_draft(5, 7, f"a draft of some words {i}")
        else:
            await bot.send_message(5, f"a reply of a few words, number {i}")

    cpu, wall = time.thread_time(), time.perf_counter()
    for first in range(0, n, concurrent):
        await asyncio.gather(*(one(i) for i in range(first, min(n, first + concurrent))))
    return (time.thread_time() - cpu) * 1000 / n, (time.perf_counter() - wall) * 1000 / n


async def run(args: argparse.Namespace, port: int) -> dict[str, Any]:
    bots: dict[str, Bot] = {}
    for name, cls in _clients().items():
        bot = Bot(TOKEN, base_url=f"http://127.0.0.1:{port}/bot", request=cls(8))
        await bot.request.initialize()  # (no getMe: the server answers every method)
        bots[name] = bot
        await _measure(bot, "draft", 50, 1)  # connections open, caches warm
    cases = [("draft", 1), ("send", 1), ("draft", 8)]
    figures: dict[str, list[tuple[float, float]]] = {}
    try:
        for _ in range(args.rounds):
            for method, concurrent in cases:
                for name, bot in bots.items():
                    key = f"{method} x{concurrent} {name}"
                    measured = await _measure(bot, method, args.requests, concurrent)
                    figures.setdefault(key, []).append(measured)
    finally:
        for bot in bots.values():
            await bot.request.shutdown()
    return {
        key: {
            "cpu_ms": statistics.median(c for c, _ in values),
            "wall_ms": statistics.median(w for _, w in values),
        }
        for key, values in figures.items()
    }


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=400, help="per client, case and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        _wait_for(port)
        results = asyncio.run(run(args, port))
    finally:
        server.terminate()
        server.wait(10)
    common.print_table(
        f"The loop's time per Bot API request through PTB ({args.requests} requests x "
        f"{args.rounds} rounds, medians)",
        ["request, at once, client", "CPU ms", "wall ms"],
        [(k, f"{v['cpu_ms']:.3f}", f"{v['wall_ms']:.3f}") for k, v in results.items()],
    )
    common.emit_results(
        {
            "http_draft_cpu_ms_httpx": results["draft x1 httpx"]["cpu_ms"],
            "http_draft_cpu_ms_aiohttp": results["draft x1 aiohttp"]["cpu_ms"],
            "http_send_cpu_ms_httpx": results["send x1 httpx"]["cpu_ms"],
            "http_send_cpu_ms_aiohttp": results["send x1 aiohttp"]["cpu_ms"],
            "http_draft_cpu_ms_concurrent_httpx": results["draft x8 httpx"]["cpu_ms"],
            "http_draft_cpu_ms_concurrent_aiohttp": results["draft x8 aiohttp"]["cpu_ms"],
        }
    )
    common.write_json("http_client", {"requests": args.requests, "cases": results})


if __name__ == "__main__":
    main()
