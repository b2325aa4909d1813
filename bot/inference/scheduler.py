"""Continuous batching: chats join and leave the running generation at every decoding step.

The micro-batcher (bot.inference.batcher) runs a batch to its longest reply before the next one
starts. Here one inference thread steps a `fastgen.continuous.ContinuousSearch`: before every
step, waiting turns join (observe, encoder) while fewer than `max_size` chats are in flight;
after it, every chat whose search is done leaves, and its reply is delivered at once
(self_observe, then its future is resolved on the event loop). Observe and self_observe happen
exactly as in `Batcher._run_batch`, and the result is the same `Generated`.

While a chat generates, `on_draft` (if given) receives the start of its reply as far as it is
settled: the tokens every hypothesis that can still be the result shares
(`fastgen.chat_search.ChatSearch.settled`: the tokens so far, for greedy search), cut to whole
words and cleaned as the reply will be, so that every draft is the start of the reply and
none takes a word back. The best hypothesis so far is not shown: beams overtake each other.
The first draft goes as soon as a whole word is settled, then at most one per
`draft_interval_s`, and only when the text changed. A turn with `on_draft` that arrives
while other chats run, and while the batch has room (no turn left waiting), takes its first
step among the turns admitted with it (a step of their rows only), and its first draft is made
right after that step: it does not wait for a step of every chat in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.engine.protocol import DraftSink, Generated
from bot.inference.batcher import BatchError, BatchStats, Liveness, reply_cleaner

log = logging.getLogger(__name__)

__all__ = ["DraftSink", "Scheduler", "whole_words"]


@dataclass
class _Job:
    clone: Any
    text: str
    future: asyncio.Future[Generated]
    loop: asyncio.AbstractEventLoop
    on_draft: DraftSink | None
    obs: Any = None
    started: float = 0.0
    companions: int = 1  # the most chats that shared a step with it
    next_draft: float = 0.0
    last_draft: str = ""


# what `Scheduler._cleaned_start` appends to a draft's words to see what the cleaning keeps
_PROBES = ("x", ".")


def whole_words(text: str) -> str:
    """The part of a growing tokenizer text that cannot change any more: everything before its
    last space (the last word may still grow, or be the start of a longer one)."""
    cut = text.rstrip().rfind(" ")
    return text[:cut] if cut > 0 else ""


class Scheduler:
    """Owns the inference thread; `generate()` is the only entry point (as Batcher's)."""

    def __init__(
        self,
        shared_agent: Any,
        *,
        max_size: int,
        postprocess: Callable[[str], str] | None = None,
        draft_interval_s: float = 1.0,
    ) -> None:
        self.shared_agent = shared_agent
        self.max_size = max_size
        # The text users see (by default the agent's dictionary decides, reply_cleaner).
        self.postprocess = postprocess or reply_cleaner(shared_agent.opt)
        self.draft_interval_s = draft_interval_s
        self.stats = BatchStats()  # batches: decoding steps; sizes: chats per step
        self.liveness = Liveness()  # idle while it waits for turns, a beat per step
        self._waiting: deque[_Job] = deque()
        self._running: dict[int, _Job] = {}
        self._wake = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._search: Any = None
        self._admitting: list[_Job] = []  # the turns of the admission round in progress
        self._saturated = False  # turns were left waiting in this admission round

    async def start(self) -> None:
        """Start the inference thread."""
        from bot.inference.fastgen.continuous import ContinuousSearch

        self.shared_agent.model.eval()
        self._search = ContinuousSearch(self.shared_agent)
        self._thread = threading.Thread(target=self._run, name="inference", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Stop; waiting turns fail, running ones finish first."""
        with self._wake:
            self._closing = True
            waiting = list(self._waiting)
            self._waiting.clear()
            self._wake.notify()
        for job in waiting:
            _settle(job, error=BatchError("the engine is shutting down"))
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    async def generate(self, clone: Any, text: str, on_draft: DraftSink | None = None) -> Generated:
        """Observe `text` in `clone`'s context and return the reply; drafts go to `on_draft`."""
        if self._thread is None:
            raise RuntimeError("Scheduler.start() was not called")
        if not self._thread.is_alive() and not self._closing:
            raise BatchError("the inference thread is gone")  # never queue for nobody
        loop = asyncio.get_running_loop()
        job = _Job(clone, text, loop.create_future(), loop, on_draft)
        with self._wake:
            if self._closing:
                raise BatchError("the engine is shutting down")
            self._waiting.append(job)
            self._wake.notify()
        return await job.future

    # --- the inference thread ---------------------------------------------------------------

    def _run(self) -> None:
        import torch

        torch.set_grad_enabled(False)  # per thread: this one only generates
        while True:
            try:
                if not self._round():
                    return
            except Exception as err:
                # A bug or a failure outside the per-chat guards: fail every turn in hand and
                # go on with a fresh batch, rather than let the thread die and turns hang.
                log.exception("the inference loop failed; failing the turns in hand")
                self._fail_all(BatchError(f"generation failed: {type(err).__name__}: {err}"))

    def _fail_all(self, error: BatchError) -> None:
        """Every running turn fails with `error`, and the running batch starts afresh."""
        self.stats.failures += 1
        with contextlib.suppress(Exception):
            self._search.clear()
        for job in [*self._running.values(), *self._admitting]:
            _settle(job, error=error)  # (a no-op for a turn already answered)
        self._running.clear()
        self._admitting = []

    def _round(self) -> bool:
        """Admit waiting turns, run one decoding step, hand out what finished; False when
        closed and idle."""
        search = self._search
        with self._wake:
            if not self._waiting and not self._running and not self._closing:
                self.liveness.working(False)
                while not self._waiting and not self._running and not self._closing:
                    self._wake.wait()
                self.liveness.working(True)
            if self._closing and not self._running:
                return False
            admit: list[_Job] = []
            while self._waiting and len(self._running) + len(admit) < self.max_size:
                job = self._waiting.popleft()
                if not job.future.cancelled():
                    admit.append(job)
            # turns left waiting: the batch is full, and its steps are better spent on replies
            self._saturated = bool(self._waiting)
        if admit:
            self._admitting = admit  # failed too if the loop fails before they all joined
            self._admit(admit)
            self._admitting = []
        if not self._running:
            return True
        self.stats.batches += 1
        self.stats.sizes[len(self._running)] += 1
        for job in self._running.values():
            job.companions = max(job.companions, len(self._running))
        self.liveness.beat()
        try:
            finished = search.step()
        except Exception as err:
            log.exception("decoding step with %d chats failed", len(self._running))
            self._fail_all(BatchError(f"generation failed: {type(err).__name__}: {err}"))
            return True
        self._deliver(finished)
        self._drafts(search)
        return True

    def _deliver(self, finished: list[Any]) -> None:
        """The replies of the chats whose search is done."""
        for chat in finished:
            owner = self._running.pop(chat.key, None)
            if owner is None:
                log.error("a finished chat had no turn waiting for it; dropped")
                continue
            try:
                result = self._finish(owner, chat.result())
            except Exception as err:
                log.exception("finishing a reply failed")
                _settle(owner, error=BatchError(f"generation failed: {err}"))
            else:
                _settle(owner, result=result)

    def _admit(self, jobs: list[_Job]) -> None:
        """The turns that join before the next step (one round of admission).

        While other chats run, the turns that stream drafts run their first step among
        themselves first (`ContinuousSearch.join_ahead`: a step of their own rows, a fraction
        of a step of every row in flight), so their first draft does not wait for a whole
        shared step; the others join at step 0 and take their first step with everyone. Not
        when turns are left waiting (the batch is full): that extra step is then time taken
        from every reply (measured: saturated throughput fell by a third with it)."""
        ahead: list[tuple[_Job, Any]] = []
        for job in jobs:
            batch = self._prepare(job)
            if batch is None:
                continue
            if job.on_draft is not None and self._running and not self._saturated:
                ahead.append((job, batch))
            else:
                self._join(job, functools.partial(self._search.join, id(job), batch))
        if not ahead:
            return
        done: list[Any] = []

        def join_ahead() -> None:
            done.extend(self._search.join_ahead([(id(job), batch) for job, batch in ahead]))

        for job, _ in ahead:
            self._running[id(job)] = job  # failed with the batch if joining fails
        if self._join(None, join_ahead):
            self._deliver(done)
            self._drafts(self._search, only={id(job) for job, _ in ahead})

    def _prepare(self, job: _Job) -> Any:
        """Observe the turn; its batch (of one) for the search, or None when it was answered
        alone the old way (the batched search does not apply to it) or failed."""
        from parlai.core.message import Message

        from bot.inference.fastgen.policy import fallback_reason

        agent = self.shared_agent
        job.started = time.perf_counter()
        job.next_draft = job.started
        self.stats.requests += 1
        try:
            job.obs = job.clone.observe(Message({"text": job.text, "episode_done": False}))
            batch = agent.batchify([job.obs])
            if fallback_reason(agent, batch, None) is not None:
                reply = agent.batch_act([job.obs])[0]
                _settle(job, result=self._generated(job, str(reply.get("text", "")), reply))
                return None
        except Exception as err:
            self.stats.failures += 1
            log.exception("a turn could not join the running batch")
            _settle(job, error=BatchError(f"generation failed: {type(err).__name__}: {err}"))
            return None
        return batch

    def _join(self, job: _Job | None, join: Callable[[], Any]) -> bool:
        """Let `job` (None: turns already counted as running) join the running batch by
        `join`; False when that failed."""
        try:
            join()
        except Exception as err:
            # The running batch may be half-changed (its caches grown, its chats not): fail
            # the turns in hand and start afresh, rather than step an inconsistent batch.
            log.exception("a turn could not join the running batch")
            error = BatchError(f"generation failed: {type(err).__name__}: {err}")
            self._fail_all(error)
            if job is not None:
                _settle(job, error=error)
            return False
        if job is not None:
            self._running[id(job)] = job
        return True

    def _finish(self, job: _Job, beams: Any) -> Generated:
        agent = self.shared_agent
        hyps = beams.get_rescored_finished()
        reply = {
            "text": agent._v2t(hyps[0][0]),
            "beam_texts": [(agent._v2t(tokens), float(score)) for tokens, score, _ in hyps],
        }
        return self._generated(job, reply["text"], reply)

    def _generated(self, job: _Job, raw: str, reply: Any) -> Generated:
        """What Batcher._run_batch makes of one reply: the clone remembers the model's text."""
        from parlai.core.message import Message

        text = self.postprocess(raw)
        job.clone.self_observe(Message({"text": raw, "episode_done": False}))
        vec = job.obs.get("text_vec") if job.obs is not None else None
        model_input = vec.tolist() if vec is not None else []
        beams = reply.get("beam_texts") or []
        candidates = tuple(dict.fromkeys(self.postprocess(str(t)) for t, *_ in beams))
        model_ms = (time.perf_counter() - job.started) * 1000.0
        return Generated(
            text,
            model_input,
            job.companions,
            model_ms,
            candidates,
            model_text=None if raw == text else raw,
        )

    def _drafts(self, search: Any, only: set[int] | None = None) -> None:
        """Drafts for the running chats (those keyed in `only`, when given) that are due."""
        try:
            self._draft_each(search, only)
        except Exception:  # a preview must never stop the thread that makes replies
            log.exception("drafting failed")

    def _draft_each(self, search: Any, only: set[int] | None) -> None:
        now = time.perf_counter()
        for chat in search.chats:
            if only is not None and chat.key not in only:
                continue
            job = self._running.get(chat.key)
            if job is None or job.on_draft is None or now < job.next_draft:
                continue
            draft = self._draft_text(chat)
            if not draft or draft == job.last_draft:
                continue
            job.last_draft = draft
            job.next_draft = now + self.draft_interval_s
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                job.loop.call_soon_threadsafe(_draft, job, draft)

    def _draft_text(self, chat: Any) -> str:
        """What a draft of `chat` shows now ("": nothing yet): the whole words of the tokens
        its reply will begin with (`ChatSearch.settled`), cleaned as the reply will be."""
        tokens, complete = chat.settled()
        if not tokens:
            return ""
        if complete:
            return self.postprocess(str(self.shared_agent._v2t(tokens)))
        words = self._whole_words(tokens)
        return self._cleaned_start(words) if words else ""

    def _cleaned_start(self, words: str) -> str:
        """The part of `postprocess(words)` that the cleaning of the whole reply (`words`, a
        space, more words) keeps as it is.

        The cleaning looks at neighbours (ParlAI's normalize_reply glues a final "'" to the
        word before it, unless punctuation follows; a cleaning may end the reply with a
        period), so the cleaned words are compared with the cleaning of `words` followed by a
        word and by a full stop, and only the start they share is shown: a whole word, or up
        to punctuation."""
        shown = self.postprocess(words)
        longer = [self.postprocess(f"{words} {probe}") for probe in _PROBES]
        n = 0
        for chars in zip(shown, *longer, strict=False):
            if len(set(chars)) > 1:
                break
            n += 1
        if n == len(shown):
            return shown
        if n and shown[n - 1].isalnum() and shown[n].isalnum():  # cut inside a word
            cut = shown[:n].rfind(" ")
            return shown[:cut] if cut > 0 else ""
        return shown[:n].rstrip()

    def _whole_words(self, tokens: list[int]) -> str:
        """The words of a token prefix of the reply that are complete already (tokenizer
        text; start and end tokens are left out)."""
        agent = self.shared_agent
        tokens = [t for t in tokens if t not in (agent.START_IDX, agent.END_IDX)]
        dictionary = agent.dict
        kind = getattr(dictionary, "tokenizer", None)
        if kind == "bpe":
            # subword-nmt marks a piece that continues with "@@": a word is complete once a
            # token without it ends it
            while tokens and str(dictionary[tokens[-1]]).endswith("@@"):
                tokens.pop()
            return str(dictionary.vec2txt(tokens))
        if kind in ("re", "split", "space"):
            return str(dictionary.vec2txt(tokens))  # every token is a word of its own
        # byte-level BPE marks where a word starts, not where it ends: the last may grow, and
        # a prefix may end inside a character (decoded as U+FFFD) only in that last word
        return whole_words(str(dictionary.vec2txt(tokens)))


def _draft(job: _Job, text: str) -> None:
    """On the event loop: hand a draft over, unless the reply is already there."""
    if job.on_draft is not None and not job.future.done():
        try:
            job.on_draft(text)
        except Exception:
            log.exception("a draft callback failed")


def _settle(job: _Job, *, result: Generated | None = None, error: Exception | None = None) -> None:
    def settle() -> None:
        if job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)  # type: ignore[arg-type]

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
        job.loop.call_soon_threadsafe(settle)
