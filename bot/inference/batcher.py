"""Micro-batching: many chats' turns answered by one batch_act on the shared model.

Requests are grouped up to `max_size`, waiting at most `max_wait_ms` for companions; while a batch
runs on the single inference thread, newcomers queue for the next one. The event loop only awaits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bot.engine.protocol import Generated
from bot.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class BatchError(Exception):
    """A batch failed; every request in it gets this error."""


def chat_reply(text: str) -> str:
    """Tokenizer output to chat text: `what ' s up ?` becomes `What's up?`."""
    from parlai.utils.strings import normalize_reply

    cleaned: str = normalize_reply(text).strip()
    return cleaned or "..."


def verbatim_reply(text: str) -> str:
    """A cased dictionary's output as it is, surrounding spaces trimmed."""
    return text.strip() or "..."


# Dictionaries that encode text byte for byte, spaces and case included (BlenderBot
# 400M-distill, 1B-distill, 3B): their output is already the text to show.
BYTE_LEVEL_TOKENIZERS = frozenset({"bytelevelbpe", "slow_bytelevel_bpe", "gpt2"})


def reply_cleaner(opt: Mapping[str, Any]) -> Callable[[str], str]:
    """How a model's output becomes the text a user sees, decided by its dictionary options: a
    cased byte-level BPE dictionary's text is kept (`verbatim_reply`); a lowercased or
    punctuation-splitting one (`re`, BlenderBot 90M's `bpe`) is detokenised and its sentences
    capitalised (`chat_reply`), which would lowercase a cased model's names and places."""
    if opt.get("dict_tokenizer") in BYTE_LEVEL_TOKENIZERS and not opt.get("dict_lower"):
        return verbatim_reply
    return chat_reply


@dataclass
class _Job:
    clone: Any
    text: str
    future: asyncio.Future[Generated]


class Liveness:
    """Whether the inference thread makes progress: the time of its last sign of it (a
    decoding step, a batch taken or finished) and whether it has work in hand. The worker
    reports `stuck_s` in its answer to the service's pings (bot/engine/backends/local.py), so a
    long generation is not a hang, and an idle thread is never stuck."""

    def __init__(self) -> None:
        self.busy = False
        self._at = time.monotonic()

    def beat(self) -> None:
        """A decoding step (or any other progress) just happened."""
        self._at = time.monotonic()

    def working(self, busy: bool) -> None:
        """The thread takes work (True) or has none left (False)."""
        self.busy = busy
        self._at = time.monotonic()

    def stuck_s(self) -> float:
        """Seconds without progress while there is work (0 when idle)."""
        return time.monotonic() - self._at if self.busy else 0.0


@dataclass
class BatchStats:
    """How batches were formed."""

    batches: int = 0
    requests: int = 0
    failures: int = 0
    sizes: Counter[int] = field(default_factory=Counter)


class Batcher:
    """Owns the inference thread; `generate()` is the only entry point."""

    def __init__(
        self,
        shared_agent: Any,
        *,
        max_size: int,
        max_wait_ms: float,
        postprocess: Callable[[str], str] | None = None,
    ) -> None:
        self.shared_agent = shared_agent
        self.max_size = max_size
        self.max_wait = max_wait_ms / 1000.0
        # The text users see (by default the agent's dictionary decides, reply_cleaner).
        self.postprocess = postprocess or reply_cleaner(shared_agent.opt)
        self.stats = BatchStats()
        self.liveness = Liveness()
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")

    async def start(self) -> None:
        """Start forming batches on the running loop."""
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._loop(), name="batcher")

    async def close(self) -> None:
        """Stop; queued requests fail, a running batch finishes."""
        await cancel_and_wait(self._task)
        self._task = None
        if self._queue is not None:
            while not self._queue.empty():
                job = self._queue.get_nowait()
                if not job.future.done():
                    job.future.set_exception(BatchError("the engine is shutting down"))
        self._executor.shutdown(wait=True)

    async def generate(self, clone: Any, text: str) -> Generated:
        """Observe `text` in `clone`'s context and return the reply, batched with others."""
        if self._queue is None:
            raise RuntimeError("Batcher.start() was not called")
        future: asyncio.Future[Generated] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Job(clone, text, future))
        return await future

    async def _collect(self) -> list[_Job]:
        assert self._queue is not None
        batch = [await self._queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait
        while len(batch) < self.max_size:
            try:
                batch.append(self._queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    batch.append(await self._queue.get())
            except TimeoutError:
                break
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [job for job in await self._collect() if not job.future.cancelled()]
            if not batch:
                continue
            self.stats.batches += 1
            self.stats.requests += len(batch)
            self.stats.sizes[len(batch)] += 1
            try:
                results = await loop.run_in_executor(self._executor, self._run_batch, batch)
            except Exception as err:
                self.stats.failures += 1
                log.exception("batch of %d failed", len(batch))
                error = BatchError(f"generation failed: {type(err).__name__}: {err}")
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(error)
                continue
            for job, result in zip(batch, results, strict=True):
                if not job.future.done():
                    job.future.set_result(result)

    def _run_batch(self, batch: list[_Job]) -> list[Generated]:
        """Runs on the inference thread: observe each clone, one batch_act, self_observe each."""
        self.liveness.working(True)
        try:
            return self._answer_batch(batch)
        finally:
            self.liveness.working(False)

    def _answer_batch(self, batch: list[_Job]) -> list[Generated]:
        from parlai.core.message import Message

        started = time.perf_counter()
        observations = [
            job.clone.observe(Message({"text": job.text, "episode_done": False})) for job in batch
        ]
        replies = self.shared_agent.batch_act(observations)
        model_ms = (time.perf_counter() - started) * 1000.0
        results = []
        for job, obs, reply in zip(batch, observations, replies, strict=True):
            raw = str(reply.get("text", ""))
            text = self.postprocess(raw)
            # The clone remembers the model's own text, as ParlAI's agent does; it is stored
            # beside the text shown (Generated.model_text), so a clone rebuilt from the
            # database sees the same model input as this one.
            job.clone.self_observe(Message({"text": raw, "episode_done": False}))
            vec = obs.get("text_vec")
            model_input = vec.tolist() if vec is not None else []
            beams = reply.get("beam_texts") or []
            candidates = tuple(dict.fromkeys(self.postprocess(str(t)) for t, *_ in beams))
            results.append(
                Generated(
                    text,
                    model_input,
                    len(batch),
                    model_ms,
                    candidates,
                    model_text=None if raw == text else raw,
                )
            )
        return results
