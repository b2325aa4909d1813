"""The batched beam search (bot/inference/fastgen/) against ParlAI's own, on real models.

Same results means bit for bit: the same top reply with the same score, and the same list of
finished hypotheses in the same order with the same scores (what `beam_texts` shows). Random
weights make degenerate, repetitive text, which is what n-gram blocking needs to be exercised;
inputs are random word sequences of varied lengths (padding) in varied batch sizes, sometimes
with a previous turn in the history (context blocking on the full history).
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.config import Settings
from bot.inference import fastgen
from bot.inference.model import load_shared_agent, set_torch_threads
from tests.support.tinymodel import build_model, lowercase_words, parlai_args, truncation


def _settings(model_file: str, tmp_path: Path, **kw: Any) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None, bot_model=model_file, data_dir=tmp_path / "data", **kw
    )


@pytest.fixture(scope="module")
def agent(tiny_model_file: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_shared_agent(_settings(tiny_model_file, tmp_path_factory.mktemp("fastgen")))


OPT_ONLY = ("inference", "beam_length_penalty", "topk")


def configure(agent: Any, **gen: Any) -> dict[str, Any]:
    """Set generation options where ParlAI reads them (opt, attributes); returns the old ones."""
    old = {}
    for name, value in gen.items():
        old[name] = agent.opt.get(name)
        agent.opt[name] = value
        if name not in OPT_ONLY:
            setattr(agent, name, value)
    return old


@contextlib.contextmanager
def generation(agent: Any, **gen: Any) -> Iterator[None]:
    """Generation options for the duration of a block (the agent is shared by the module)."""
    old = configure(agent, **gen)
    try:
        yield
    finally:
        agent.fast_search = True
        configure(agent, **old)


@dataclass
class Case:
    """One random generation problem."""

    gen: dict[str, Any]
    max_len: int
    texts: list[list[str]]  # per chat: user turn, or user, bot, user turns


def random_case(rng: random.Random, words: list[str], beam: int, blocking: bool) -> Case:
    """A random batch and random settings for beam size `beam`, with or without blocking."""
    greedy = beam == 1 and rng.random() < 0.3
    pick = [1, 2, 3, 4] if blocking else [-1]
    gen = {
        "inference": "greedy" if greedy else "beam",
        "beam_size": beam,
        "beam_min_length": rng.choice([0, 1, 3, 5, 8]),
        "beam_block_ngram": rng.choice(pick),
        "beam_context_block_ngram": rng.choice(pick),
        "beam_block_full_context": rng.random() < 0.4,
        "beam_length_penalty": rng.choice([0.65, 0.65, 0.0, 1.0]),
        "temperature": rng.choice([1.0, 1.0, 1.0, 0.7, 1.5]),
    }
    if blocking and rng.random() < 0.3:
        gen[rng.choice(["beam_block_ngram", "beam_context_block_ngram"])] = -1
    texts = []
    for _ in range(rng.choice([1, 2, 3, 5, 8])):
        turns = [rng.randint(1, 30) for _ in range(rng.choice([1, 1, 3]))]
        texts.append([" ".join(rng.choice(words) for _ in range(n)) for n in turns])
    return Case(gen, rng.choice([1, 4, 8, 12]), texts)


def observe(agent: Any, turns: list[str]) -> Any:
    """A fresh clone that has seen the earlier turns; the observation of the last one."""
    from parlai.core.message import Message

    clone = agent.clone()
    obs = None
    for i, text in enumerate(turns):
        msg = Message({"text": text, "episode_done": False})
        if i % 2 == 0:
            obs = clone.observe(msg)
        else:
            clone.self_observe(msg)
    return obs


def observations(agent: Any, case: Case) -> list[Any]:
    """Each chat in its own clone: earlier turns observed, the last one pending."""
    return [observe(agent, turns) for turns in case.texts]


def finished_lists(beams: list[Any]) -> list[list[tuple[list[int], float]]]:
    """Every chat's finished hypotheses (tokens, exact score), in the search's order."""
    return [
        [(tokens.tolist(), score.item()) for tokens, score, _ in beam.get_rescored_finished()]
        for beam in beams
    ]


@dataclass
class Tally:
    """Chats compared per configuration, and every difference found."""

    chats: Counter[str] = field(default_factory=Counter)
    same_top: Counter[str] = field(default_factory=Counter)
    same_all: Counter[str] = field(default_factory=Counter)
    differences: list[str] = field(default_factory=list)


def run_search(
    agent: Any, case: Case, fast: bool = True, batch: Any = None
) -> tuple[Any, list[Any], Any]:
    """Generate `case` (its own batch, or `batch`) with our batched search or, `fast` false,
    ParlAI's: (predictions, beams, batch). The agent keeps our search afterwards."""
    import torch

    with generation(agent, **case.gen), torch.no_grad():
        if batch is None:
            batch = agent.batchify(observations(agent, case))
        agent.fast_search = fast
        try:
            preds, beams = agent._generate(batch, case.gen["beam_size"], case.max_len)
        finally:
            agent.fast_search = True
    return preds, beams, batch


