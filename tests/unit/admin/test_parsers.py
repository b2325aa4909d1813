"""The admin command line's numbers and spans: out of range is a usage error (one line, exit
status 2, like any other bad argument), never a traceback from the datetime module, SQLite's
integers or PostgreSQL's statement_timeout."""

from __future__ import annotations

import argparse

import pytest

from bot.admin.parsers import add_admin_parser


def parse_admin(*argv: str) -> argparse.Namespace:
    """Parse `admin ...` with the real argument parser."""
    parser = argparse.ArgumentParser(prog="bot")
    add_admin_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["admin", *argv])


HUGE = "9" * 30  # beyond any 64-bit integer


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("export", "--since", "1000000d"), "too far back"),
        (("export", "--since", HUGE + "d"), "too far back"),
        (("export", "--since", "9" * 400 + "h"), "too far back"),
        (("sessions", "--limit", HUGE), "at most"),
        (("sql", "SELECT 1", "--max-rows", HUGE), "at most"),
        (("show", HUGE), "not a chat id"),
        (("export", HUGE), "not a chat id"),
        (("forget", HUGE, "--yes"), "not a chat id"),
        (("assign", HUGE, "a"), "not a chat id"),
        (("sql", "SELECT 1", "--timeout", "1e308"), "seconds"),
        (("sql", "SELECT 1", "--timeout", "inf"), "seconds"),
        (("sql", "SELECT 1", "--timeout", "nan"), "seconds"),
        (("sql", "SELECT 1", "--timeout", "-5"), "seconds"),
        (("sql", "SELECT 1", "--timeout", "0"), "seconds"),
    ],
)
def test_an_overflowing_admin_argument_is_a_usage_error_not_a_traceback(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: `--since 1000000d` raised OverflowError out of argparse (a traceback, status 1);
    # the ids and counts passed parsing and overflowed in SQLite; the timeouts passed as is.
    with pytest.raises(SystemExit) as exited:
        parse_admin(*argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_admin_arguments_in_range_still_parse() -> None:
    args = parse_admin("export", "--since", "3650d", "--format", "parlai")
    assert args.since is not None and args.since.year >= 1
    assert parse_admin("show", str(-(2**63))).chat_id == -(2**63)
    assert parse_admin("show", str(2**63 - 1)).chat_id == 2**63 - 1
    assert parse_admin("sessions", "--limit", "5").limit == 5
    assert parse_admin("sql", "SELECT 1", "--timeout", "2.5").timeout == 2.5
