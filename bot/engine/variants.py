"""The variants file (VARIANTS_FILE, TOML): named model variants, their weights and the control.

    experiment = "decoding-2026-12"     # optional; part of the assignment hash
    allocation = "weights"              # optional; or "thompson" (a bandit on the 👍 rates)

    [[variants]]
    name = "beam"
    model = "data/models/chitchat/model" # a model file or a zoo: path; default BOT_MODEL
    weight = 1
    control = true
    beam_size = 5

    [[variants]]
    name = "nucleus"
    weight = 1
    inference = "nucleus"
    topp = 0.9

Without a file the service runs one variant, "default", from BOT_MODEL and the generation
settings (INFERENCE, BEAM_SIZE, ...): a single model is simply one variant.

The file seeds the database the first time the experiment is met (bot.engine.live); from
then on the `variants` table is what the replicas serve, changed by `admin variants add`,
`weight`, `promote` and `remove`.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.config import ConfigError, Settings
from bot.engine.backends.registry import models_load_here, parse_variant_keys, variant_keys
from bot.model_files import unservable_model

DEFAULT_EXPERIMENT = "default"
DEFAULT_VARIANT = "default"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
INFERENCE = ("beam", "greedy", "topk", "nucleus", "delayedbeam")
ALLOCATIONS = ("weights", "thompson")

MAX_THREADS = 256  # torch threads of one variant's worker, on any host
# Every number of the file is bounded: a value far out (threads = 100000) is refused at start
# instead of exhausting the host (each bound is far beyond any useful value).
# Whole-number keys: key -> (lowest, highest).
_INT_KEYS = {
    "beam_size": (1, 100),
    "beam_min_length": (0, 1000),
    "beam_block_ngram": (-1, 100),
    "beam_context_block_ngram": (-1, 100),
    "topk": (1, 1000),
    "beam_delay": (1, 1000),
    # A fixed bound, not this machine's cores: the admin's host is not the replicas' host. A
    # replica with fewer cores uses them all and says so (bot.inference.model.set_torch_threads).
    "threads": (1, MAX_THREADS),
}
# Number keys: key -> (values must be above, and at most).
_FLOAT_KEYS = {"temperature": (0.0, 100.0), "topp": (0.0, 1.0)}
# Weights are shares of new chats: only their ratios matter.
MAX_WEIGHT = 1_000_000
# With the backends' own keys (Ray's replicas, CPUs and GPUs: bot.engine.backends.registry).
KNOWN_KEYS = frozenset(
    {"name", "model", "weight", "control", "inference", *_INT_KEYS, *_FLOAT_KEYS, *variant_keys()}
)
# Generation options ParlAI takes under these names, beside the Settings-level ones.
PARLAI_ONLY = ("temperature", "topp", "topk", "beam_delay")


@dataclass(frozen=True)
class Variant:
    """One named model variant."""

    name: str
    model: str
    weight: float = 1.0
    control: bool = False
    # Torch threads for this variant's worker (None: WORKER_THREADS).
    threads: int | None = None
    # Generation options over the model file's own (ParlAI option names).
    generation: dict[str, Any] = field(default_factory=dict)
    # The variant's other keys as written in the file or `admin variants add` (model and
    # threads only where given, unresolved): what the database stores.
    options: dict[str, Any] = field(default_factory=dict, compare=False)
    # MODEL_BACKEND=ray: its deployment's replicas, and the CPUs and GPUs of each
    # (bot.engine.backends.ray.sizing).
    replicas: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    # Its identity in the database (variants.version_id; 0: from the file, not stored yet):
    # what its replies are recorded with (bot.db.variants.current_identity).
    version: int = field(default=0, compare=False)

    def same_model(self, other: Variant) -> bool:
        """Whether both load the same model the same way, on the same replicas (weight and
        control aside)."""
        return self.loaded() == other.loaded()

    def loaded(self) -> tuple[Any, ...]:
        """What its model is loaded with and served on (the model, threads, generation options,
        replicas and their CPUs and GPUs)."""
        return (
            self.model,
            self.threads,
            self.generation,
            self.replicas,
            self.num_cpus,
            self.num_gpus,
        )

    def settings(self, base: Settings) -> Settings:
        """The settings its worker loads the model with."""
        own = {k: v for k, v in self.generation.items() if k not in PARLAI_ONLY}
        return base.model_copy(update={"bot_model": self.model, **own})

    def parlai_overrides(self) -> dict[str, Any]:
        """Generation options that have no Settings field, passed straight to ParlAI."""
        return {k: v for k, v in self.generation.items() if k in PARLAI_ONLY}


@dataclass(frozen=True)
class Experiment:
    """The variants served side by side."""

    name: str
    variants: tuple[Variant, ...]
    # How new chats are split: "weights" (the weighted hash) or "thompson" (bot.engine.bandit).
    allocation: str = "weights"
    # experiments.version when read from the database (0: from the file, not stored yet).
    version: int = 0

    @property
    def control(self) -> Variant:
        """The variant the others are compared with."""
        return next(v for v in self.variants if v.control)

    @property
    def names(self) -> list[str]:
        """Variant names in file order."""
        return [v.name for v in self.variants]

    def get(self, name: str) -> Variant | None:
        """The variant called `name`, if there is one."""
        return next((v for v in self.variants if v.name == name), None)

    @property
    def weights(self) -> dict[str, float]:
        """Name -> weight."""
        return {v.name: v.weight for v in self.variants}


def single_variant(settings: Settings) -> Experiment:
    """BOT_MODEL as the only variant."""
    return Experiment(
        DEFAULT_EXPERIMENT,
        (Variant(DEFAULT_VARIANT, settings.model_file, 1.0, True, settings.worker_threads),),
    )


def load_experiment(settings: Settings, *, check_model: bool | None = None) -> Experiment:
    """VARIANTS_FILE validated, or the single default variant when it is unset.

    Every problem is reported, one line each, naming the variant; raises ConfigError.
    `check_model`: whether every local model must be complete here (bot.model_files); by
    default where this process loads the models (MODEL_BACKEND=local), not on a front-end
    whose models load on a Ray cluster. The admin commands and the dashboard pass False: the
    file only seeds the experiment for them, and a broken model must not lock out the
    commands that take it out of service.
    """
    if check_model is None:
        check_model = models_load_here(settings)
    if settings.variants_file is None:
        return single_variant(settings)
    path = Path(settings.variants_file)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"VARIANTS_FILE {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"VARIANTS_FILE {path} cannot be read: {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"VARIANTS_FILE {path} is not valid TOML: {err}") from None
    return parse_experiment(data, settings, source=str(path), check_model=check_model)


def parse_experiment(
    data: dict[str, Any], settings: Settings, *, source: str, check_model: bool = True
) -> Experiment:
    """Validate the parsed file; raises ConfigError listing every problem."""
    problems: list[str] = []
    unknown_top = sorted(set(data) - {"experiment", "allocation", "variants"})
    problems += [
        f"unknown top-level key {k!r} (expected experiment, allocation, variants)"
        for k in unknown_top
    ]
    allocation = data.get("allocation", "weights")
    if allocation not in ALLOCATIONS:
        problems.append(f"allocation must be one of {', '.join(ALLOCATIONS)}")
        allocation = "weights"
    experiment = data.get("experiment", DEFAULT_EXPERIMENT)
    if not isinstance(experiment, str) or not NAME_RE.fullmatch(experiment):
        problems.append("experiment must be a name of letters, digits, _ . - (up to 64)")
        experiment = DEFAULT_EXPERIMENT
    raw = data.get("variants")
    if not isinstance(raw, list) or not raw or not all(isinstance(v, dict) for v in raw):
        problems.append("no variants: add at least one [[variants]] table with a name")
        raw = []
    variants: list[Variant] = []
    seen: set[str] = set()
    for index, table in enumerate(raw, start=1):
        variant = _parse_variant(table, index, settings, seen, problems, check_model=check_model)
        if variant is not None:
            variants.append(variant)
    if variants and not problems:
        if sum(v.weight for v in variants) <= 0:
            problems.append("every weight is 0: at least one variant needs a weight above 0")
        controls = [v.name for v in variants if v.control]
        if len(variants) == 1 and not controls:
            variants[0] = Variant(**{**variants[0].__dict__, "control": True})
        elif not controls:
            problems.append("no variant is the control: set control = true on one of them")
        elif len(controls) > 1:
            problems.append(f"only one variant can be the control, not {', '.join(controls)}")
    if problems:
        raise ConfigError(f"VARIANTS_FILE {source}:\n  " + "\n  ".join(problems))
    return Experiment(experiment, tuple(variants), str(allocation))


def parse_variant(
    table: dict[str, Any],
    settings: Settings,
    *,
    taken: set[str] | frozenset[str] = frozenset(),
    check_model: bool = True,
) -> tuple[Variant | None, list[str]]:
    """One variant's table (as in the file) validated: the variant, or None and the problems.

    `taken`: names already in use. `check_model=False` skips the model file check (a replica
    reading the database reports a missing file as that variant's load failure instead).
    """
    problems: list[str] = []
    variant = _parse_variant(table, 1, settings, set(taken), problems, check_model=check_model)
    return variant, problems


def _parse_variant(
    table: dict[str, Any],
    index: int,
    settings: Settings,
    seen: set[str],
    problems: list[str],
    *,
    check_model: bool = True,
) -> Variant | None:
    name = table.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        problems.append(
            f"variant #{index}: name must be letters, digits, _ . - (up to 64 characters)"
        )
        return None
    label = f"variant {name!r}"
    before = len(problems)
    if name in seen:
        problems.append(f"{label}: duplicate name")
    seen.add(name)
    problems += [f"{label}: unknown key {k!r}" for k in sorted(set(table) - KNOWN_KEYS)]
    weight = _weight(table, label, problems)
    control = table.get("control", False)
    if not isinstance(control, bool):
        problems.append(f"{label}: control must be true or false")
    model = _model(table, label, settings, problems, check_model=check_model)
    generation, threads = _generation(table, label, problems)
    sizing = parse_variant_keys(table, label, problems)
    # ParlAI's greedy search refuses a beam size above 1, and the model file may carry one.
    if generation.get("inference") == "greedy" and generation.setdefault("beam_size", 1) != 1:
        problems.append(f"{label}: greedy decoding needs beam_size = 1")
    if len(problems) > before:
        return None
    options = {k: v for k, v in table.items() if k not in ("name", "weight", "control")}
    return Variant(
        name,
        model,
        float(weight),
        bool(control),
        threads if threads is not None else settings.worker_threads,
        generation,
        options,
        **sizing,
    )


def _weight(table: dict[str, Any], label: str, problems: list[str]) -> float:
    weight = table.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
        problems.append(f"{label}: weight must be a number")
        weight = 0
    elif weight < 0:
        problems.append(f"{label}: weight must not be negative (0 drains the variant)")
    elif weight > MAX_WEIGHT:
        problems.append(
            f"{label}: weight must be at most {MAX_WEIGHT:,} (only the ratios of weights count)"
        )
    return float(weight)


def _model(
    table: dict[str, Any], label: str, settings: Settings, problems: list[str], *, check_model: bool
) -> str:
    model = table.get("model", settings.model_file)
    if not isinstance(model, str) or not model.strip():
        problems.append(f"{label}: model must be a model file or a zoo: path")
        return ""
    if check_model and not model.startswith("zoo:"):
        if not Path(model + ".opt").exists():
            problems.append(
                f"{label}: no model at {model} (no {model}.opt); train one with "
                "`python -m bot train --out PATH`, or use a zoo: path"
            )
        elif (incomplete := unservable_model(model)) is not None:
            problems.append(f"{label}: {incomplete}")
    return model


def _generation(
    table: dict[str, Any], label: str, problems: list[str]
) -> tuple[dict[str, Any], int | None]:
    """The variant's generation options (ParlAI names) and its threads."""
    generation: dict[str, Any] = {}
    inference = table.get("inference")
    if inference is not None:
        if inference not in INFERENCE:
            problems.append(f"{label}: inference must be one of {', '.join(INFERENCE)}")
        generation["inference"] = inference
    threads = None
    for key, (low, high) in _INT_KEYS.items():
        if key not in table:
            continue
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            problems.append(f"{label}: {key} must be a whole number from {low} to {high}")
        elif key == "threads":
            threads = value
        else:
            generation[key] = value
    for key, (above, most) in _FLOAT_KEYS.items():
        if key not in table:
            continue
        number = table[key]
        if isinstance(number, bool) or not isinstance(number, int | float) or not number > above:
            problems.append(f"{label}: {key} must be a number above {above:g}")
        elif number > most:
            problems.append(f"{label}: {key} must be at most {most:g}")
        else:
            generation[key] = float(number)
    return generation, threads