def compare(agent: Any, case: Case, tally: Tally) -> None:
    """Generate `case` with ParlAI's search and ours on the same batch; record the outcome."""
    beam = case.gen["beam_size"]
    ref, ref_beams, batch = run_search(agent, case, fast=False)
    got, got_beams, _ = run_search(agent, case, batch=batch)
    assert isinstance(got_beams[0], fastgen.BatchedBeams), "the batched search did not run"
    blocking = case.gen["beam_block_ngram"] > 0 or case.gen["beam_context_block_ngram"] > 0
    name = f"{case.gen['inference']}{beam} {'blocking' if blocking else 'no blocking'}"
    ref_all, got_all = finished_lists(ref_beams), finished_lists(got_beams)
    for i, (r, g) in enumerate(zip(ref, got, strict=True)):
        tally.chats[name] += 1
        top = r[0].tolist() == g[0].tolist() and r[1].item() == g[1].item()
        tally.same_top[name] += top
        tally.same_all[name] += ref_all[i] == got_all[i]
        if not top or ref_all[i] != got_all[i]:
            tally.differences.append(
                f"{name} {case.gen} max_len={case.max_len} chat {i}: "
                f"ParlAI {r[0].tolist()} {r[1].item()!r}, ours {g[0].tolist()} {g[1].item()!r}"
            )


def report(tally: Tally) -> str:
    """One line per configuration: chats, identical top replies, identical finished lists."""
    return "\n".join(
        f"{name}: {n} chats, {tally.same_top[name]} same top reply and score, "
        f"{tally.same_all[name]} same finished hypotheses"
        for name, n in sorted(tally.chats.items())
    )


def sweep(agent: Any, seed: int, cases_per_config: int, beams: tuple[int, ...]) -> Tally:
    """Random cases for every beam size, with and without n-gram blocking."""
    rng = random.Random(seed)
    words = [agent.dict.ind2tok[i] for i in range(4, len(agent.dict))]
    tally = Tally()
    for beam in beams:
        for blocking in (False, True):
            for _ in range(cases_per_config):
                compare(agent, random_case(rng, words, beam, blocking), tally)
    return tally


# --- switching it on -------------------------------------------------------------------------


def test_service_agent_uses_the_batched_search_and_clones_inherit_it(agent: Any) -> None:
    assert type(agent) is fastgen.FastTransformerGeneratorAgent
    clone = agent.clone()
    assert type(clone) is fastgen.FastTransformerGeneratorAgent
    assert clone.model is agent.model  # still one shared model


def test_search_impl_parlai_keeps_parlais_search(tiny_model_file: str, tmp_path: Path) -> None:
    from parlai.agents.transformer.transformer import TransformerGeneratorAgent

    plain = load_shared_agent(_settings(tiny_model_file, tmp_path, search_impl="parlai"))
    assert type(plain) is TransformerGeneratorAgent
    assert not fastgen.is_accelerated(plain)


# --- same results ----------------------------------------------------------------------------


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Torch's thread count for a block (the service sets it once, in bot/__main__.py)."""
    import torch

    threads = torch.get_num_threads()
    set_torch_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny matrices: one thread is faster, and immune to a busy machine's scheduling."""
    with torch_threads(1):
        yield


def test_same_results_as_parlai_on_random_cases(agent: Any, one_thread: None) -> None:
    tally = sweep(agent, seed=1234, cases_per_config=25, beams=(1, 5, 10))
    print("\n" + report(tally))
    assert sum(tally.chats.values()) >= 400
    assert len(tally.chats) >= 7  # greedy1, beam1, beam5, beam10, each with/without blocking
    assert not tally.differences, "\n".join(tally.differences[:10])


def test_batch_act_replies_and_beam_texts_match(agent: Any) -> None:
    rng = random.Random(99)
    words = [agent.dict.ind2tok[i] for i in range(4, len(agent.dict))]
    case = random_case(rng, words, beam=5, blocking=True)
    case.texts = [[" ".join(rng.choice(words) for _ in range(n))] for n in (3, 17, 9, 28)]
    with generation(agent, **case.gen):
        agent.fast_search = False
        ref = agent.batch_act(observations(agent, case))
        agent.fast_search = True
        got = agent.batch_act(observations(agent, case))
    assert [r["text"] for r in got] == [r["text"] for r in ref]
    assert [r["beam_texts"] for r in got] == [r["beam_texts"] for r in ref]
    assert all(r["text"] for r in got)


