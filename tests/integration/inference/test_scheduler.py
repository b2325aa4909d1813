"""The continuous scheduler (bot/inference/scheduler.py) on the real tiny model: the Batcher's
replies and clone semantics, short replies that do not wait for long ones, drafts."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.config import Settings
from bot.engine.protocol import Generated
from bot.inference.batcher import Batcher
from bot.inference.fastgen import continuous
from bot.inference.model import load_shared_agent
from bot.inference.responder import make_decoder
from bot.inference.scheduler import Scheduler, whole_words
from tests.integration.inference.test_fastgen import _settings, generation


@pytest.fixture(scope="module")
def agent(tiny_model_file: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_shared_agent(_settings(tiny_model_file, tmp_path_factory.mktemp("scheduler")))


@pytest.fixture
async def scheduler(agent: Any) -> AsyncIterator[Scheduler]:
    engine = Scheduler(agent, max_size=16)
    await engine.start()
    yield engine
    await engine.close()


def _texts(agent: Any, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = [agent.dict.ind2tok[i] for i in range(4, len(agent.dict))]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 25))) for _ in range(n)]


def _history(clone: Any) -> list[str]:
    return list(clone.history.history_strings)


async def test_replies_and_clones_as_the_micro_batcher_leaves_them(
    agent: Any, scheduler: Scheduler
) -> None:
    """Same reply, candidates, model input and clone history as a Batcher answering each chat
    alone (ParlAI's solo reply), for chats submitted together."""
    texts = _texts(agent, 8, seed=3)
    solo = Batcher(agent, max_size=1, max_wait_ms=0)
    await solo.start()
    try:
        ref_clones = [agent.clone() for _ in texts]
        refs = [await solo.generate(c, t) for c, t in zip(ref_clones, texts, strict=True)]
    finally:
        await solo.close()
    clones = [agent.clone() for _ in texts]
    got = await asyncio.gather(
        *(scheduler.generate(c, t) for c, t in zip(clones, texts, strict=True))
    )
    for ref, ours, ref_clone, clone in zip(refs, got, ref_clones, clones, strict=True):
        assert (ours.text, ours.model_text, ours.candidates, ours.model_input) == (
            ref.text,
            ref.model_text,
            ref.candidates,
            ref.model_input,
        )
        assert _history(clone) == _history(ref_clone)
        # The clone remembers the model's own text (the tiny model's is tokenizer text,
        # detokenised for users), as ParlAI's agent does.
        assert ours.model_text is not None
        assert _history(clone)[-1] == ours.model_text
    assert max(g.batch_size for g in got) > 1  # they did share steps


def _reply_length(agent: Any, text: str) -> int:
    from parlai.core.message import Message

    reply = agent.batch_act([agent.clone().observe(Message({"text": text}))])[0]
    return len(agent.dict.txt2vec(reply["text"]))


@pytest.fixture(scope="module")
def ending_agent(tiny_model_file: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny model, whose random weights never say the end token, made to say it where it
    would say "hello" (the end token's embedding a copy of hello's, a little longer): some
    inputs get an empty reply at the first step, the others run to the length limit."""
    import torch

    own = load_shared_agent(_settings(tiny_model_file, tmp_path_factory.mktemp("ending")))
    emb = own.model.embeddings.weight
    with torch.no_grad():
        emb[own.END_IDX] = emb[own.dict["hello"]] * 1.05
    return own


async def test_a_short_reply_arriving_during_a_long_one_is_delivered_first(
    ending_agent: Any,
) -> None:
    """The short one arrives while the long one generates (from the long one's first draft)
    and is delivered at once, while the long one goes on to its length limit."""
    agent = ending_agent
    limit = 60  # the tiny model has 64 positions
    with generation(agent, inference="greedy", beam_size=1, beam_block_ngram=-1,
                    beam_context_block_ngram=-1, label_truncate=limit):  # fmt: skip
        lengths = {t: _reply_length(agent, t) for t in _texts(agent, 40, seed=11)}
        long = next(t for t, n in lengths.items() if n >= limit - 1)
        short = next(t for t, n in lengths.items() if n == 0)
        engine = Scheduler(agent, max_size=16, draft_interval_s=0.0)
        await engine.start()
        search = engine._search
        step = search.step
        # what each step hands back (delivered right after it): (steps the finished chats
        # took, chats still running)
        handed: list[tuple[list[int], int]] = []

        def recording_step() -> list[Any]:
            done = step()
            if done:
                handed.append(([c.t for c in done], len(search.chats)))
            return done

        search.step = recording_step
        order: list[str] = []
        short_task: list[asyncio.Task[Generated]] = []

        def first_draft(_text: str) -> None:
            if not short_task:  # the long one is generating now: the short one arrives
                task = asyncio.ensure_future(engine.generate(agent.clone(), short))
                task.add_done_callback(lambda _: order.append("short"))
                short_task.append(task)

        try:
            long_reply = asyncio.ensure_future(
                engine.generate(agent.clone(), long, on_draft=first_draft)
            )
            long_reply.add_done_callback(lambda _: order.append("long"))
            await long_reply
            await short_task[0]
        finally:
            await engine.close()
    assert order == ["short", "long"]
    assert short_task[0].result().batch_size == 2  # it ran beside the long one
    # the short one left after its one step, while the long one went on; then the long one
    assert handed == [([1], 1), ([limit], 0)], handed
    assert len(long_reply.result().text.split()) >= limit - 1


async def test_a_streamed_turn_joining_running_chats_drafts_before_the_next_shared_step(
    agent: Any,
) -> None:
    """A turn that streams drafts, arriving while another chat generates, takes its first step
    among the newcomers (`join_ahead`) and its first draft is made right then, before the next
    step of every chat in flight; its reply is still its solo reply."""
    texts = _texts(agent, 2, seed=21)
    with generation(agent, inference="greedy", beam_size=1, label_truncate=40):
        solo = Batcher(agent, max_size=1, max_wait_ms=0)
        await solo.start()
        try:
            ref = await solo.generate(agent.clone(), texts[1])
        finally:
            await solo.close()
        engine = Scheduler(agent, max_size=16, draft_interval_s=0.0)
        await engine.start()
        search = engine._search
        steps = {"shared": 0}
        step, drafts_for = search.step, engine._drafts
        first: dict[str, Any] = {}
        second_drafts: list[str] = []

        def counting_step() -> list[Any]:
            steps["shared"] += 1
            return step()

        def watching_drafts(search_: Any, only: Any = None) -> None:
            drafts_for(search_, only)
            for job in engine._running.values():
                if job.on_draft == second_drafts.append and job.last_draft and not first:
                    first.update(steps=steps["shared"], ahead=only is not None)

        search.step = counting_step
        engine._drafts = watching_drafts  # type: ignore[method-assign]
        second: list[asyncio.Future[Generated]] = []

        def long_draft(_text: str) -> None:
            if not second:  # the first chat is generating: the second one arrives
                second.append(
                    asyncio.ensure_future(
                        engine.generate(agent.clone(), texts[1], on_draft=second_drafts.append)
                    )
                )

        try:
            await engine.generate(agent.clone(), texts[0], on_draft=long_draft)
            got = await second[0]
        finally:
            await engine.close()
    assert first["ahead"], first  # the first draft came from the step among the newcomers
    assert got.text == ref.text and got.batch_size == 2
    assert second_drafts and got.text.startswith(second_drafts[0].rstrip(".!?"))


async def test_no_first_step_ahead_while_turns_are_left_waiting(agent: Any) -> None:
    """A full batch (turns left waiting) spends its steps on replies: streamed turns then join
    at step 0 like any other, and take the step ahead only when the batch has room again."""
    texts = _texts(agent, 4, seed=22)
    with generation(agent, inference="greedy", beam_size=1, label_truncate=30):
        engine = Scheduler(agent, max_size=2, draft_interval_s=0.0)
        await engine.start()
        search = engine._search
        ahead, admit = search.join_ahead, engine._admit
        seen = {"ahead_while_waiting": 0, "ahead": 0, "saturated_rounds": 0}

        def watching_ahead(joins: Any) -> Any:
            seen["ahead"] += 1
            seen["ahead_while_waiting"] += engine._saturated
            return ahead(joins)

        def watching_admit(jobs: Any) -> None:
            seen["saturated_rounds"] += engine._saturated and bool(engine._running)
            admit(jobs)

        search.join_ahead = watching_ahead
        engine._admit = watching_admit  # type: ignore[method-assign]
        later: list[asyncio.Future[Generated]] = []

        def long_draft(_text: str) -> None:
            if not later:  # two streamed turns arrive at once; one slot is free
                for text in texts[1:]:
                    later.append(
                        asyncio.ensure_future(
                            engine.generate(agent.clone(), text, on_draft=lambda _t: None)
                        )
                    )

        try:
            await engine.generate(agent.clone(), texts[0], on_draft=long_draft)
            await asyncio.gather(*later)
        finally:
            await engine.close()
    assert seen["saturated_rounds"] > 0, seen  # a round did leave turns waiting
    assert seen["ahead_while_waiting"] == 0, seen
    assert seen["ahead"] > 0, seen  # and with room again, streamed turns went ahead


@asynccontextmanager
async def greedy_scheduler(
    agent: Any, *, label_truncate: int, draft_interval_s: float
) -> AsyncIterator[Scheduler]:
    """A started Scheduler of 4 over greedy search without blocking; closed at the end."""
    with generation(agent, inference="greedy", beam_size=1, beam_block_ngram=-1,
                    beam_context_block_ngram=-1, label_truncate=label_truncate):  # fmt: skip
        engine = Scheduler(agent, max_size=4, draft_interval_s=draft_interval_s)
        await engine.start()
        try:
            yield engine
        finally:
            await engine.close()


async def test_drafts_are_whole_words_of_the_growing_reply(agent: Any) -> None:
    drafts: list[str] = []
    results = []
    async with greedy_scheduler(agent, label_truncate=40, draft_interval_s=0.0) as engine:
        for text in _texts(agent, 20, seed=5):
            drafts.clear()
            result = await engine.generate(agent.clone(), text, on_draft=drafts.append)
            results.append((result, list(drafts)))
    streamed = [(r, d) for r, d in results if d]
    assert streamed  # long enough replies stream
    for result, ds in streamed:
        assert len(set(ds)) == len(ds)  # only changed texts
        # greedy grows one hypothesis: every draft is the start of the final reply, in words
        final = result.text.lower().split()
        for d in ds:
            words = d.lower().split()
            assert words == final[: len(words)], (d, result.text)
            assert len(words) < len(final) or d.lower() == result.text.lower()


def test_whole_words_drops_the_word_that_may_still_grow() -> None:
    assert whole_words("hello there fri") == "hello there"
    assert whole_words("hello") == ""
    assert whole_words("") == ""


async def test_drafts_are_rate_limited_per_chat(agent: Any) -> None:
    drafts: list[str] = []
    async with greedy_scheduler(agent, label_truncate=60, draft_interval_s=3600.0) as engine:
        for text in _texts(agent, 10, seed=11):
            await engine.generate(agent.clone(), text, on_draft=drafts.append)
            assert len(drafts) <= 1
            drafts.clear()


def test_which_engine(agent: Any, tiny_model_file: str, tmp_path: Path) -> None:
    assert isinstance(make_decoder(agent, _settings(tiny_model_file, tmp_path)), Scheduler)
    batch = _settings(tiny_model_file, tmp_path, scheduler="batch")
    assert isinstance(make_decoder(agent, batch), Batcher)
    with generation(agent, inference="nucleus", topp=0.9):
        assert continuous.continuous_supported(agent) == "inference=nucleus"
        assert isinstance(make_decoder(agent, _settings(tiny_model_file, tmp_path)), Batcher)


async def test_a_failing_step_fails_its_chats_and_the_engine_goes_on(
    agent: Any, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.inference.batcher import BatchError

    search = scheduler._search
    real = search.step
    calls = {"n": 0}

    def explode() -> list[Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real()

    monkeypatch.setattr(search, "step", explode)
    with pytest.raises(BatchError, match="boom"):
        await scheduler.generate(agent.clone(), "hello there")
    assert len(search) == 0
    reply = await scheduler.generate(agent.clone(), "hello there")
    assert reply.text


async def test_a_half_done_join_or_a_loop_bug_fails_the_turns_in_hand_and_nothing_hangs(
    agent: Any, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found in review: an exception outside the per-chat guards killed the inference thread
    # silently, and every later turn waited forever.
    from bot.inference.batcher import BatchError

    search = scheduler._search
    real_join, real_admit = search.join, scheduler._admit
    calls = {"join": 0, "admit": 0}

    def half_join(key: int, batch: Any) -> None:
        calls["join"] += 1
        real_join(key, batch)
        if calls["join"] == 1:
            raise RuntimeError("out of memory while packing")  # after changing the batch

    def buggy_admit(jobs: Any) -> None:
        calls["admit"] += 1
        if calls["admit"] == 1:
            raise KeyError("a bug outside the per-chat guards")
        real_admit(jobs)

    monkeypatch.setattr(search, "join", half_join)
    with pytest.raises(BatchError, match="out of memory"):
        await asyncio.wait_for(scheduler.generate(agent.clone(), "hello there"), 60)
    assert len(search) == 0
    monkeypatch.setattr(scheduler, "_admit", buggy_admit)
    with pytest.raises(BatchError, match="outside the per-chat guards"):
        await asyncio.wait_for(scheduler.generate(agent.clone(), "hello there"), 60)
    reply = await asyncio.wait_for(scheduler.generate(agent.clone(), "hello again"), 60)
    assert reply.text and scheduler._thread is not None and scheduler._thread.is_alive()


def test_bpe_drafts_end_where_a_word_ends(tmp_path: Path) -> None:
    """The shipped model's subword-nmt BPE: a piece ending in "@@" continues, so a draft
    stops before it; a word is shown once its last piece is there."""
    shipped = load_shared_agent(Settings(_env_file=None, data_dir=tmp_path))  # type: ignore[call-arg]
    assert shipped.dict.tokenizer == "bpe"
    engine = Scheduler(shipped, max_size=1)
    text = "i love unbelievably tremendous hiking"
    vec = shipped.dict.txt2vec(text)
    pieces = [shipped.dict[t] for t in vec]
    assert "un@@" in pieces  # the test needs a word of several pieces
    drafts = [engine._whole_words([shipped.START_IDX, *vec[:k]]) for k in range(1, len(vec) + 1)]
    for k, draft in enumerate(drafts, start=1):
        complete = not pieces[k - 1].endswith("@@")
        words = draft.split()
        assert words == text.split()[: len(words)], draft
        if complete:
            assert draft == str(shipped.dict.vec2txt(vec[:k]))
    assert drafts[-1] == text
