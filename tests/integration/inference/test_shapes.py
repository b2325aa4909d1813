"""The shape matrix: every zoo BlenderBot's shape (and `-m bart`'s), through every engine, gives
ParlAI's own replies (issue 33, part 2).

For each tiny model of tests/support/shapes.py, each engine (the batched search under the
micro-batcher, SCHEDULER=batch; the continuous scheduler, SCHEDULER=continuous, the default;
QUANTIZE=int8) and each device (cuda only where one is present), one conversation of
`TURNS` turns with a persona, long enough to be truncated at the model's context length, runs
through the service's path (a clone with the pinned persona, `new_clone`, and the decoder the
settings choose, `make_decoder`), in lockstep with ParlAI's own agent
(`create_agent_from_model_file`, stock class, ParlAI's search) fed the same turns.

What the reference shares with the service, deliberately:
- the persona pinning (`PersonaHistory`): ParlAI's own history keeps the *end* of a long
  conversation and drops the persona first (ParlAI issue #2820), which the service exists to
  avoid; comparing searches needs the same model input, so the reference's clone pins it too.
  That the pinned input is what ParlAI builds from the persona lines prepended to the first
  message is checked separately, on the first turn (`test_persona_prefix_is_parlais`);
- what the bot's turn reads back: the reference self-observes exactly the text the service's
  clone remembered for that turn (whatever the service's display cleaning becomes: another
  change may show cased models' replies differently from what the model reads back), so both
  sides see the same next context even where a reply differed (int8).

The replies are compared through the same cleaning (the decoder's own `postprocess` applied to
ParlAI's raw text), and the model inputs token for token. Sampling decoders (top-k, nucleus,
delayed beam's first steps) are compared with the same torch and random seeds before each turn
on both sides: the service's search consumes the generator exactly as ParlAI's does (top-k and
nucleus keep ParlAI's own search; delayed beam samples its first steps the same way), so they
are compared bit for bit too.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.shapes import SHAPES, Shape, build_shape, corpus

TURNS = 6
PERSONA = "My name is Sarah. I love hiking in the mountains. I have two dogs."
SEED = 0

# Engines: the settings each one runs under (everything else at its default).
ENGINES: dict[str, dict[str, Any]] = {
    "batch": {"scheduler": "batch"},  # the batched search under the micro-batcher
    "continuous": {"scheduler": "continuous"},  # the default scheduler
    "int8": {"quantize": "int8"},  # int8 weights (CPU only), the default scheduler
}


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not _cuda(), reason="no CUDA device on this machine")
    ),
]

# The decodings each shape runs: its zoo options ("zoo"), plus the other decoders ParlAI's
# zoo models are used with, each on one shape: (name, settings overrides, opt overrides).
DECODINGS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "zoo": ({}, {}),
    "delayedbeam": ({"inference": "delayedbeam"}, {"beam_delay": 3, "topk": 10}),
    "topk": ({"inference": "topk", "beam_size": 1}, {"topk": 10}),
    "nucleus": ({"inference": "nucleus", "beam_size": 1}, {"topp": 0.9}),
}
CELLS = [
    *((name, "zoo") for name in SHAPES),  # bart's zoo decoding is greedy
    ("blender_400Mdistill", "delayedbeam"),
    ("blender_3B", "topk"),
    ("blender_90M", "nucleus"),
]

# Share of identical replies QUANTIZE=int8 must reach against ParlAI's fp32 agent, per cell.
# Measured (2026-12-03, 6 turns per cell): beam 17-83% (90M 17%, 400M 83%, 1B 33%, 3B 17%),
# bart greedy 100%, delayed beam 33%. Random tiny weights give nearly flat next-token
# distributions (gaps far below int8's rounding), and one flipped token among 24 makes a
# reply differ, so a deterministic decoder is held to at least one identical reply in six;
# bench.quality measures real-text agreement on the shipped model. Sampling decoders draw
# from the rounded distribution: any change of probability moves the draw, so no floor.
INT8_FLOOR = {"zoo": 1 / TURNS, "delayedbeam": 1 / TURNS, "topk": 0.0, "nucleus": 0.0}


@pytest.fixture(scope="session")
def shape_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every shape's tiny model, built once per test run."""
    base = tmp_path_factory.getbasetemp() / "shapes"
    return {name: build_shape(base / name, shape) for name, shape in SHAPES.items()}