def test_unsupported_settings_fall_back_to_parlai(agent: Any) -> None:
    from parlai.core.message import Message

    with generation(agent, inference="nucleus", topp=0.9, beam_size=2):
        batch = agent.batchify([agent.clone().observe(Message({"text": "hello there"}))])
        assert fastgen.fallback_reason(agent, batch, None) == "inference=nucleus"
        preds, beams = agent._generate(batch, 2, 5)
        assert not isinstance(beams[0], fastgen.BatchedBeams)
        assert preds[0][0].numel() >= 1


# --- BlenderBot-90M architecture --------------------------------------------------------------


def build_blender90m_arch(directory: Path) -> str:
    """A random-weight model with BlenderBot-90M's architecture (8 layers, 512 dims, 16 heads,
    FFN 2048, 54,944-token dictionary), built by tests/support/tinymodel.py like the tiny one."""

    def args(model_file: Path) -> list[str]:
        return parlai_args(
            model_file,
            *lowercase_words(layers=8, width=512, ffn=2048, heads=16),
            "--n-positions", "512",
            "--variant", "xlm",
            "--activation", "gelu",
            "--learn-positional-embeddings", "true",
            *truncation(128, 20),
            "--inference", "beam",
            "--beam-size", "10",
        )  # fmt: skip

    def fill_dictionary(dictionary: Any, dict_file: str) -> None:
        for i in range(54_944 - len(dictionary)):
            dictionary.add_token(f"w{i}")
            dictionary.freq[f"w{i}"] = 10
        dictionary.save(dict_file, sort=False)

    def built(agent: Any) -> None:
        assert len(agent.dict) == 54_944

    return build_model(directory, args, fill_dictionary, built=built)


@pytest.mark.slow
def test_same_results_as_parlai_blender90m_architecture(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    directory = tmp_path_factory.mktemp("blender90m")
    big = load_shared_agent(_settings(build_blender90m_arch(directory), directory))
    assert type(big) is fastgen.FastTransformerGeneratorAgent
    with torch_threads(2):
        tally = sweep(big, seed=90, cases_per_config=6, beams=(1, 5, 10))
    print("\n" + report(tally))
    assert not tally.differences, "\n".join(tally.differences[:10])


# Delayed beam as the service's sampling tests run it: 3 sampled steps from the top 5, then
# a beam of 4.
DELAYED_BEAM = {
    "inference": "delayedbeam",
    "beam_size": 4,
    "topk": 5,
    "beam_delay": 3,
    "beam_min_length": 3,
    "beam_block_ngram": 2,
    "beam_context_block_ngram": 0,
}


def random_texts(agent: Any, seed: int, count: int) -> list[str]:
    """`count` messages of 3 to 20 words drawn from the agent's dictionary."""
    rng = random.Random(seed)
    words = [agent.dict.ind2tok[i] for i in range(4, len(agent.dict))]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 20))) for _ in range(count)]


def test_delayed_beam_draws_what_parlai_draws_for_one_chat(agent: Any, one_thread: None) -> None:
    """Delayed beam samples its first tokens: with one chat and the same seed, the batched
    search draws the same tokens as ParlAI's and finishes with the same hypotheses; across
    seeds the replies differ (the sampling is real)."""
    import torch
    from parlai.core.message import Message

    tops = set()
    for seed, text in enumerate(random_texts(agent, seed=5, count=12)):
        with generation(agent, **DELAYED_BEAM), torch.no_grad():
            batch = agent.batchify([agent.clone().observe(Message({"text": text}))])
            assert fastgen.fallback_reason(agent, batch, None) is None
            agent.fast_search = False
            torch.manual_seed(seed)
            ref, ref_beams = agent._generate(batch, 4, 12)
            assert ref[0][0].numel() > 0
            agent.fast_search = True
            torch.manual_seed(seed)
            got, got_beams = agent._generate(batch, 4, 12)
        assert isinstance(got_beams[0], fastgen.BatchedBeams)
        assert finished_lists(got_beams) == finished_lists(ref_beams), (seed, text)
        tops.add(tuple(got[0][0].tolist()))
    assert len(tops) > 6  # different draws, different replies


def test_delayed_beam_in_a_batch_keeps_each_chat_its_own(agent: Any) -> None:
    """With several chats the draws come in another order than ParlAI's, but each reply is a
    well-formed finished hypothesis of its own chat's search."""
    import torch
    from parlai.core.message import Message

    with generation(agent, inference="delayedbeam", beam_size=3, topk=4, beam_delay=2):
        clones = [agent.clone() for _ in range(5)]
        obs = [
            c.observe(Message({"text": f"hello {w}"})) for c, w in zip(clones, "abcde", strict=True)
        ]
        torch.manual_seed(0)
        replies = agent.batch_act(obs)
    assert all(r["text"] and r["beam_texts"] for r in replies)
    assert all(r["text"] == r["beam_texts"][0][0] for r in replies)
