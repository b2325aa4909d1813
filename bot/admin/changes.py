"""The `admin` subcommands that change data: the experiment's variants (`variants add`,
`weight`, `promote`, `remove`, `allocation`, `reload`, `autopilot`; with `variants list` and
`variants autopilot check`, which only read, among them), a chat's variant (`assign`) and
everything stored for a chat (`forget`).

Each change is recorded in the audit log before and after it runs (bot/admin/recording.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy.ext.asyncio import AsyncEngine

from bot.admin.common import UsageError, dump_json, format_table, settings_of
from bot.db import assignments
from bot.db import variants as stored_variants
from bot.db.engine import make_sessionmaker
from bot.db.models import AssignmentSource
from bot.engine import live
from bot.engine.variants import Experiment
from bot.reports import admin as reports
from bot.reports.admin import AdminError
from bot.reports.variants_json import json_ready

# --- variants add / weight / promote / remove / allocation / reload / list ---------------------

# `admin variants add` options: flag -> the variants file's key (bot.engine.variants).
ADD_OPTIONS = {
    "inference": str,
    "beam_size": int,
    "beam_min_length": int,
    "beam_block_ngram": int,
    "beam_context_block_ngram": int,
    "topk": int,
    "topp": float,
    "temperature": float,
    "beam_delay": int,
    "threads": int,
    # MODEL_BACKEND=ray: the variant's deployment
    "replicas": int,
    "num_cpus": float,
    "num_gpus": float,
}
FOLLOW_NOTE = "every running replica follows within a few seconds"


def _experiment_json(experiment: Experiment) -> dict[str, Any]:
    return {
        "experiment": experiment.name,
        "version": experiment.version,
        "allocation": experiment.allocation,
        "control": experiment.control.name,
        "variants": [
            {
                "name": v.name,
                "model": v.model,
                "weight": v.weight,
                "control": v.control,
                "options": {k: o for k, o in v.options.items() if k != "model"},
            }
            for v in experiment.variants
        ],
    }


def _changed(
    out: TextIO, args: argparse.Namespace, experiment: Experiment, line: str, **extra: Any
) -> int:
    if args.json:
        print(dump_json({**_experiment_json(experiment), **extra}), file=out)
    else:
        print(
            f"{line} (experiment {experiment.name} version {experiment.version}; {FOLLOW_NOTE})",
            file=out,
        )
    return 0


def _model_path(model: str) -> str:
    """A model file as the replicas read it: a directory holding `model.opt` means its
    `model`, and a local path is made absolute (the replicas do not share this cwd)."""
    if model.startswith("zoo:"):
        return model
    path = Path(model).expanduser()
    if path.is_dir() and (path / "model.opt").exists():
        path = path / "model"
    return str(path.resolve()) if Path(str(path) + ".opt").exists() else model


async def _variants_add(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    table: dict[str, object] = {"name": args.name, "model": _model_path(args.model)}
    if args.weight is not None:
        table["weight"] = live.check_weight(args.weight)
    table.update({key: getattr(args, key) for key in ADD_OPTIONS if getattr(args, key) is not None})
    experiment = await live.add(make_sessionmaker(engine), seed, settings_of(args), table)
    variant = experiment.get(args.name)
    assert variant is not None
    return _changed(
        out,
        args,
        experiment,
        f"added {variant.name} ({variant.model}, weight {variant.weight:g}); new chats "
        "may go to it once a replica has loaded it",
    )


async def _variants_weight(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    experiment, old, forced = await live.set_weight(
        make_sessionmaker(engine), seed, settings_of(args), args.name, args.weight, force=args.force
    )
    drained = " (drained: no new chats)" if args.weight == 0 else ""
    return _changed(
        out,
        args,
        experiment,
        f"{args.name}: weight {old:g} -> {args.weight:g}{drained}; existing chats keep "
        "their variant" + (f"; {forced}" if forced else ""),
        previous_weight=old,
        **({"forced": forced} if forced else {}),
    )


async def _variants_promote(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    experiment, previous = await live.promote(
        make_sessionmaker(engine), seed, settings_of(args), args.name
    )
    line = (
        f"{args.name} is the control already"
        if previous == args.name
        else f"{args.name} is the control now (was {previous})"
    )
    return _changed(out, args, experiment, line, previous_control=previous)


async def _variants_remove(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    experiment, forced = await live.remove(
        make_sessionmaker(engine), seed, settings_of(args), args.name, force=args.force
    )
    return _changed(
        out,
        args,
        experiment,
        f"removed {args.name}: no new chats; its worker stops once its turns in flight are "
        "answered, and each of its chats is assigned again at its next turn"
        + (f"; {forced}" if forced else ""),
        **({"forced": forced} if forced else {}),
    )


async def _variants_allocation(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    experiment, previous = await live.set_allocation(
        make_sessionmaker(engine), seed, settings_of(args), args.allocation
    )
    return _changed(
        out,
        args,
        experiment,
        f"allocation {previous} -> {args.allocation} (new chats only)",
        previous_allocation=previous,
    )


async def _variants_reload(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    experiment, changes = await live.reload(make_sessionmaker(engine), seed, settings_of(args))
    what = "; ".join(changes) if changes else "nothing differed"
    return _changed(
        out, args, experiment, f"the database now matches the file ({what})", changes=changes
    )


async def _variants_list(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    experiment = await live.current(make_sessionmaker(engine), seed, settings_of(args))
    if args.all_versions:
        return await _variants_history(engine, args, out, experiment)
    if args.json:
        print(dump_json(_experiment_json(experiment)), file=out)
        return 0
    stored = f"version {experiment.version}" if experiment.version else "not stored yet"
    print(f"experiment {experiment.name} ({stored}), {experiment.allocation} allocation", file=out)
    rows = [
        (
            v.name + (" (control)" if v.control else ""),
            v.weight,
            v.model,
            " ".join(f"{k}={o}" for k, o in sorted(v.options.items()) if k != "model"),
        )
        for v in experiment.variants
    ]
    print(format_table(["variant", "weight", "model", "options"], rows), file=out)
    return 0


async def _variants_history(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, experiment: Experiment
) -> int:
    """Every identity of every variant (docs/variants.md, Variant identities)."""
    async with make_sessionmaker(engine)() as db:
        identities = await stored_variants.history(db, experiment.name)
    if args.json:
        data = [
            {
                **{k: getattr(i, k) for k in ("id", "name", "model", "options", "replies")},
                "created_at": i.created_at.isoformat(),
                "retired_at": None if i.retired_at is None else i.retired_at.isoformat(),
                "votes_up": i.votes_up,
                "votes_down": i.votes_down,
            }
            for i in identities
        ]
        print(dump_json({"experiment": experiment.name, "identities": data}), file=out)
        return 0
    print(
        f"experiment {experiment.name}: every identity of its variants (the report counts the "
        "current ones only)",
        file=out,
    )
    rows = [
        (
            i.id,
            i.name,
            i.model or "BOT_MODEL",
            " ".join(f"{k}={o}" for k, o in sorted(i.options.items())),
            f"{i.created_at:%Y-%m-%d %H:%M}",
            "current" if i.retired_at is None else f"{i.retired_at:%Y-%m-%d %H:%M}",
            f"{i.replies:,}",
            f"{i.votes_up:,}",
            f"{i.votes_down:,}",
        )
        for i in identities
    ]
    columns = ["identity", "variant", "model", "options", "since", "retired", "replies", "up"]
    print(format_table([*columns, "down"], rows), file=out)
    return 0


# `admin variants autopilot on` options: flag -> bot.service.autopilot.Policy field.
AUTOPILOT_OPTIONS = {
    "min_chats": int,
    "min_replies": int,
    "distinct_ratio": float,
    "repetition_margin": float,
    "safety_margin": float,
    "failed_margin": float,
    "latency_ratio": float,
    "interval_s": float,
}


def _autopilot_policy(args: argparse.Namespace) -> Any:
    from bot.service.autopilot import Policy, PolicyError

    given = {k: getattr(args, k) for k in AUTOPILOT_OPTIONS if getattr(args, k) is not None}
    try:
        return Policy(**given)
    except PolicyError as err:
        raise UsageError(str(err)) from err


async def _variants_autopilot(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    sessionmaker = make_sessionmaker(engine)
    if args.state == "check":
        return await _autopilot_dry_run(sessionmaker, args, out, seed)
    given = [f"--{k.replace('_', '-')}" for k in AUTOPILOT_OPTIONS if getattr(args, k) is not None]
    if args.state == "off" and given:
        raise UsageError(f"{', '.join(given)} set(s) the policy: use them with `autopilot on`")
    policy = _autopilot_policy(args).to_json() if args.state == "on" else None
    experiment, previous = await live.set_autopilot(sessionmaker, seed, settings_of(args), policy)
    if policy is None:
        line = "autopilot off" + ("" if previous is not None else " (it was off)")
        line += "; its decisions stay as they are (undo one with `admin variants weight/promote`)"
    else:
        line = "autopilot on: " + ", ".join(f"{k} {v:g}" for k, v in policy.items())
        line += "; every replica checks within a few seconds and then every interval_s"
    return _changed(out, args, experiment, line, autopilot=policy, previous_autopilot=previous)


async def _autopilot_dry_run(
    sessionmaker: Any, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    """What a check would decide now (nothing is changed): each candidate's verdict."""
    from bot.db import autopilot as autopilot_rows
    from bot.service.autopilot import Policy, evaluate

    experiment = await live.current(sessionmaker, seed, settings_of(args))
    async with sessionmaker() as db:
        state = await autopilot_rows.policy(db, experiment.name)
        given = any(getattr(args, k) is not None for k in AUTOPILOT_OPTIONS)
        stored_policy = state[1] if state is not None else None
        policy = (
            Policy.from_json(stored_policy)
            if stored_policy is not None and not given
            else _autopilot_policy(args)
        )
        candidates = [v.name for v in experiment.variants if not v.control and v.weight > 0]
        judged = await evaluate(db, experiment.name, experiment.control.name, candidates, policy)
    if args.json:
        rows = [
            {
                "variant": j.variant,
                "action": j.action,
                "reason": j.reason,
                "breaches": list(j.breaches),
                "lift": asdict(j.lift),
                "guards": {"control": asdict(j.control_guards), "candidate": asdict(j.guards)},
            }
            for j in judged
        ]
        payload = {"experiment": experiment.name, "policy": policy.to_json(), "candidates": rows}
        print(dump_json(json_ready(payload)), file=out)
        return 0
    state_word = "on" if stored_policy is not None else "off"
    print(
        f"autopilot {state_word}; a check now (nothing is changed) against control "
        f"{experiment.control.name}:",
        file=out,
    )
    if not judged:
        print("  no candidate (no variant but the control has a weight above 0)", file=out)
    for j in judged:
        print(f"  {j.variant}: {j.action or 'no decision'}: {j.reason}", file=out)
    return 0