def _turns(shape: Shape) -> list[str]:
    """`TURNS` user messages, together well over the model's context."""
    lines = corpus()
    per_turn = max(3, shape.text_truncate // 40)
    rng = random.Random(shape.name)
    start = rng.randrange(len(lines) - TURNS * per_turn)
    return [
        " ".join(lines[start + i * per_turn : start + (i + 1) * per_turn]) for i in range(TURNS)
    ]


def _seed() -> None:
    import torch

    random.seed(SEED)
    torch.manual_seed(SEED)


@dataclass
class Run:
    """One conversation through an engine, beside ParlAI's agent."""

    ours: list[str] = field(default_factory=list)
    theirs: list[str] = field(default_factory=list)
    inputs_equal: list[bool] = field(default_factory=list)
    persona_at_head: list[bool] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    visible: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def agreement(self) -> float:
        same = sum(a == b for a, b in zip(self.ours, self.theirs, strict=True))
        return same / len(self.ours)


def _settings(model_file: str, device: str, engine: str, decoding: str, data: Path) -> Any:
    from bot.config import Settings

    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        bot_model=model_file,
        data_dir=data,
        model_device=device,
        **ENGINES[engine],
        **DECODINGS[decoding][0],
    )


def _reference(model_file: str, settings: Any, extra: dict[str, Any]) -> Any:
    """ParlAI's own agent (stock class and search) with the options the service loads."""
    from parlai.core.agents import create_agent_from_model_file

    from bot.inference.model import generation_overrides

    plain = create_agent_from_model_file(
        model_file,
        {
            "interactive_mode": True,
            "skip_generation": False,
            "no_cuda": settings.model_device == "cpu",
            **generation_overrides(settings),
            **extra,
        },
    )
    plain.model.eval()
    return plain


async def _converse(model_file: str, shape: Shape, engine: str, decoding: str, device: str,
                    data: Path) -> Run:  # fmt: skip
    from parlai.core.message import Message

    from bot.inference.cache import new_clone
    from bot.inference.model import load_shared_agent
    from bot.inference.responder import make_decoder

    settings = _settings(model_file, device, engine, decoding, data)
    extra = DECODINGS[decoding][1]
    agent = load_shared_agent(settings, dict(extra))
    reference = new_clone(_reference(model_file, settings, extra), PERSONA)
    decoder = make_decoder(agent, settings)
    await decoder.start()
    clone = new_clone(agent, PERSONA)
    persona_vec = list(clone.history.persona_vec)
    run = Run()
    started = time.perf_counter()
    try:
        for text in _turns(shape):
            _seed()
            result = await decoder.generate(clone, text)
            # what the service's clone remembers of its reply: the reference reads back the same
            read_back = clone.history.history_raw_strings[-1]
            _seed()
            obs = reference.observe(Message({"text": text, "episode_done": False}))
            reply = reference.batch_act([obs])[0]
            reference.self_observe(Message({"text": read_back, "episode_done": False}))
            run.ours.append(result.text)
            run.theirs.append(decoder.postprocess(str(reply["text"])))
            run.inputs_equal.append(result.model_input == obs["text_vec"].tolist())
            vec = result.model_input
            head = 1 if vec and vec[0] == agent.START_IDX else 0  # BART wraps it in START..END
            run.persona_at_head.append(vec[head : head + len(persona_vec)] == persona_vec)
            run.lengths.append(len(vec))
            run.visible.append(clone.history.visible_turns())
    finally:
        await decoder.close()
    run.seconds = time.perf_counter() - started
    return run


def _cells() -> Iterator[Any]:
    for shape, decoding in CELLS:
        for engine in ENGINES:
            for device in DEVICES:
                dev = device if isinstance(device, str) else device.values[0]
                marks = list(getattr(device, "marks", ()))
                if engine == "int8" and dev == "cuda":
                    continue  # QUANTIZE=int8 is CPU-only (a ConfigError on CUDA)
                if decoding in ("topk", "nucleus") and engine != "continuous":
                    # sampling runs ParlAI's own search under either scheduler: one engine in
                    # `make test`, the rest with -m slow
                    marks.append(pytest.mark.slow)
                yield pytest.param(
                    shape, decoding, engine, dev, marks=marks,
                    id=f"{shape}-{decoding}-{engine}-{dev}",
                )  # fmt: skip


