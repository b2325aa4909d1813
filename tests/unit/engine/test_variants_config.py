"""The variants file: what it accepts, and one clear line per problem, naming the variant."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import ConfigError, Settings
from bot.engine.assign import bucket, choose
from bot.engine.variants import load_experiment


def _settings(tmp_path: Path, body: str | None, **kw: object) -> Settings:
    path = None
    if body is not None:
        path = tmp_path / "variants.toml"
        path.write_text(body)
    return Settings(_env_file=None, variants_file=path, data_dir=tmp_path, **kw)  # type: ignore[call-arg]


def _refusals(tmp_path: Path, body: str, **kw: object) -> list[str]:
    """The lines of the ConfigError that `body` raises, one a problem (its heading dropped)."""
    with pytest.raises(ConfigError) as caught:
        load_experiment(_settings(tmp_path, body, **kw))
    return [line.strip() for line in str(caught.value).splitlines()[1:]]


@pytest.fixture
def model(tmp_path: Path) -> str:
    """A complete model as far as its files go: weights, dictionary, options."""
    for name, content in (("m", "w"), ("m.dict", "d"), ("m.opt", "{}")):
        (tmp_path / name).write_text(content)
    return str(tmp_path / "m")


def test_no_file_is_one_variant_from_bot_model(tmp_path: Path) -> None:
    exp = load_experiment(_settings(tmp_path, None, bot_model="zoo:blender/blender_90M/model"))
    assert [(v.name, v.model, v.weight, v.control) for v in exp.variants] == [
        ("default", "zoo:blender/blender_90M/model", 1.0, True)
    ]


def test_a_valid_file(tmp_path: Path, model: str) -> None:
    exp = load_experiment(
        _settings(
            tmp_path,
            f"""
experiment = "decoding-1"
[[variants]]
name = "beam"
model = "{model}"
control = true
beam_size = 5
threads = 1
[[variants]]
name = "nucleus"
model = "{model}"
weight = 0.5
inference = "nucleus"
topp = 0.9
temperature = 0.7
[[variants]]
name = "greedy"
model = "zoo:blender/blender_90M/model"
weight = 0
inference = "greedy"
""",
            worker_threads=2,
        )
    )
    assert exp.name == "decoding-1"
    assert exp.control.name == "beam"
    beam, nucleus, greedy = exp.variants
    assert beam.threads == 1 and nucleus.threads == 2  # WORKER_THREADS unless the variant says
    assert nucleus.parlai_overrides() == {"topp": 0.9, "temperature": 0.7}
    assert nucleus.settings(_settings(tmp_path, None)).inference == "nucleus"
    assert greedy.generation == {"inference": "greedy", "beam_size": 1}
    assert exp.weights == {"beam": 1.0, "nucleus": 0.5, "greedy": 0.0}


def test_every_problem_is_one_line_naming_its_variant(tmp_path: Path, model: str) -> None:
    body = f"""
colour = "blue"
[[variants]]
name = "a"
model = "{model}"
beam_sise = 3
[[variants]]
name = "a"
model = "{model}"
[[variants]]
name = "b"
model = "{tmp_path}/missing"
weight = -1
[[variants]]
name = "c"
model = "{model}"
inference = "magic"
topp = 1.5
"""
    assert _refusals(tmp_path, body) == [
        "unknown top-level key 'colour' (expected experiment, allocation, variants)",
        "variant 'a': unknown key 'beam_sise'",
        "variant 'a': duplicate name",
        "variant 'b': weight must not be negative (0 drains the variant)",
        f"variant 'b': no model at {tmp_path}/missing (no {tmp_path}/missing.opt); train one "
        "with `python -m bot train --out PATH`, or use a zoo: path",
        "variant 'c': inference must be one of beam, greedy, topk, nucleus, delayedbeam",
        "variant 'c': topp must be at most 1",
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[variants]]\nname = "a"\nweight = 0\n', "every weight is 0"),
        ('[[variants]]\nname = "a"\n[[variants]]\nname = "b"\n', "no variant is the control"),
        (
            '[[variants]]\nname = "a"\ncontrol = true\n[[variants]]\nname = "b"\ncontrol = true\n',
            r"only one variant can be the control, not a, b",
        ),
        ("experiment = 3\n", "no variants"),
        ("[[variants]\n", r"is not valid TOML"),
        ('[[variants]]\nname = "a b"\n', "variant #1: name must be"),
    ],
)
def test_refused_files(tmp_path: Path, body: str, message: str) -> None:
    settings = _settings(tmp_path, body, bot_model="zoo:x/model")
    with pytest.raises(ConfigError, match=message):
        load_experiment(settings)


def test_every_number_is_bounded(tmp_path: Path) -> None:
    """Regression: `threads = 100000` passed, and its worker exhausted the host's threads."""
    body = """
[[variants]]
name = "a"
control = true
threads = 100000
weight = 1e300
beam_size = 100000
beam_min_length = 100000
beam_block_ngram = 1000
beam_context_block_ngram = 1000
topk = 100000
beam_delay = 100000
temperature = 1e9
[[variants]]
name = "b"
threads = 0
topp = inf
"""
    assert _refusals(tmp_path, body, bot_model="zoo:x/model") == [
        "variant 'a': weight must be at most 1,000,000 (only the ratios of weights count)",
        "variant 'a': beam_size must be a whole number from 1 to 100",
        "variant 'a': beam_min_length must be a whole number from 0 to 1000",
        "variant 'a': beam_block_ngram must be a whole number from -1 to 100",
        "variant 'a': beam_context_block_ngram must be a whole number from -1 to 100",
        "variant 'a': topk must be a whole number from 1 to 1000",
        "variant 'a': beam_delay must be a whole number from 1 to 1000",
        "variant 'a': threads must be a whole number from 1 to 256",
        "variant 'a': temperature must be at most 100",
        "variant 'b': threads must be a whole number from 1 to 256",
        "variant 'b': topp must be at most 1",
    ]
    # The bounds themselves are accepted.
    ok = '[[variants]]\nname = "a"\nthreads = 256\nweight = 1000000\nbeam_size = 100\n'
    assert load_experiment(_settings(tmp_path, ok, bot_model="zoo:x/model")).names == ["a"]


