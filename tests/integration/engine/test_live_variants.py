"""Variants change without a restart: `admin variants add/weight/promote/remove`, run as the real
command line (its own process), reach a running service on the same database within 10 s, and
existing chats keep their variant (docs/guarantees.md, invariant 10) unless their variant is
removed.

Which chat goes where is worked out in the test with `choose` (the hash over the weights), so
that each check needs a chat the old and the new variants split differently.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from bot.admin.cli import run_admin
from bot.app import Service
from bot.config import Settings
from bot.db import migrate
from bot.engine.assign import choose
from tests.integration.admin.test_admin import parse_admin
from tests.integration.engine.test_variants_service import inline_ab_settings, write_variants
from tests.support.cli import cli_env, run_cli
from tests.support.fakebotapi import FakeBotAPI
from tests.support.service_harness import rows, running_service

WITHIN_S = 10.0  # the promise: every running replica follows a change within 10 s
EXP = "default"


def cli(settings: Settings, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m bot admin ...` in a process of its own, on the service's database."""
    env = cli_env(
        tmp_path,
        DATABASE_URL=settings.db_url,
        DATA_DIR=str(tmp_path / "cli-data"),
        VARIANTS_FILE=str(settings.variants_file),
    )
    return run_cli("admin", *argv, cwd=tmp_path, env=env)


def admin_settings(db_url: str, tmp_path: Path, variants_file: Path) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None, database_url=db_url, data_dir=tmp_path, variants_file=variants_file
    )


@pytest.fixture
def one_variant_admin(sqlite_url: str, tmp_path: Path, tiny_model_file: str) -> Settings:
    """admin_settings with a variants file of one variant, `a`, on the tiny model."""
    variants = write_variants(tmp_path / "v.toml", tiny_model_file, {"a": 1})
    return admin_settings(sqlite_url, tmp_path, variants)


