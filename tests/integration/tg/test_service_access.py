"""Access (ALLOWED_USERS / ALLOWED_CHATS / `admin access`) and quotas, through the real service
and the loopback Bot API, on SQLite and PostgreSQL (bot/service/access.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.app import Service
from bot.texts import ENGLISH, for_language
from tests.integration.admin.test_admin import run
from tests.support.fakebotapi import FakeBotAPI
from tests.support.fixtures import ServeSettings, StartService
from tests.support.service_harness import TOKEN as IN_PROCESS_TOKEN
from tests.support.service_harness import (
    EchoResponder,
    make_settings,
    rows,
    running_service,
    settled,
)
from tests.support.waits import until

ADMIN, FRIEND, STRANGER = 900, 201, 202


def _sample(service: Service, name: str, **labels: str) -> float:
    value = service.metrics.registry.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} is not exported"
    return value


async def test_a_stranger_is_refused_once_then_ignored_and_nothing_is_kept(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    responder = EchoResponder()
    settings = make_settings(
        db_url, api, tmp_path, allowed_users=str(FRIEND), admin_user_ids=str(ADMIN)
    )
    service = await start_service(settings, responder)
    first = api.user_message(STRANGER, "hello, secret words", language_code="de")
    for text in ("/start", "are you there?"):
        api.user_message(STRANGER, text, language_code="de")
    api.user_message(FRIEND, "hi from a friend")
    api.user_message(ADMIN, "hi from the admin")
    await api.wait_for_texts(FRIEND, 1)
    await api.wait_for_texts(ADMIN, 1)
    await settled(service, api)
    # One refusal, in the sender's language; the rest of their messages: silence.
    assert api.texts(STRANGER) == [for_language("de").NOT_ALLOWED]
    assert for_language("de").NOT_ALLOWED != ENGLISH.NOT_ALLOWED
    assert api.texts(FRIEND) == [f"echo {FRIEND}: hi from a friend"]
    assert api.texts(ADMIN) == [f"echo {ADMIN}: hi from the admin"]
    # Nothing they sent reached the model, the history, or even the inbox's payload.
    assert sorted(c for c, _ in responder.calls) == [FRIEND, ADMIN]
    assert await rows(service, f"SELECT count(*) FROM messages WHERE chat_id = {STRANGER}") == [
        (0,)
    ]
    assert await rows(service, f"SELECT count(*) FROM sessions WHERE chat_id = {STRANGER}") == [
        (0,)
    ]
    stored = await rows(service, f"SELECT status, payload FROM inbox WHERE chat_id = {STRANGER}")
    assert len(stored) == 3
    assert {status for status, _ in stored} == {"ignored"}
    assert not [p for _, p in stored if "secret" in p or "start" in p or "there" in p]
    assert _sample(service, "bot_access_refusals_total") == 3
    # A redelivery of a refused update is a duplicate like any other: no second refusal.
    api.redeliver(first)
    await settled(service, api)
    assert api.texts(STRANGER) == [for_language("de").NOT_ALLOWED]
    assert _sample(service, "bot_access_refusals_total") == 3
    assert _sample(service, "bot_updates_duplicate_total") == 1


async def test_admin_access_allow_and_deny_take_effect_live(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    responder = EchoResponder()
    settings = make_settings(db_url, api, tmp_path, allowed_users=str(FRIEND))
    service = await start_service(settings, responder)
    api.user_message(STRANGER, "first try")
    await api.wait_for_texts(STRANGER, 1)
    assert api.texts(STRANGER) == [ENGLISH.NOT_ALLOWED]
    status, said = await run(db_url, "access", "allow", str(STRANGER))
    assert status == 0, said

    # Within the replicas' cache time (RULES_TTL_S, 3 s) and without a restart.
    async def answered() -> bool:
        api.user_message(STRANGER, "let me in")
        await settled(service, api)
        return len(api.texts(STRANGER)) > 1

    await until(answered, within_s=10, every_s=0.5, what="the allow rule to be followed")
    assert api.texts(STRANGER)[1:] == [f"echo {STRANGER}: let me in"]
    # Deny overrides ALLOWED_USERS.
    status, said = await run(db_url, "access", "deny", str(FRIEND))
    assert status == 0, said
    status, listing = await run(db_url, "access", "list")
    assert f"user:{STRANGER}" in listing and f"denied: user:{FRIEND}" in listing

    async def refused() -> bool:
        api.user_message(FRIEND, "still here?")
        await settled(service, api)
        return ENGLISH.NOT_ALLOWED in api.texts(FRIEND)

    await until(refused, within_s=10, every_s=0.5, what="the deny rule to be followed")
    texts = api.texts(FRIEND)
    # Answered until the replica read the rule (at most RULES_TTL_S), then refused once...
    assert texts[-1] == ENGLISH.NOT_ALLOWED
    assert all(t == f"echo {FRIEND}: still here?" for t in texts[:-1])
    # ... and then silence.
    api.user_message(FRIEND, "hello?")
    await settled(service, api)
    assert api.texts(FRIEND) == texts


async def test_over_quota_the_user_is_told_when_and_the_message_is_kept_unanswered(
    db_url: str, api: FakeBotAPI, serve_db: ServeSettings
) -> None:
    """QUOTA_PER_DAY=2 for everyone; user 301 has their own 4 (`admin access quota`)."""
    responder = EchoResponder()
    service = await serve_db(responder, quota_per_day=2)
    status, said = await run(db_url, "access", "quota", "301", "--per-day", "4")
    assert status == 0, said
    for i in range(4):
        api.user_message(302, f"global {i}")
    for i in range(6):
        api.user_message(301, f"own {i}")
    await api.wait_for_texts(302, 3)
    await api.wait_for_texts(301, 5)
    await settled(service, api)
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%d 00:00")
    assert api.texts(302) == [
        "echo 302: global 0",
        "echo 302: global 1",
        ENGLISH.quota_reached("day", 2, tomorrow),
    ]
    assert api.texts(301) == [f"echo 301: own {i}" for i in range(4)] + [
        ENGLISH.quota_reached("day", 4, tomorrow)
    ]
    assert f"after {tomorrow} (UTC)" in api.texts(302)[-1]
    # No model call for a refused message, but each one is kept (it joins the next reply).
    assert len(responder.calls) == 6
    [(kept,)] = await rows(
        service, "SELECT count(*) FROM messages WHERE chat_id = 302 AND role = 'user'"
    )
    assert kept == 4
    assert await rows(service, "SELECT count(*) FROM inbox WHERE status = 'pending'") == [(0,)]
    assert _sample(service, "bot_quota_hits_total", window="day") == 4  # 2 of 302, 2 of 301
    assert _sample(service, "bot_quota_hits_total", window="minute") == 0
    # --clear: back to the global 2, of which 301 has used 4.
    status, said = await run(db_url, "access", "quota", "301", "--clear")
    assert status == 0, said
    api.user_message(301, "after clear")
    await settled(service, api)
    assert len(api.texts(301)) == 5 and len(responder.calls) == 6


async def test_a_per_minute_quota_names_the_next_minute(
    db_url: str, api: FakeBotAPI, serve_db: ServeSettings
) -> None:
    responder = EchoResponder()
    service = await serve_db(responder, quota_per_minute=1)
    before = datetime.now(UTC)
    api.user_message(401, "one")
    api.user_message(401, "two", language_code="es")
    texts = await api.wait_for_texts(401, 2)
    after = datetime.now(UTC)
    await settled(service, api)
    minutes = {
        (t.replace(second=0, microsecond=0) + timedelta(minutes=1)).strftime("%H:%M:%S")
        for t in (before, after)
    }
    # The chat's language is the sender's of each update: the notice is in Spanish.
    assert texts[0] == "echo 401: one"
    assert texts[1] in {for_language("es").quota_reached("minute", 1, m) for m in minutes}
    assert _sample(service, "bot_quota_hits_total", window="minute") == 1


async def test_two_replicas_share_one_quota(db_url: str, tmp_path: Path) -> None:
    """One user writing in four groups at once, served by two replicas (each takes one chat at
    a time, so both work): QUOTA_PER_DAY=5 holds across them, exactly."""
    async with FakeBotAPI(IN_PROCESS_TOKEN) as api:
        # A turn takes 0.4 s and a replica takes one chat at a time: while one generates, the
        # other (scanning the inbox every second) takes the next chat.
        engines = (EchoResponder(delay_s=0.4), EchoResponder(delay_s=0.4))
        settings = make_settings(
            db_url,
            api,
            tmp_path,
            log_level="INFO",
            max_concurrent_chats=1,
            group_policy="all",
            quota_per_day=5,
        )
        groups = (-501, -502, -503, -504)
        async with (
            running_service(settings, engines[0]) as one,
            running_service(settings, engines[1]),
        ):
            for i in range(3):
                for group in groups:
                    api.user_message(group, f"m{i}", user_id=777, chat_type="group")
                await asyncio.sleep(0.05)
            await until(
                lambda: sum(len(api.texts(g)) for g in groups) >= 6,
                within_s=30,
                what="five replies and the notice",
            )
            await settled(one, api)
            counted = await rows(one, "SELECT replies, refused FROM quota_counters")
        texts = [t for g in groups for t in api.texts(g)]
        echoes = [t for t in texts if t.startswith("echo ")]
        notices = [t for t in texts if not t.startswith("echo ")]
        assert len(echoes) == 5
        assert len(notices) == 1 and notices[0].startswith("You've reached today's limit of 5")
        assert sum(len(e.calls) for e in engines) == 5
        assert all(e.calls for e in engines)  # both replicas answered some
        assert counted == [(5, 7)]


async def test_usernames_and_allowed_chats_let_in_and_an_unlisted_group_stays_silent(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    responder = EchoResponder()
    settings = make_settings(
        sqlite_url, api, tmp_path, allowed_users="@Alice", allowed_chats="-700", group_policy="all"
    )
    service = await start_service(settings, responder)
    alice = {"id": 203, "is_bot": False, "first_name": "A", "username": "alice"}
    api.user_message(203, "by name", extra={"from": alice})
    api.user_message(-700, "in a listed group", user_id=204, chat_type="group")
    api.user_message(-701, "in another group", user_id=204, chat_type="group")
    api.user_message(204, "alone")
    await api.wait_for_texts(204, 1)
    await settled(service, api)
    assert api.texts(203) == ["echo 203: by name"]
    assert api.texts(-700) == ["echo -700: in a listed group"]
    assert api.texts(-701) == []  # a group that is not allowed gets no refusal: silence
    assert api.texts(204) == [ENGLISH.NOT_ALLOWED]
    assert sorted(c for c, _ in responder.calls) == [-700, 203]
