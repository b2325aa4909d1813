"""bench.loop's simulated users, its seed file, its admin commands and its new-chats-only
snapshot, without running the loop (that is `make bench-loop`, minutes long)."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench import loop
from bot.__main__ import _build_parser
from bot.config import Settings
from bot.engine.variants import load_experiment


def test_the_simulated_preference_is_a_question_back() -> None:
    assert loop.likes("i love dogs. do you have one?")
    assert not loop.likes("i love dogs.")


def test_votes_press_the_buttons_the_bot_sent() -> None:
    markup = {"inline_keyboard": [[{"text": "👍", "callback_data": "v:42:1"},
                                   {"text": "👎", "callback_data": "v:42:-1"}]]}  # fmt: skip
    assert loop.vote_data(markup, 1) == "v:42:1"
    assert loop.vote_data(markup, -1) == "v:42:-1"
    assert loop.vote_data(None, 1) is None


def test_the_seed_file_is_the_control_alone(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    loop.variants_file(path, str(loop.SHIPPED))
    settings = Settings(_env_file=None, variants_file=str(path), data_dir=tmp_path)  # type: ignore[call-arg]
    experiment = load_experiment(settings)
    assert experiment.name == loop.EXPERIMENT
    assert list(experiment.names) == [loop.CONTROL]
    assert experiment.control.name == loop.CONTROL
    assert experiment.allocation == "weights"


def test_the_admin_commands_are_the_ones_the_bot_parses() -> None:
    parser = _build_parser()
    add = parser.parse_args(loop.add_argv("/models/candidate/model"))
    assert (add.command, add.admin_command, add.variants_command) == ("admin", "variants", "add")
    assert (add.name, add.model, add.weight) == (loop.CANDIDATE, "/models/candidate/model", 1.0)
    allocation = parser.parse_args(loop.allocation_argv("thompson"))
    assert allocation.variants_command == "allocation"
    assert allocation.allocation == "thompson"


def test_group_chat_ids_never_overlap() -> None:
    groups = [loop.COLLECT_CHATS, loop.PROBE_CHATS, loop.COMPARE_CHATS, loop.THOMPSON_CHATS]
    ids = [set(loop.chats(g, 80)) for g in groups]
    assert sum(len(s) for s in ids) == len(set().union(*ids))


def test_the_first_reply_after_the_service_followed_a_change() -> None:
    sent_at = {1: [10.0, 12.0], 2: [11.0], 3: [9.0], 4: [], 5: [8.0]}
    assigned: loop.Assigned = {
        1: (loop.CANDIDATE, "weights"),
        2: (loop.CANDIDATE, "thompson"),
        3: (loop.CONTROL, "weights"),
        4: (loop.CANDIDATE, "thompson"),
    }  # 5: not assigned yet
    assert loop.first_reply_where(sent_at, assigned, loop.on_candidate) == 10.0
    assert loop.first_reply_where(sent_at, assigned, loop.by_bandit) == 11.0
    assert loop.first_reply_where(sent_at, {3: assigned[3]}, loop.on_candidate) is None


def test_how_an_assignment_was_made() -> None:
    assert loop.allocated_by('{"by": "thompson", "split": {"a": 1.0}}') == "thompson"
    assert loop.allocated_by(None) is None  # an admin move, or a row older than 0008


def _db(path: Path, assigned: dict[int, str]) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(
            "CREATE TABLE experiments (name TEXT);"
            "CREATE TABLE assignments (chat_id INTEGER, variant TEXT, source TEXT,"
            " assigned_at TEXT, allocation TEXT);"
            "CREATE TABLE votes (chat_id INTEGER, value INTEGER);"
            "CREATE TABLE inbox (chat_id INTEGER);"
            "INSERT INTO experiments VALUES ('bench-loop');"
            "INSERT INTO inbox VALUES (NULL);"
        )
        for chat, at in assigned.items():
            split = json.dumps({"by": "thompson", "split": {"control": 0.2, "candidate": 0.8}})
            conn.execute(
                "INSERT INTO assignments VALUES (?, 'control', 'hash', ?, ?)", (chat, at, split)
            )
            conn.execute("INSERT INTO votes VALUES (?, 1)", (chat,))
        conn.commit()


def test_the_snapshot_keeps_only_the_new_chats(tmp_path: Path) -> None:
    path = tmp_path / "copy.sqlite3"
    # SQLite holds the service's timestamps as naive UTC text
    _db(path, {1: "2026-12-01 10:00:00.000000", 2: "2026-12-01 12:00:00.500000"})
    deleted = loop.keep_only_chats(path, [2])
    assert deleted == {"assignments": 1, "votes": 1, "inbox": 1}
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT chat_id FROM votes").fetchall() == [(2,)]
        assert conn.execute("SELECT count(*) FROM experiments").fetchone() == (1,)
    since = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()
    assert loop.check_new(path, since) == 1
    assert loop.check_new(path, since, "thompson") == 1
    with pytest.raises(RuntimeError, match="before the change"):
        loop.check_new(path, since + 1)
    with pytest.raises(RuntimeError, match="not assigned by weights"):
        loop.check_new(path, since, "weights")
    assert loop.recorded_share(path, "candidate") == pytest.approx(0.8)


def test_the_mean_recorded_split() -> None:
    splits = [json.dumps({"split": {"candidate": p}}) for p in (0.5, 0.9)]
    assert loop.mean_split(splits, "candidate") == pytest.approx(0.7)
    assert loop.mean_split(splits, "control") == 0.0
    assert loop.mean_split([], "candidate") is None


def test_each_arm_trains_with_its_own_negatives_and_is_parsed_by_the_cli() -> None:
    parser = _build_parser()
    for arm, extra in loop.ARMS.items():
        argv = ["train", "--from-feedback", "f.txt", "--out", "o", *extra]
        args = parser.parse_args(argv)
        negatives = "none" if arm == loop.LIKES_ONLY else None  # None: the default
        assert args.negatives == negatives
    assert loop.ARMS[loop.LIKES_ONLY] == ["--negatives", "none", "--min-distinct-ratio", "0"]


def test_the_report_prints_each_arms_figures(capsys: pytest.CaptureFixture[str]) -> None:
    def arm(lift: float, low: float, distinct: float) -> dict[str, object]:
        return {"chats": 50, "votes": 250, "up_rate": 0.5, "interval": [0.4, 0.6],
                "lift_pp": lift, "always_valid_low_pp": low, "always_valid_high_pp": 30.0,
                "always_valid_p": 0.01,
                "vote_diff_pp": lift, "p": 0.001, "chat_share": 0.34,
                "distinct_share": distinct, "distinct_ratio": distinct / 0.8,
                "guards": None}  # fmt: skip

    weighted = {"control_chats": 48, "control_votes": 240, "control_up_rate": 0.33,
                "control_interval": [0.27, 0.39], "control_distinct_share": 0.8,
                loop.CANDIDATE: arm(17.0, 1.5, 0.8),
                loop.LIKES_ONLY: arm(16.0, -1.0, 0.6)}  # fmt: skip
    results = {"weighted": weighted, "wall_s": 200,
               "live_s": {loop.CANDIDATE: 7.0, loop.LIKES_ONLY: 5.0},
               "recipes": {loop.CANDIDATE: {"guard": {"distinct_ratio": 0.98}},
                           loop.LIKES_ONLY: {"guard": {"distinct_ratio": 0.9}}}}  # fmt: skip
    loop.report(results)
    lines = dict(
        line.removeprefix("RESULT ").split("=", 1)
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("RESULT ")
    )
    assert float(lines["loop_uplift_pp"]) == 17.0
    assert float(lines["loop_always_valid_low_pp"]) == 1.5
    assert float(lines["loop_distinct_ratio"]) == 1.0
    assert float(lines["loop_likes_only_uplift_pp"]) == 16.0
    assert float(lines["loop_likes_only_always_valid_low_pp"]) == -1.0
    assert float(lines["loop_likes_only_distinct_ratio"]) == 0.75
    assert float(lines["loop_guard_distinct_ratio"]) == 0.98
    assert "loop_refused_by_guard" not in lines
