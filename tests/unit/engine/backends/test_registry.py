"""The backends' registry and the model side's code named by the seam: every name resolves to
what it names (a typo would only show when a variant starts), and every backend's variant keys
are the variants file's keys."""

from __future__ import annotations

import inspect

import pytest

from bot.config import Settings
from bot.engine import spec
from bot.engine.backends.registry import (
    BACKENDS,
    backend_kind,
    models_load_here,
    parse_variant_keys,
)
from bot.engine.variants import KNOWN_KEYS


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_names_a_factory_that_resolves(name: str) -> None:
    factory = spec.resolve(BACKENDS[name].factory)
    assert inspect.iscoroutinefunction(factory)
    assert list(inspect.signature(factory).parameters)[:3] == ["variant", "settings", "store"]
    assert BACKENDS[name].variant_keys <= KNOWN_KEYS


def test_the_model_side_names_resolve() -> None:
    assert callable(spec.resolve(spec.PROCESS_MAIN))
    assert hasattr(spec.resolve(spec.INLINE_RESPONDER), "start")
    pytest.importorskip("ray")
    assert spec.resolve(spec.RAY_SERVER).__name__ == "ModelServer"


def test_model_backend_picks_its_entry() -> None:
    local = Settings(_env_file=None)  # type: ignore[call-arg]
    ray = Settings(_env_file=None, model_backend="ray")  # type: ignore[call-arg]
    assert backend_kind(local) is BACKENDS["local"] and models_load_here(local)
    assert backend_kind(ray) is BACKENDS["ray"] and not models_load_here(ray)


def test_a_backends_keys_are_validated_with_the_variant() -> None:
    problems: list[str] = []
    fields = parse_variant_keys({"replicas": 2, "num_gpus": 0.5}, "variant 'a'", problems)
    assert fields == {"replicas": 2, "num_cpus": 1.0, "num_gpus": 0.5} and problems == []
    parse_variant_keys({"replicas": 0}, "variant 'a'", problems)
    assert problems == ["variant 'a': replicas must be a whole number from 1 to 64"]
