"""Reading the service's METRICS_PORT endpoints over HTTP: /metrics samples, /readyz."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(port: int, path: str = "/metrics") -> Samples:
    """Every sample of the endpoint, keyed by (name, labels)."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}{path}") as answer,
    ):
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain; version=")
        body = await answer.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """One sample's value (None: no such series)."""
    return samples.get((name, frozenset(labels.items())))


async def wait_scraped(
    port: int, check: Callable[[Samples], bool], what: str, timeout_s: float = 20.0
) -> Samples:
    """Scrape until `check` holds (the service works asynchronously); the last scrape."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        samples = await scrape(port)
        if check(samples):
            return samples
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def get_json(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """A GET's status and JSON body."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}{path}") as answer,
    ):
        assert answer.headers["Content-Type"].startswith("application/json")
        body: dict[str, Any] = await answer.json()
        return answer.status, body


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    """/readyz's status and JSON body."""
    return await get_json(port, "/readyz")


async def wait_readyz(
    port: int, status: int, timeout_s: float = 30.0
) -> tuple[int, dict[str, Any]]:
    """Probe /readyz until it answers `status`; its last answer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        got, body = await readyz(port)
        if got == status:
            return got, body
        if loop.time() > deadline:
            raise AssertionError(f"/readyz still answers {got}: {body}")
        await asyncio.sleep(0.05)
