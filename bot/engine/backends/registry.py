"""The backends a variant's model can run on, by MODEL_BACKEND: the one registry.

Each entry names its factory by qualified name, `make_backend(variant, settings, store,
secrets) -> Backend` (bot.engine.spec.Backend; `settings` the variant's own), resolved when a
variant starts: reading the registry (the variants' validation, the admin commands) imports no
backend's code. A backend's per-variant keys (Ray's replicas, CPUs and GPUs) are its own,
validated by its `parse_variant`, wherever a variant is read (bot.engine.variants).

Adding a backend: a module with its `make_backend` (and, if it has keys of its own in a
variant's table, a small module that parses them), and its line below (MODEL_BACKEND's accepted
values are listed in bot/config.py too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.config import Settings
from bot.engine.backends.ray import sizing as ray_sizing

# A backend's validation of its keys in one variant's table: (table, label, problems) -> the
# variant's fields they set (each problem appended, named by `label`).
ParseKeys = Callable[[dict[str, Any], str, list[str]], dict[str, Any]]


@dataclass(frozen=True)
class BackendKind:
    """One MODEL_BACKEND value."""

    factory: str  # make_backend's qualified name (bot.engine.spec.resolve)
    # Whether the models load on this machine (their files are checked here before they
    # start), not on a cluster's nodes.
    models_here: bool
    variant_keys: frozenset[str] = frozenset()  # its keys in a variant's table
    parse_variant: ParseKeys | None = None


BACKENDS: dict[str, BackendKind] = {
    "local": BackendKind("bot.engine.backends.local.make_backend", models_here=True),
    "ray": BackendKind(
        "bot.engine.backends.ray.backend.make_backend",
        models_here=False,
        variant_keys=frozenset(ray_sizing.KEYS),
        parse_variant=ray_sizing.parse,
    ),
}


def backend_kind(settings: Settings) -> BackendKind:
    """MODEL_BACKEND's entry."""
    return BACKENDS[settings.model_backend]


def models_load_here(settings: Settings) -> bool:
    """Whether this process's backend loads the models on this machine (MODEL_BACKEND=local),
    so that a model file must exist here."""
    return backend_kind(settings).models_here


def variant_keys() -> frozenset[str]:
    """Every backend's own keys in a variant's table."""
    return frozenset().union(*(kind.variant_keys for kind in BACKENDS.values()))


def parse_variant_keys(table: dict[str, Any], label: str, problems: list[str]) -> dict[str, Any]:
    """The variant's fields every backend's keys set (validated; problems appended)."""
    fields: dict[str, Any] = {}
    for kind in BACKENDS.values():
        if kind.parse_variant is not None:
            fields.update(kind.parse_variant(table, label, problems))
    return fields