def assert_add_refused(
    settings: Settings, name: str, model: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`admin variants add <name> --model <model>` stops with status 2 and says `why`, and the
    variants stay `a` alone."""
    assert run_admin(settings, parse_admin("variants", "add", name, "--model", model)) == 2
    assert why in capsys.readouterr().err
    assert run_admin(settings, parse_admin("variants", "list", "--json")) == 0
    assert [v["name"] for v in json.loads(capsys.readouterr().out)["variants"]] == ["a"]


def chats_for(weights_before: dict[str, float], weights_after: dict[str, float], want: str,
              start: int, n: int = 6, *, before_not: str | None = None) -> list[int]:  # fmt: skip
    """`n` fresh chat ids the new weights send to `want` and the old ones do not."""
    found = []
    chat = start
    while len(found) < n:
        old = choose(EXP, chat, weights_before)
        if choose(EXP, chat, weights_after) == want and old != want and old != before_not:
            found.append(chat)
        chat += 1
    return found


async def variant_of_reply(service: Service, api: FakeBotAPI, chat: int, text: str) -> str:
    """Send `text` in `chat`; the variant of the reply it gets."""
    before = len([m for m in api.sent if m.chat_id == chat])
    api.user_message(chat, text)
    await api.wait_for_texts(chat, before + 1, timeout_s=30)
    [(variant,)] = await rows(
        service,
        "SELECT variant FROM messages WHERE chat_id = :c AND role = 'bot' ORDER BY id DESC LIMIT 1",
        c=chat,
    )
    return str(variant)


async def follows_within(
    service: Service, api: FakeBotAPI, since: float, chats: list[int], want: str
) -> float:
    """Fresh chats, one after another, until one is answered by `want` (each of `chats` would
    be under the change, none before it); seconds after `since` that took. Every chat after
    that one gets `want` too: the change stays."""
    for i, chat in enumerate(chats):
        got = await variant_of_reply(service, api, chat, "hello there")
        if got == want:
            took = time.monotonic() - since
            for later in chats[i + 1 : i + 3]:
                assert await variant_of_reply(service, api, later, "hello there") == want
            return took
        assert time.monotonic() - since < WITHIN_S, f"chat {chat} still went to {got}"
        await asyncio.sleep(0.3)
    raise AssertionError(f"no fresh chat went to {want}")


async def eventually(check: Any, since: float, what: str) -> float:
    while True:
        if await check():
            return time.monotonic() - since
        assert time.monotonic() - since < WITHIN_S, what
        await asyncio.sleep(0.2)


async def test_add_weight_promote_remove_reach_a_running_service_within_10s(
    db_url: str, tmp_path: Path, api: FakeBotAPI, tiny_model_file: str
) -> None:
    settings = inline_ab_settings(db_url, api, tmp_path, tiny_model_file)
    old_chats = list(range(501, 509))
    expected = {c: choose(EXP, c, {"a": 1, "b": 1}) for c in old_chats}
    assert set(expected.values()) == {"a", "b"}
    async with running_service(settings, None) as service:
        for chat in old_chats:
            assert await variant_of_reply(service, api, chat, "hi") == expected[chat]

        # add: a third variant, a weight as large as the others'.
        t0 = time.monotonic()
        proc = cli(settings, tmp_path, "variants", "add", "c", "--model", tiny_model_file,
                   "--weight", "1", "--beam-size", "2")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("added c (")
        fresh = chats_for({"a": 1, "b": 1}, {"a": 1, "b": 1, "c": 1}, "c", 1000)
        took_add = await follows_within(service, api, t0, fresh, "c")

        # weight: b drained; chats the hash gave b now go elsewhere, b's chats stay on b.
        t0 = time.monotonic()
        proc = cli(settings, tmp_path, "variants", "weight", "b", "0")
        assert proc.returncode == 0, proc.stderr
        assert "weight 1 -> 0 (drained: no new chats)" in proc.stdout
        fresh = chats_for({"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 0, "c": 1}, "c", 2000,
                          before_not="a")  # fmt: skip
        # b's share went to a and c; these were b's and are now c's
        assert all(choose(EXP, c, {"a": 1, "b": 1, "c": 1}) == "b" for c in fresh)
        took_weight = await follows_within(service, api, t0, fresh, "c")

        # promote: c is the control; the service reports it (its heartbeat's status).
        t0 = time.monotonic()
        proc = cli(settings, tmp_path, "variants", "promote", "c")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("c is the control now (was a)")

        async def control_is_c() -> bool:
            status = await service.status()
            return status["experiment"]["control"] == "c"  # type: ignore[index,no-any-return]

        took_promote = await eventually(control_is_c, t0, "the service kept control a")

        # remove: a (no longer the control); its backend stops, its chats move at their next turn.
        a_chats = [c for c in old_chats if expected[c] == "a"]
        t0 = time.monotonic()
        proc = cli(settings, tmp_path, "variants", "remove", "a")
        assert proc.returncode == 0, proc.stderr

        async def a_stopped() -> bool:
            status = await service.status()
            return "a" not in {w["variant"] for w in status["workers"]}  # type: ignore[attr-defined]

        took_remove = await eventually(a_stopped, t0, "variant a kept its backend")
        assert "a" not in service.responder.backends  # type: ignore[attr-defined]
        moved = await variant_of_reply(service, api, a_chats[0], "still there?")
        assert moved == "c"  # the only variant with a weight left
        [(source, probability)] = await rows(
            service,
            "SELECT source, probability FROM assignments WHERE chat_id = :c",
            c=a_chats[0],
        )
        # A move, not a draw (issue 34): no probability of being in c that the design fixed.
        assert (source, probability) == ("moved", None)

        # Sticky: every other old chat is where it was, b (drained) included.
        for chat in old_chats:
            if expected[chat] != "a":
                assert await variant_of_reply(service, api, chat, "and now") == expected[chat]
        hash_rows = await rows(
            service, "SELECT variant, probability, allocation FROM assignments WHERE chat_id < 600"
        )
        assert {(v, p) for v, p, _ in hash_rows} >= {("b", 0.5)}

    for took in (took_add, took_weight, took_promote, took_remove):
        assert took < WITHIN_S


async def _audit_results(url: str) -> list[str]:
    from bot.db import audit
    from bot.db.engine import make_engine, make_sessionmaker

    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as db:
            return [r.result for r in await audit.recent(db, 100)]
    finally:
        await engine.dispose()


def test_bad_changes_are_refused_with_status_2_and_change_nothing(
    sqlite_url: str, tmp_path: Path, tiny_model_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate.upgrade(sqlite_url)
    vf = write_variants(tmp_path / "v.toml", tiny_model_file, {"a": 1, "b": 0})
    settings = admin_settings(sqlite_url, tmp_path, vf)

    def status_of(*argv: str) -> tuple[int, str]:
        status = run_admin(settings, parse_admin("variants", *argv))
        return status, capsys.readouterr().err

    cases = {
        ("weight", "zz", "1"): "unknown variant 'zz'; the variants of experiment default are: a, b",
        ("promote", "zz"): "unknown variant 'zz'",
        ("remove", "zz"): "unknown variant 'zz'",
        ("add", "c", "--model", str(tmp_path / "nowhere")): "no model at",
        ("add", "a", "--model", tiny_model_file): "has a variant 'a' already",
        ("add", "c d", "--model", tiny_model_file): "name must be letters, digits",
        ("add", "c", "--model", tiny_model_file, "--topp", "2"): "topp must be at most 1",
        ("add", "c", "--model", tiny_model_file, "--weight", "nan"): "finite number of 0 or more",
        ("weight", "a", "nan"): "finite number of 0 or more",
        ("weight", "a", "inf"): "finite number of 0 or more",
        ("weight", "a", "-1"): "finite number of 0 or more",
        ("weight", "a", "0"): "would leave every weight at 0",
        ("remove", "a"): "a is the control; promote another variant first",
    }
    for argv, message in cases.items():
        status, err = status_of(*argv)
        assert (status, message in err) == (2, True), (argv, err)
        assert err.startswith("error: ") and "Traceback" not in err
    assert run_admin(settings, parse_admin("variants", "list", "--json")) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["version"] == 0  # not even the seed is stored: every refusal rolled back
    # ... and the audit log holds each refusal with the message the operator saw.
    recorded = asyncio.run(_audit_results(sqlite_url))
    assert len(recorded) == len(cases) and all(r.startswith("error: ") for r in recorded)
    for r, message in zip(recorded, reversed(cases.values()), strict=True):
        assert message in r, (r, message)
    assert [(v["name"], v["weight"], v["control"]) for v in listed["variants"]] == [
        ("a", 1.0, True),
        ("b", 0.0, False),
    ]
    # The last variant cannot go either.
    assert status_of("promote", "b")[0] == 0
    assert status_of("weight", "b", "1")[0] == 0
    assert status_of("remove", "a")[0] == 0
    status, err = status_of("remove", "b")
    assert status == 2 and "b is the only variant; add another one first" in err
    # Through the real command line too: the process exits with 2.
    proc = cli(settings, tmp_path, "variants", "weight", "b", "-5")
    assert proc.returncode == 2 and proc.stderr.startswith("error: weight must be a finite")


def test_a_model_directory_is_its_model_file_and_paths_become_absolute(
    sqlite_url: str, tmp_path: Path, tiny_model_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate.upgrade(sqlite_url)
    vf = write_variants(tmp_path / "v.toml", tiny_model_file, {"a": 1})
    settings = admin_settings(sqlite_url, tmp_path, vf)
    model_dir = str(Path(tiny_model_file).parent)
    assert Path(tiny_model_file).name == "model"
    argv = ("variants", "add", "c", "--model", model_dir, "--inference", "greedy", "--json")
    assert run_admin(settings, parse_admin(*argv)) == 0
    added = json.loads(capsys.readouterr().out)
    c = next(v for v in added["variants"] if v["name"] == "c")
    assert c["model"] == str(Path(tiny_model_file).resolve())
    assert c["options"] == {"inference": "greedy"}
    assert (added["version"], c["weight"], c["control"]) == (2, 1.0, False)
