"""Command line: `python -m bot {run,chat,train,model,db,admin,dashboard}`, and the
composition root.

Process-wide things are set up here, once per command, and nowhere else: logging (our one root
handler, with redaction), ParlAI's compatibility shims (bot.inference.compat) and torch's thread
count for the commands that load a model, and the routing of ParlAI's own logger. Importing any
bot module changes none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from bot.config import ConfigError, Settings, describe_invalid_settings, get_settings

DESCRIPTION = """\
A Telegram bot that serves one shared ParlAI dialogue model (BlenderBot or the locally
trained default) to many chats, each with its own persona and persisted history.

Configuration comes from the environment and .env (see .env.example)."""

log = logging.getLogger(__name__)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bot",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from bot.admin.parsers import add_admin_parser

    for add in (
        _add_run_and_chat,
        _add_train,
        _add_db,
        _add_model,
        add_admin_parser,
        _add_dashboard,
    ):
        add(sub)
    return parser


def _add_run_and_chat(sub: Any) -> None:
    """`run` and `chat`."""
    sub.add_parser("run", help="serve Telegram (polling, or webhook when WEBHOOK_URL is set)")

    chat = sub.add_parser("chat", help="talk to the bot in this terminal, on the same pipeline")
    chat.add_argument("--chat-id", type=int, default=1, help="conversation to use (default 1)")
    chat.add_argument(
        "--lang",
        default=None,
        help="your language, as a Telegram client would say it (en, ru, es, de; others: "
        "English); /lang in the chat overrides it",
    )


def _add_train(sub: Any) -> None:
    """`train`: the default model, the shipped one, or a candidate from feedback."""
    train = sub.add_parser("train", help="train the embedded default model on chitchat-dataset")
    train.add_argument(
        "--minutes", type=float, default=None, help="time budget (default TRAIN_MINUTES, max 15)"
    )
    train.add_argument(
        "--if-missing", action="store_true", help="do nothing if the default model exists"
    )
    train.add_argument(
        "--out",
        default=None,
        help="model file to write (default: data dir); with --from-feedback, the directory "
        "of the candidate (DIR/model, DIR/recipe.json)",
    )
    train.add_argument(
        "--from-feedback",
        metavar="EXPORT",
        default=None,
        help="fine-tune --base on the replies users liked in EXPORT (`admin export --format "
        "parlai`), and away from the disliked ones (see --negatives)",
    )
    train.add_argument(
        "--negatives",
        choices=("unlikelihood", "none"),
        default=None,
        help="with --from-feedback: what the disliked replies do: unlikelihood (default: "
        "token-level unlikelihood beside likelihood on the liked ones) or none (left out)",
    )
    train.add_argument(
        "--min-distinct-ratio",
        type=float,
        default=None,
        metavar="R",
        help="with --from-feedback: refuse a candidate whose share of distinct replies to the "
        "guard's prompts is below R times the base's (default 0.9; 0 turns the guard off)",
    )
    train.add_argument(
        "--base",
        metavar="MODEL",
        default=None,
        help="with --from-feedback: the ParlAI generator to continue (default: BOT_MODEL, "
        "the model the service serves)",
    )
    train.add_argument(
        "--ship",
        action="store_true",
        help="reproduce the shipped default model: stage 1, the default recipe for --minutes "
        "(default 100, no 15-minute cap), then stage 2, the persona fine-tune (45 minutes), "
        "installed in models/chitchat/ (or --out) with recipe.json and RECIPE.md",
    )
    train.add_argument(
        "--stage1-only",
        action="store_true",
        help="with --ship: stage 1 alone (the chit-chat recipe, no persona fine-tune): the "
        "shipped model before it learnt to follow its persona",
    )
    train.add_argument(
        "--from-stage1",
        metavar="MODEL",
        default=None,
        help="with --ship: skip stage 1 and run stage 2 alone on MODEL (a stage-1 model, e.g. "
        "a copy of the shipped one)",
    )


def _add_db(sub: Any) -> None:
    """`db upgrade/downgrade/current/readonly-role`."""
    db = sub.add_parser("db", help="database schema (Alembic migrations)")
    db_sub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = db_sub.add_parser("upgrade", help="apply migrations (default: to head)")
    up.add_argument("revision", nargs="?", default="head")
    down = db_sub.add_parser("downgrade", help="revert migrations, e.g. `downgrade base`")
    down.add_argument("revision")
    db_sub.add_parser("current", help="show the current revision")
    ro = db_sub.add_parser(
        "readonly-role",
        help="PostgreSQL: create or update the read-only role for ADMIN_DATABASE_URL",
        description="Create (or update) a LOGIN role that can only read the bot's tables, "
        "for `admin sql` (ADMIN_DATABASE_URL). Run it with a superuser's DATABASE_URL, after "
        "`db upgrade`: it also revokes from PUBLIC, in this database, EXECUTE on the functions "
        "that write large objects, send notifications or WAL messages, or signal sessions "
        "(the tables' owner keeps them). Prints the ADMIN_DATABASE_URL to set.",
    )
    ro.add_argument("name", metavar="NAME", help="role name, e.g. bot_readonly")
    ro.add_argument(
        "--password-env",
        metavar="VAR",
        default=None,
        help="set the role's password from this environment variable (sent as a SCRAM "
        "verifier, never printed)",
    )


def _add_model(sub: Any) -> None:
    """`model check`."""
    model = sub.add_parser("model", help="check a model before serving it")
    model_sub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    check = model_sub.add_parser(
        "check",
        help="load a model as the service would and print its shape, runtime path and parity",
        description="Load a model file (or the directory holding model.opt) or a zoo: path "
        "the way the service does, print its shape (parameters, layers, embedding size, "
        "dictionary, context length, decoding options), which search and scheduler will serve "
        "it and why, a parity probe (a few turns through the service's path against ParlAI's "
        "own agent), milliseconds per reply and resident memory. Exit status 0: served and "
        "replies equal to ParlAI's; 1: they differ; 2: it cannot be served (the reason is "
        "printed). Settings (SEARCH_IMPL, SCHEDULER, INFERENCE, BEAM_*, ...) apply as in run.",
    )
    check.add_argument("path", metavar="PATH", help="a model file, its directory, or a zoo: path")
    check.add_argument(
        "--turns", type=int, default=4, help="turns of the parity probe (1-4, default 4)"
    )


def _add_dashboard(sub: Any) -> None:
    """`dashboard`."""
    dash = sub.add_parser(
        "dashboard",
        help="serve the read-only admin dashboard in a browser (needs DASHBOARD_PASSWORD)",
        description="The admin dashboard: overview, conversations, variants and health, read "
        "through the same read-only connection as `admin sql` (ADMIN_DATABASE_URL on "
        "PostgreSQL). Listens on DASHBOARD_LISTEN:DASHBOARD_PORT (127.0.0.1:8090 by default).",
    )
    dash.add_argument("--listen", default=None, metavar="ADDR", help="default DASHBOARD_LISTEN")
    dash.add_argument("--port", type=int, default=None, help="default DASHBOARD_PORT, else 8090")


def _db(settings: Settings, args: argparse.Namespace) -> int:
    """`db ...`: the schema's migrations, or the read-only role."""
    _set_up_logging(settings, _quiet_level(settings))
    from bot.db import migrate
    from bot.db.engine import ensure_sqlite_dir, safe_url

    url = settings.db_url
    if args.db_command == "readonly-role":
        return _readonly_role(url, args)
    ensure_sqlite_dir(url)
    if args.db_command == "upgrade":
        migrate.upgrade(url, args.revision)
        print(f"database {safe_url(url)} is at {args.revision}")
    elif args.db_command == "downgrade":
        migrate.downgrade(url, args.revision)
        print(f"database {safe_url(url)} is at {args.revision}")
    else:
        migrate.current(url)
    return 0