def test_a_ray_deployment_is_sized_per_variant_and_bounded(tmp_path: Path) -> None:
    """replicas, num_cpus, num_gpus (MODEL_BACKEND=ray): defaults 1, 1, 0; fractions of a core
    or a GPU are Ray's; every value bounded, one line each; a change of them restarts it."""
    ok = """
[[variants]]
name = "a"
control = true
[[variants]]
name = "b"
replicas = 3
num_cpus = 0.5
num_gpus = 0.25
"""
    a, b = load_experiment(_settings(tmp_path, ok, bot_model="zoo:x/model")).variants
    assert (a.replicas, a.num_cpus, a.num_gpus) == (1, 1.0, 0.0)
    assert (b.replicas, b.num_cpus, b.num_gpus) == (3, 0.5, 0.25)
    assert not a.same_model(b) and a.same_model(a)
    bad = """
[[variants]]
name = "a"
control = true
replicas = 0
num_cpus = 1000
num_gpus = -1
[[variants]]
name = "b"
replicas = 1.5
num_cpus = "two"
[[variants]]
name = "c"
num_cpus = 0
"""
    assert _refusals(tmp_path, bad, bot_model="zoo:x/model") == [
        "variant 'a': replicas must be a whole number from 1 to 64",
        "variant 'a': num_cpus must be a number from 0 to 256",
        "variant 'a': num_gpus must be a number from 0 to 64",
        "variant 'b': replicas must be a whole number from 1 to 64",
        "variant 'b': num_cpus must be a number from 0 to 256",
        "variant 'c': num_cpus = 0 needs num_gpus above 0 (a replica needs a core)",
    ]


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, variants_file=tmp_path / "nope.toml")  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"nope\.toml does not exist"):
        load_experiment(settings)


def test_assignment_is_deterministic_weighted_and_drains_at_weight_0() -> None:
    weights = {"a": 3.0, "b": 1.0}
    picks = [choose("exp", chat, weights) for chat in range(4000)]
    assert picks == [choose("exp", chat, weights) for chat in range(4000)]  # same every time
    share = picks.count("a") / len(picks)
    assert 0.72 < share < 0.78  # 3:1, within sampling noise of 4,000 chats (sd ~0.007)
    assert {choose("exp", chat, {"a": 1.0, "b": 0.0}) for chat in range(500)} == {"a"}
    # Another experiment name reshuffles chats (independent experiments).
    other = [choose("exp2", chat, weights) for chat in range(4000)]
    assert 0.5 < sum(x == y for x, y in zip(picks, other, strict=True)) / 4000 < 0.7
    assert 0.0 <= bucket("exp", 1) < 1.0
    with pytest.raises(ValueError, match="no variant"):
        choose("exp", 1, {"a": 0.0})


def test_allocation_is_weights_by_default_thompson_on_request_and_nothing_else(
    tmp_path: Path, tiny_model_file: str
) -> None:
    from bot.engine.variants import parse_experiment

    settings = Settings(_env_file=None, data_dir=tmp_path)  # type: ignore[call-arg]
    table = {"name": "a", "model": tiny_model_file}
    assert parse_experiment({"variants": [table]}, settings, source="t").allocation == "weights"
    thompson = {"allocation": "thompson", "variants": [table]}
    assert parse_experiment(thompson, settings, source="t").allocation == "thompson"
    with pytest.raises(ConfigError, match="allocation must be one of weights, thompson"):
        parse_experiment({"allocation": "ucb", "variants": [table]}, settings, source="t")


def test_variant_thread_count_is_not_checked_against_the_admins_machine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32 item 6: `threads` was bounded by the cores of the machine that read it, so a
    variant stored from a 16-core admin host was refused by every 2-core replica (and one with
    more threads than this host's cores could not even be added here). Now a fixed bound at
    store time, and a clamp to the local cores, with a warning, where the model loads."""
    import torch

    from bot.inference import model

    cores = 2  # a small replica, whatever runs the test
    monkeypatch.setattr(model, "usable_cores", lambda: cores)
    many = 8  # stored from a bigger admin host
    body = f'[[variants]]\nname = "big"\nthreads = {many}\n'
    [variant] = load_experiment(_settings(tmp_path, body, bot_model="zoo:x/model")).variants
    assert variant.threads == many
    before = torch.get_num_threads()
    try:
        with caplog.at_level("WARNING", logger="bot.inference.model"):
            model.set_torch_threads(many)
        assert torch.get_num_threads() == cores
        assert f"{many} torch threads asked for, but this machine has {cores} cores" in caplog.text
    finally:
        torch.set_num_threads(before)
