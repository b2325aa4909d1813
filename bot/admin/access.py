"""`python -m bot admin access`: who may talk to the bot, and each user's own quota.

The rules and quotas are rows (bot/db/access.py) that every replica reads, so a change is
followed within a few seconds (bot/service/access.py, RULES_TTL_S) without a restart.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, TextIO

from sqlalchemy.ext.asyncio import AsyncEngine

from bot.db import access
from bot.db.engine import make_sessionmaker
from bot.service.access import settings_subjects

# What `allow`/`deny` take: a user id (123, user:123), a chat id (chat:-100123) or an @name.
SUBJECT_RE = re.compile(r"(?:user:)?(-?[0-9]{1,19})|chat:(-?[0-9]{1,19})|@([A-Za-z0-9_]{1,32})")
MAX_QUOTA = 1_000_000_000


def subject(value: str) -> str:
    """An `admin access` subject as the rules store it: user:<id>, chat:<id> or @name."""
    match = SUBJECT_RE.fullmatch(value.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{value!r:.40} is not a user id (123456789 or user:123456789), a chat id "
            "(chat:-1001234567890) or an @username"
        )
    user, chat, name = match.groups()
    if user is not None:
        return f"user:{int(user)}"
    if chat is not None:
        return f"chat:{int(chat)}"
    return f"@{name.lower()}"


def _user(value: str) -> int:
    match = re.fullmatch(r"(?:user:)?(-?[0-9]{1,19})", value.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{value!r:.40} is not a numeric Telegram user id")
    return int(match.group(1))


def _quota(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r:.40}") from None
    if not 1 <= n <= MAX_QUOTA:
        raise argparse.ArgumentTypeError(
            f"a quota is 1 to {MAX_QUOTA:,} replies (to refuse a user, `admin access deny`)"
        )
    return n


def add_parser(cmds: Any, as_json: argparse.ArgumentParser) -> None:
    """Register `admin access allow|deny|remove|list|quota`."""
    parser = cmds.add_parser(
        "access",
        help="who may talk to the bot (allow, deny, remove, list) and per-user quotas",
        description="Rules beside ALLOWED_USERS and ALLOWED_CHATS, followed by every replica "
        "within a few seconds. An `allow` rule puts a user, a chat or an @username on the "
        "allow-list (once anything is on it, only what is on it may talk); `deny` refuses one "
        "whatever the lists say; `remove` drops a rule. ADMIN_USER_IDS always pass.",
    )
    changes = parser.add_subparsers(dest="access_command", metavar="CHANGE", required=True)
    for name, what in (("allow", "allow"), ("deny", "refuse"), ("remove", "drop the rule of")):
        rule = changes.add_parser(name, parents=[as_json], help=f"{what} a user, chat or @name")
        rule.add_argument(
            "subject",
            type=subject,
            metavar="WHO",
            help="a user id (123456789), a chat id (chat:-1001234567890) or an @username",
        )
    changes.add_parser(
        "list",
        parents=[as_json],
        help="the rules, the settings' allow-lists and the per-user quotas",
    )
    quota = changes.add_parser(
        "quota",
        parents=[as_json],
        help="a user's own limits in place of QUOTA_PER_DAY / QUOTA_PER_MINUTE",
        description="Give USER their own replies per UTC day and per minute (an option left "
        "out: no limit for that window); --clear: back to the global QUOTA_PER_DAY and "
        "QUOTA_PER_MINUTE.",
    )
    quota.add_argument("user", type=_user, metavar="USER", help="a numeric Telegram user id")
    quota.add_argument("--per-day", type=_quota, default=None, metavar="N")
    quota.add_argument("--per-minute", type=_quota, default=None, metavar="M")
    quota.add_argument("--clear", action="store_true", help="use the global limits again")


def audited(args: argparse.Namespace) -> tuple[str, str | None] | None:
    """(action, target) for the audit log of a change; None for `list`."""
    change = args.access_command
    if change == "list":
        return None
    target = str(args.user) if change == "quota" else args.subject
    return f"access {change}", target


async def run(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
    """`admin access CHANGE`."""
    sessionmaker = make_sessionmaker(engine)
    change = args.access_command
    if change == "list":
        return await _list(sessionmaker, args, out)
    if change == "quota":
        if args.clear and (args.per_day is not None or args.per_minute is not None):
            print("error: --clear takes no --per-day or --per-minute", file=sys.stderr)
            return 2
        if not args.clear and args.per_day is None and args.per_minute is None:
            print(
                "error: give --per-day N and/or --per-minute M, or --clear for the global limits",
                file=sys.stderr,
            )
            return 2
        async with sessionmaker.begin() as db:
            if args.clear:
                had = await access.clear_quota(db, args.user)
                said = "uses the global limits" + ("" if had else " (it had none of its own)")
            else:
                await access.set_quota(db, args.user, args.per_day, args.per_minute)
                said = f"per day {_limit(args.per_day)}, per minute {_limit(args.per_minute)}"
        print(f"user {args.user}: {said}", file=out)
        return 0
    async with sessionmaker.begin() as db:
        if change == "remove":
            removed = await access.remove_rule(db, args.subject)
        else:
            await access.set_rule(db, args.subject, change)
    if change == "remove":
        print(f"{args.subject}: " + ("rule removed" if removed else "had no rule"), file=out)
        return 0 if removed else 1
    print(
        f"{args.subject}: {change}ed (every replica follows within a few seconds)"
        if change == "allow"
        else f"{args.subject}: denied (every replica follows within a few seconds)",
        file=out,
    )
    return 0


def _limit(value: int | None) -> str:
    return "none" if value is None else str(value)


async def _list(sessionmaker: Any, args: argparse.Namespace, out: TextIO) -> int:
    async with sessionmaker() as db:
        rules = await access.rules(db)
        quotas = await access.all_quotas(db)
    settings = getattr(args, "settings", None)
    configured = sorted(settings_subjects(settings)) if settings is not None else []
    if args.json:
        print(
            json.dumps(
                {
                    "rules": rules,
                    "settings_allow": configured,
                    "quotas": [
                        {"user": q.user_id, "per_day": q.per_day, "per_minute": q.per_minute}
                        for q in quotas
                    ],
                    "global_quota": {
                        "per_day": settings.quota_per_day if settings else None,
                        "per_minute": settings.quota_per_minute if settings else None,
                    },
                }
            ),
            file=out,
        )
        return 0
    allows = sorted(s for s, r in rules.items() if r == access.ALLOW)
    denies = sorted(s for s, r in rules.items() if r == access.DENY)
    everyone = not allows and not configured
    print("allowed: " + ("everyone" if everyone else " ".join(configured + allows)), file=out)
    print(
        "  (from ALLOWED_USERS/ALLOWED_CHATS: " + (" ".join(configured) or "none") + ")", file=out
    )
    print("denied: " + (" ".join(denies) or "none"), file=out)
    if settings is not None:
        print(
            f"global quota: per day {_limit(settings.quota_per_day)}, per minute "
            f"{_limit(settings.quota_per_minute)}",
            file=out,
        )
    for q in quotas:
        print(
            f"user {q.user_id}: per day {_limit(q.per_day)}, per minute {_limit(q.per_minute)}",
            file=out,
        )
    return 0