def _readonly_role(url: str, args: argparse.Namespace) -> int:
    import os

    from bot.admin.pgrole import RoleError, ensure_readonly_role

    password = None
    if args.password_env is not None:
        password = os.environ.get(args.password_env)
        if not password:
            print(f"error: environment variable {args.password_env} is not set", file=sys.stderr)
            return 1
    try:
        role = asyncio.run(ensure_readonly_role(url, args.name, password))
    except RoleError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    done = "created" if role.created else "updated"
    print(f"role {role.name} {done}: it can only read database {role.database}")
    print(
        "set this for `admin sql`"
        + (f" (*** is the password in ${args.password_env})" if password else "")
        + ":"
    )
    print(f"ADMIN_DATABASE_URL={role.admin_url}")
    return 0


# --- process-wide set-up: each command does it once, here, and nothing else does it ---------


def _quiet_level(settings: Settings) -> str:
    """The level of commands whose output is for a person at a terminal: warnings and worse,
    unless LOG_LEVEL asks for something other than the default."""
    return "WARNING" if settings.log_level == "INFO" else settings.log_level


def _chat_level(settings: Settings) -> str:
    """The terminal chat's level: WARNING, so that nothing but the conversation reaches the
    terminal, unless LOG_LEVEL is set (in the environment or .env), which wins."""
    return settings.log_level if "log_level" in settings.model_fields_set else "WARNING"