@pytest.mark.parametrize(("shape_name", "decoding", "engine", "device"), list(_cells()))
async def test_shape_matrix(
    shape_models: dict[str, str],
    shape_name: str,
    decoding: str,
    engine: str,
    device: str,
    tmp_path: Path,
) -> None:
    shape = SHAPES[shape_name]
    run = await _converse(shape_models[shape_name], shape, engine, decoding, device, tmp_path)
    print(
        f"\n{shape_name} {decoding} {engine} {device}: {run.agreement:.0%} of {TURNS} replies "
        f"equal ParlAI's; inputs {run.lengths} tokens (context {shape.text_truncate}), "
        f"turns visible {run.visible}; {run.seconds:.1f} s"
    )
    # the conversation outgrew the context: the oldest turns were dropped, the persona kept
    assert max(run.lengths) > shape.text_truncate * 0.8, run.lengths
    assert run.visible[-1] < 2 * TURNS - 1, run.visible
    assert all(run.persona_at_head), run.persona_at_head
    assert all(run.inputs_equal), run.inputs_equal
    if engine == "int8":
        assert run.agreement >= INT8_FLOOR[decoding], (run.ours, run.theirs)
    else:
        assert run.ours == run.theirs


@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_persona_stays_at_the_head_at_the_context_boundary(
    shape_models: dict[str, str], shape_name: str, tmp_path: Path
) -> None:
    """One long message of every length around the context's size: the model input always
    begins with the persona (after BART's START) and never exceeds the context."""
    from parlai.core.message import Message

    from bot.inference.cache import new_clone
    from bot.inference.model import load_shared_agent

    shape = SHAPES[shape_name]
    agent = load_shared_agent(_settings(shape_models[shape_name], "cpu", "batch", "zoo", tmp_path))
    words = " ".join(corpus()[:400]).split()
    for n in range(shape.text_truncate // 2, shape.text_truncate + 8, 3):
        clone = new_clone(agent, PERSONA)
        persona_vec = list(clone.history.persona_vec)
        obs = clone.observe(Message({"text": " ".join(words[:n]), "episode_done": False}))
        vec = obs["text_vec"].tolist()
        head = 1 if vec[0] == agent.START_IDX else 0
        assert vec[head : head + len(persona_vec)] == persona_vec, (n, vec[:8])
        assert len(vec) <= shape.text_truncate, (n, len(vec))


# Byte-level BPE (the 400M/1B/3B family and bart): ParlAI tokenizes a first message
# "your persona: ...  hi" as one string, where the persona's last line and the message meet
# as "." "Ġ" "Ġhi" (400M, delimiter "  "); the service tokenizes the persona apart and joins
# it with the history's delimiter tokens, as ParlAI joins two turns: "." "Ġ" "Ġ" "Ġhi", one
# token more (bart, delimiter "\n": the newline's tokens differ the same way; measured: the
# inputs are otherwise identical). Subword BPE (90M) tokenizes word by word: equal. Not fixed
# here: the pinned persona would have to be re-tokenized with each first turn; see
# docs/benchmarks.md.
_JOINED_APART = pytest.mark.xfail(
    strict=True,
    reason="byte-level BPE: the persona/first-turn boundary is one delimiter token longer "
    "than ParlAI's tokenization of the persona prepended to the first message",
)


@pytest.mark.parametrize(
    "shape_name",
    [
        pytest.param(name, marks=[_JOINED_APART] if shape.tokenizer == "bytelevelbpe" else [])
        for name, shape in SHAPES.items()
    ],
)
def test_persona_prefix_is_parlais(
    shape_models: dict[str, str], shape_name: str, tmp_path: Path
) -> None:
    """Before any truncation, the pinned persona gives the model input ParlAI's own agent
    builds from the persona lines prepended to the first message (joined by the history's
    delimiter, as the service joins them)."""
    from parlai.core.message import Message

    from bot.inference.cache import new_clone
    from bot.inference.model import load_shared_agent
    from bot.persona import persona_lines

    settings = _settings(shape_models[shape_name], "cpu", "batch", "zoo", tmp_path)
    agent = load_shared_agent(settings)
    plain = _reference(shape_models[shape_name], settings, {})
    first = "hi! how are you today?"
    ours = new_clone(agent, PERSONA).observe(Message({"text": first, "episode_done": False}))
    text = plain.history.delimiter.join([*persona_lines(PERSONA), first])
    theirs = plain.observe(Message({"text": text, "episode_done": False}))
    assert ours["text_vec"].tolist() == theirs["text_vec"].tolist()
