"""The variants as the database keeps them: seeded from VARIANTS_FILE, changed by `admin
variants add/weight/promote/remove/allocation/reload`, followed by every running replica.

Why the database and not the file (reloaded on SIGHUP): replicas on several machines share
one database but not one file, and a signal has to reach every one of them; the database is
one truth every replica polls cheaply (`experiments.version`, a primary-key read), each change
is one transaction that validates against the current set (no two controls, never the last
variant removed), and the report and dashboard read the same rows.

The file seeds the experiment the first time a service or an admin command meets its name
(`experiment = ...`; "default" without a file). Later edits of the file change nothing by
themselves: the service logs what differs at start, and `admin variants reload` makes the
database match the file (one change, like the other commands).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.config import Settings
from bot.db import autopilot as autopilot_rows
from bot.db import replicas
from bot.db import variants as stored
from bot.db.variants import StoredExperiment, StoredVariant
from bot.engine.backends.registry import models_load_here
from bot.engine.variants import (
    ALLOCATIONS,
    MAX_WEIGHT,
    Experiment,
    Variant,
    parse_variant,
)
from bot.model_files import unservable_model

log = logging.getLogger(__name__)


class VariantChangeError(ValueError):
    """A change the experiment cannot take (unknown variant, bad value...); the message says
    why, and nothing was changed."""


@dataclass(frozen=True)
class Loaded:
    """An experiment read from the database, and the variants it has that cannot be served
    here (variant -> why: a bad stored value, or a model file this machine does not have)."""

    experiment: Experiment
    problems: dict[str, str]


def to_stored(variant: Variant, position: int = 0) -> StoredVariant:
    """A validated variant as a `variants` row."""
    options = dict(variant.options)
    model = options.pop("model", None)
    return StoredVariant(
        variant.name, model, variant.weight, variant.control, options, position, variant.version
    )


def from_stored(row: StoredExperiment, settings: Settings, *, check_model: bool = False) -> Loaded:
    """The stored experiment as one the router serves, validated as the file is."""
    variants: list[Variant] = []
    problems: dict[str, str] = {}
    for v in row.variants:
        table = {"name": v.name, **v.options, "weight": v.weight, "control": v.control}
        if v.model is not None:
            table["model"] = v.model
        variant, found = parse_variant(table, settings, check_model=check_model)
        if variant is None:
            problems[v.name] = "; ".join(p.split(": ", 1)[-1] for p in found)
            # Still part of the experiment (its chats wait for a replica that can serve it).
            variant = Variant(v.name, v.model or settings.model_file, v.weight, v.control)
        variants.append(replace(variant, version=v.version))
    return Loaded(Experiment(row.name, tuple(variants), row.allocation, row.version), problems)


async def read(
    sessionmaker: async_sessionmaker[AsyncSession], name: str, settings: Settings
) -> Loaded | None:
    """The stored experiment `name`, if it is stored."""
    async with sessionmaker() as db:
        row = await stored.load(db, name)
    return None if row is None else from_stored(row, settings)


async def current(
    sessionmaker: async_sessionmaker[AsyncSession], seed: Experiment, settings: Settings
) -> Experiment:
    """What is served now: the stored experiment named like `seed`, else `seed` itself
    (read-only: nothing is stored; the report and `admin assign` use this)."""
    loaded = await read(sessionmaker, seed.name, settings)
    return seed if loaded is None else loaded.experiment


async def ensure_seeded(
    sessionmaker: async_sessionmaker[AsyncSession],
    seed: Experiment,
    settings: Settings,
    *,
    check_model: bool = False,
) -> Loaded:
    """The stored experiment, storing `seed` (the file's) first if it is not there;
    `check_model`: a model file missing on this machine is one of its problems."""
    async with sessionmaker.begin() as db:
        if await stored.seed(db, seed.name, seed.allocation, _rows(seed)):
            log.info("stored experiment %s from the variants file", seed.name)
        row = await stored.load(db, seed.name)
    assert row is not None
    loaded = from_stored(row, settings, check_model=check_model)
    differs = describe_differences(seed, loaded.experiment)
    if differs:
        log.warning(
            "VARIANTS_FILE differs from the variants in the database, which are served (%s); "
            "`python -m bot admin variants reload` makes the database match the file",
            "; ".join(differs),
        )
    return loaded


def _rows(experiment: Experiment) -> list[StoredVariant]:
    return [to_stored(v, i) for i, v in enumerate(experiment.variants, start=1)]


def describe_differences(file: Experiment, db: Experiment) -> list[str]:
    """What the file has that the database does not, in a few words each."""
    out: list[str] = []
    if file.allocation != db.allocation:
        out.append(f"allocation {file.allocation} in the file, {db.allocation} stored")
    for v in file.variants:
        other = db.get(v.name)
        if other is None:
            out.append(f"{v.name} only in the file")
        elif to_stored(v) != to_stored(other):
            out.append(f"{v.name} differs")
    out += [f"{name} only in the database" for name in db.names if file.get(name) is None]
    return out


# --- changes: one transaction each, validated against the stored set -------------------------


def check_weight(weight: float) -> float:
    """A weight as `admin variants add/weight` take it; VariantChangeError if it is not one."""
    if not math.isfinite(weight) or weight < 0:
        raise VariantChangeError(
            f"weight must be a finite number of 0 or more (0 drains the variant), not {weight:g}"
        )
    if weight > MAX_WEIGHT:
        raise VariantChangeError(
            f"weight must be at most {MAX_WEIGHT:,} (only the ratios of weights count)"
        )
    return float(weight)


async def _begin_change(
    db: AsyncSession, seed: Experiment, settings: Settings
) -> tuple[StoredExperiment, Experiment]:
    await stored.seed(db, seed.name, seed.allocation, _rows(seed))
    await stored.bump(db, seed.name)  # first: the row lock orders concurrent changes
    row = await stored.load(db, seed.name)
    assert row is not None
    return row, from_stored(row, settings).experiment


def _known(experiment: Experiment, name: str) -> Variant:
    variant = experiment.get(name)
    if variant is None:
        raise VariantChangeError(
            f"unknown variant {name!r}; the variants of experiment {experiment.name} are: "
            f"{', '.join(experiment.names)}"
        )
    return variant


async def cannot_serve(
    db: AsyncSession, experiment: Experiment, settings: Settings
) -> dict[str, str]:
    """Variant -> why no replica can serve it now: its model is incomplete or absent where the
    replicas read it (MODEL_BACKEND=local: the same paths as here), or every running replica
    that reports on its variants fails to load it (`replicas.info` "load_errors")."""
    out: dict[str, str] = {}
    if models_load_here(settings):
        for v in experiment.variants:
            if not v.model.startswith("zoo:"):
                why = unservable_model(v.model)
                if why is not None:
                    out[v.name] = why
    reports = [
        r.info["load_errors"]
        for r in await replicas.live_replicas(db, settings.takeover_after_s)
        if isinstance(r.info.get("load_errors"), dict)
    ]
    for v in experiment.variants:
        if v.name not in out and reports and all(v.name in errors for errors in reports):
            out[v.name] = f"no running replica can load it ({reports[0][v.name]})"
    return out


async def _servable_weight(
    db: AsyncSession,
    experiment: Experiment,
    settings: Settings,
    weights: list[tuple[str, float]],
    what: str,
    *,
    force: bool,
) -> str:
    """Refuse a change that leaves new chats no variant with a weight above 0, or (unless
    `force`) only ones no replica can serve; returns what a forced change means ("" if
    nothing)."""
    weighted = [name for name, w in weights if w > 0]
    if not weighted:
        raise VariantChangeError(
            f"{what} would leave every weight at 0, and new chats could go nowhere; "
            "give another variant a weight first"
        )
    broken = await cannot_serve(db, experiment, settings)
    if any(name not in broken for name in weighted):
        return ""
    why = "; ".join(f"{name}: {broken[name]}" for name in weighted)
    fallback = next((v.name for v in experiment.variants if v.control), weighted[0])
    consequence = (
        f"every new chat goes to {fallback} (the control, or the first variant a replica "
        "serves), not by the weights, until one of them can serve"
    )
    if not force:
        raise VariantChangeError(
            f"{what} would leave no variant with a weight above 0 that can serve ({why}): "
            f"{consequence}. Fix the model first, or pass --force to make the change anyway"
        )
    return f"forced: {consequence} ({why})"


async def _finish(db: AsyncSession, name: str, settings: Settings) -> Experiment:
    row = await stored.load(db, name)
    assert row is not None
    return from_stored(row, settings).experiment


async def add(
    sessionmaker: async_sessionmaker[AsyncSession],
    seed: Experiment,
    settings: Settings,
    table: dict[str, object],
) -> Experiment:
    """Add the variant `table` describes (the file's keys); the experiment after the change."""
    if table.get("control"):
        raise VariantChangeError("add a variant first, then `admin variants promote` it")
    async with sessionmaker.begin() as db:
        _, experiment = await _begin_change(db, seed, settings)
        name = str(table.get("name"))
        if experiment.get(name) is not None:
            raise VariantChangeError(
                f"experiment {experiment.name} has a variant {name!r} already; "
                "change its weight with `admin variants weight`, or remove it first"
            )
        variant, problems = parse_variant(table, settings, taken=set(experiment.names))
        if variant is None:
            raise VariantChangeError("; ".join(problems))
        await stored.add(db, experiment.name, to_stored(variant))
        return await _finish(db, experiment.name, settings)


async def set_weight(
    sessionmaker: async_sessionmaker[AsyncSession],
    seed: Experiment,
    settings: Settings,
    name: str,
    weight: float,
    *,
    force: bool = False,
) -> tuple[Experiment, float, str]:
    """A variant's new weight; the experiment after the change, the old weight, and what a
    forced change means ("" when it needed no --force)."""
    weight = check_weight(weight)
    async with sessionmaker.begin() as db:
        _, experiment = await _begin_change(db, seed, settings)
        old = _known(experiment, name).weight
        forced = await _servable_weight(
            db,
            experiment,
            settings,
            [(v.name, weight if v.name == name else v.weight) for v in experiment.variants],
            f"weight {weight:g} for {name}",
            force=force,
        )
        await stored.set_weight(db, experiment.name, name, weight)
        return await _finish(db, experiment.name, settings), old, forced


async def promote(
    sessionmaker: async_sessionmaker[AsyncSession],
    seed: Experiment,
    settings: Settings,
    name: str,
) -> tuple[Experiment, str]:
    """Make `name` the control; the experiment after the change and the previous control."""
    async with sessionmaker.begin() as db:
        _, experiment = await _begin_change(db, seed, settings)
        _known(experiment, name)
        previous = experiment.control.name
        await stored.set_control(db, experiment.name, name)
        return await _finish(db, experiment.name, settings), previous


async def remove(
    sessionmaker: async_sessionmaker[AsyncSession],
    seed: Experiment,
    settings: Settings,
    name: str,
    *,
    force: bool = False,
) -> tuple[Experiment, str]:
    """Take a variant out of the experiment; the experiment after the change, and what a
    forced change means ("" when it needed no --force)."""
    async with sessionmaker.begin() as db:
        _, experiment = await _begin_change(db, seed, settings)
        variant = _known(experiment, name)
        if len(experiment.variants) == 1:
            raise VariantChangeError(f"{name} is the only variant; add another one first")
        if variant.control:
            raise VariantChangeError(
                f"{name} is the control; promote another variant first "
                "(`admin variants promote NAME`)"
            )
        forced = await _servable_weight(
            db,
            experiment,
            settings,
            [(v.name, v.weight) for v in experiment.variants if v.name != name],
            f"removing {name}",
            force=force,
        )
        await stored.remove(db, experiment.name, name)
        return await _finish(db, experiment.name, settings), forced


async def set_allocation(
    sessionmaker: async_sessionmaker[AsyncSession],
    seed: Experiment,
    settings: Settings,
    allocation: str,
) -> tuple[Experiment, str]:
    """How new chats are split; the experiment after the change and the previous allocation."""
    if allocation not in ALLOCATIONS:
        raise VariantChangeError(f"allocation must be one of {', '.join(ALLOCATIONS)}")
    async with sessionmaker.begin() as db:
        _, experiment = await _begin_change(db, seed, settings)
        previous = experiment.allocation
        await stored.set_allocation(db, experiment.name, allocation)
        return await _finish(db, experiment.name, settings), previous


async def reload(
    sessionmaker: async_sessionmaker[AsyncSession], seed: Experiment, settings: Settings
) -> tuple[Experiment, list[str]]:
    """Make the stored experiment what the file (`seed`, validated) says: variants added,
    changed and removed, the control and the allocation; returns it and what changed."""
    async with sessionmaker.begin() as db:
        rows, before = await _begin_change(db, seed, settings)
        was = {v.name: v for v in rows.variants}
        changes = describe_differences(seed, before)
        await stored.set_allocation(db, seed.name, seed.allocation)
        for name in before.names:
            if seed.get(name) is None:
                await stored.remove(db, seed.name, name)
        for position, variant in enumerate(seed.variants, start=1):
            row = to_stored(variant, position)
            if before.get(variant.name) is None:
                await stored.add(db, seed.name, row, position=position)
            else:
                await stored.replace(db, seed.name, row, was[variant.name])
        await stored.set_control(db, seed.name, seed.control.name)
        return await _finish(db, seed.name, settings), changes


async def set_autopilot(
    sessionmaker: async_sessionmaker[AsyncSession],
    seed: Experiment,
    settings: Settings,
    policy: dict[str, Any] | None,
) -> tuple[Experiment, dict[str, Any] | None]:
    """Turn the autopilot on with `policy` (bot.service.autopilot.Policy as JSON) or off
    (None); the experiment after the change and the previous policy. Like every change it
    moves the version on, so a check that read the figures before it decides nothing."""
    async with sessionmaker.begin() as db:
        _, experiment = await _begin_change(db, seed, settings)
        state = await autopilot_rows.policy(db, experiment.name)
        previous = state[1] if state is not None else None
        await autopilot_rows.set_policy(db, experiment.name, policy)
        return await _finish(db, experiment.name, settings), previous