def _set_up_logging(settings: Settings, level: str) -> None:
    """Our one root handler, with the settings' secrets redacted from every line."""
    from bot.logs import settings_secrets, setup_logging

    setup_logging(level, settings_secrets(settings), settings.log_format)


def _set_up_model_process(settings: Settings, training: bool = False) -> None:
    """Torch's thread count (one unless TORCH_THREADS says; training: every core) and
    ParlAI's shims, before anything imports ParlAI."""
    from bot.inference.model import MODEL_THREADS, set_torch_threads

    set_torch_threads(settings.torch_threads, default=None if training else MODEL_THREADS)
    from bot.inference import compat

    compat.apply()


def _ensure_model(
    settings: Settings, serving_level: str, training_level: str | None = None
) -> None:
    """Train the default model on first start when BOT_MODEL is unset (logging at
    `training_level`, if given), then send ParlAI's log lines through our handler at the level
    the command serves with.

    Runs on the main thread, before any event loop: ParlAI's training loop installs a SIGINT
    handler, which Python allows only there.
    """
    from bot.app import ensure_model
    from bot.inference.model import route_parlai_logging
    from bot.logs import set_level

    if training_level is not None:
        set_level(training_level)
    ensure_model(settings)
    set_level(serving_level)
    route_parlai_logging(serving_level)


def _train(settings: Settings, args: argparse.Namespace) -> int:
    """`train`: the default model, the shipped one, or a candidate from feedback."""
    _set_up_logging(settings, settings.log_level)
    _set_up_model_process(settings, training=True)
    from bot.training import TrainingError, train_cli

    for given, flag in (
        (args.base, "--base"),
        (args.negatives, "--negatives"),
        (args.min_distinct_ratio, "--min-distinct-ratio"),
    ):
        if given is not None and args.from_feedback is None:
            print(f"error: {flag} goes with --from-feedback EXPORT", file=sys.stderr)
            return 2
    if args.stage1_only and args.from_stage1:
        print("error: --stage1-only and --from-stage1 exclude each other", file=sys.stderr)
        return 2
    for given, flag in (
        (args.from_stage1, "--from-stage1"),
        (args.stage1_only, "--stage1-only"),
    ):
        if given and not args.ship:
            print(f"error: {flag} goes with --ship", file=sys.stderr)
            return 2
    if args.from_feedback is not None:
        from bot.training.cli import feedback_cli

        return feedback_cli(settings, args)
    try:
        if args.ship:
            from pathlib import Path

            from bot.config import SHIPPED_MODEL_FILE
            from bot.training.ship import SHIP_MINUTES, ship

            stage1 = Path(args.from_stage1) if args.from_stage1 else None
            ship(
                args.minutes or SHIP_MINUTES,
                Path(args.out) if args.out else SHIPPED_MODEL_FILE,
                from_stage1=stage1,
                persona_stage=not args.stage1_only,
            )
            return 0
        return train_cli(settings, minutes=args.minutes, if_missing=args.if_missing, out=args.out)
    except TrainingError as err:
        log.debug("training failed", exc_info=err)
        print(f"error: {err}", file=sys.stderr)
        return 1