VARIANT_CHANGES: dict[str, Callable[..., Awaitable[int]]] = {
    "add": _variants_add,
    "weight": _variants_weight,
    "promote": _variants_promote,
    "remove": _variants_remove,
    "allocation": _variants_allocation,
    "reload": _variants_reload,
    "list": _variants_list,
    "autopilot": _variants_autopilot,
}


async def run_assign(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, experiment: Experiment
) -> int:
    experiment = await live.current(make_sessionmaker(engine), experiment, settings_of(args))
    if experiment.get(args.variant) is None:
        raise AdminError(
            f"unknown variant {args.variant!r}; the variants of experiment {experiment.name} "
            f"are: {', '.join(experiment.names)}"
        )
    async with make_sessionmaker(engine).begin() as db:
        previous = await assignments.variant_of(db, args.chat_id)
        choice = assignments.Choice(experiment.name, args.variant)
        await assignments.set_variant(db, args.chat_id, choice, AssignmentSource.ADMIN)
    if args.json:
        payload = {
            "chat_id": args.chat_id,
            "experiment": experiment.name,
            "variant": args.variant,
            "previous": previous,
            "source": str(AssignmentSource.ADMIN),
        }
        print(dump_json(payload), file=out)
    elif previous is None:
        print(f"chat {args.chat_id}: assigned to {args.variant} (it had no variant)", file=out)
    elif previous == args.variant:
        print(f"chat {args.chat_id}: already on {args.variant} (now source admin)", file=out)
    else:
        print(
            f"chat {args.chat_id}: moved from {previous} to {args.variant} "
            "(its next reply comes from the new variant)",
            file=out,
        )
    return 0


def _confirm(question: str) -> bool:
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


async def run_forget(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
    sessionmaker = make_sessionmaker(engine)
    footprint = await reports.chat_footprint(sessionmaker, args.chat_id)
    summary = (
        f"{footprint.sessions} session(s), {footprint.messages} message(s), "
        f"{footprint.outbox} outbox row(s), {footprint.inbox} inbox row(s)"
    )
    if footprint.total == 0:
        if args.json:
            print(dump_json({"chat_id": args.chat_id, "deleted": asdict(footprint)}), file=out)
        else:
            print(f"nothing stored for chat {args.chat_id}", file=out)
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise AdminError(
                f"chat {args.chat_id} has {summary}; add --yes to delete them without a prompt"
            )
        if not _confirm(f"Delete {summary} of chat {args.chat_id}? This cannot be undone."):
            print("nothing deleted", file=out)
            return 1
    deleted = await reports.forget_chat(sessionmaker, args.chat_id)
    if args.json:
        print(dump_json({"chat_id": args.chat_id, "deleted": asdict(deleted)}), file=out)
    else:
        print(f"forgot chat {args.chat_id}: deleted {summary}", file=out)
    return 0