def _run(settings: Settings, args: argparse.Namespace) -> int:
    """`run`: check everything that can be checked offline, then serve Telegram."""
    settings.require_token()  # fail fast, before loading anything heavy
    from bot.dashboard import beside_service, check_settings

    if settings.dashboard_port is not None:  # an unsafe setting stops us before the model
        check_settings(settings, listen=settings.dashboard_listen, required=False)
    _set_up_logging(settings, settings.log_level)
    from bot.app import check_offline, must_train, run_service
    from bot.engine.backends.registry import models_load_here

    # The variants file, personas and privacy notice before anything connects: a
    # mistake exits 2 now, not after getMe (retried while the Bot API is unreachable).
    # A first start that trains the default model checks the models after it: the
    # variants file may name that model.
    models_here = models_load_here(settings)
    train_first = models_here and must_train(settings)
    check_offline(settings, models=not train_first)
    if models_here:
        # MODEL_BACKEND=ray: the Ray replicas load the model, and set themselves up
        # (bot.inference.ray_server); this process never imports torch or ParlAI.
        _set_up_model_process(settings)
        _ensure_model(settings, settings.log_level)
    if train_first:
        check_offline(settings)

    with beside_service(settings):  # DASHBOARD_PORT: the dashboard, in its own thread
        return run_service(settings)


def _chat(settings: Settings, args: argparse.Namespace) -> int:
    """`chat`: the conversation in this terminal, on the service's pipeline."""
    # Warnings and errors only (LOG_LEVEL set says otherwise), in this process and in
    # the model workers; a first start trains at LOG_LEVEL (default INFO).
    level = _chat_level(settings)
    _set_up_logging(settings, level)
    from bot.app import check_offline, must_train

    train_first = must_train(settings)  # as for run: the checks before the database
    check_offline(settings, models=not train_first)
    _set_up_model_process(settings)
    _ensure_model(settings, level, training_level=settings.log_level)
    if train_first:
        check_offline(settings)
    from bot.terminal import run_terminal

    chat_settings = settings.model_copy(update={"log_level": level})
    return asyncio.run(run_terminal(chat_settings, chat_id=args.chat_id, language=args.lang))


def _model(settings: Settings, args: argparse.Namespace) -> int:
    """`model check PATH`."""
    level = _quiet_level(settings)
    _set_up_logging(settings, level)
    _set_up_model_process(settings)
    from bot.inference.check import run_check
    from bot.inference.model import route_parlai_logging

    route_parlai_logging(level)
    return run_check(settings, args.path, args.turns, sys.stdout)


def _dashboard(settings: Settings, args: argparse.Namespace) -> int:
    """`dashboard`: the read-only admin dashboard."""
    from bot.dashboard import run_dashboard

    _set_up_logging(settings, settings.log_level)
    return run_dashboard(settings, listen=args.listen, port=args.port)


def _admin(settings: Settings, args: argparse.Namespace) -> int:
    """`admin ...` (bot/admin/cli.py)."""
    from bot.admin.cli import run_admin

    _set_up_logging(settings, _quiet_level(settings))
    return run_admin(settings, args)


# Each command: set the process up for it, run it, return the exit status.
COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "run": _run,
    "chat": _chat,
    "train": _train,
    "model": _model,
    "db": _db,
    "dashboard": _dashboard,
    "admin": _admin,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point, the composition root: set the process up for the command, run it, and
    return the exit status."""
    args = _build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](get_settings(), args)
    except (ConfigError, ValidationError) as err:
        shown = describe_invalid_settings(err) if isinstance(err, ValidationError) else err
        print(f"error: {shown}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
