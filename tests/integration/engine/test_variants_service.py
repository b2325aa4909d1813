"""Variants through the real PTB Application and the loopback Bot API, on the tiny model:
sticky assignment across a weight change and a restart, weight 0 draining, /model, and the
the invariants of docs/guarantees.md through the worker-process boundary."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bot.admin.cli import run_admin
from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.db import migrate
from bot.db.assignments import Choice
from bot.db.conversations import ReplyFacts
from bot.db.engine import make_engine, make_sessionmaker
from bot.engine.assign import choose
from bot.engine.router import VariantResponder
from bot.texts import ENGLISH as texts
from tests.integration.admin.test_admin import parse_admin
from tests.support.fakebotapi import FakeBotAPI
from tests.support.service_harness import make_settings, rows, running_service
from tests.support.store_rows import mark_sent, pending_outbox


def write_variants(path: Path, model: str, weights: dict[str, float], **extra: str) -> Path:
    body = []
    for i, (name, weight) in enumerate(weights.items()):
        body.append(f'[[variants]]\nname = "{name}"\nmodel = "{model}"\nweight = {weight}\n')
        if i == 0:
            body.append("control = true\n")
        body.extend(f"{k} = {v}\n" for k, v in extra.items() if k.startswith(name + "_"))
    path.write_text("".join(body))
    return path


def inline_ab_settings(db_url: str, api: FakeBotAPI, tmp_path: Path, model: str) -> Settings:
    """make_settings serving variants a (the control) and b 1:1 on `model`, in the service's
    own process."""
    vf = write_variants(tmp_path / "v.toml", model, {"a": 1, "b": 1})
    return make_settings(db_url, api, tmp_path, variants_file=vf, model_workers="inline")


async def assert_not_enabled(settings: Settings, api: FakeBotAPI, chat: int, command: str) -> None:
    """A service on `settings` answers `/command`, its first text in `chat`, that it is off."""
    async with running_service(settings, None):
        api.user_message(chat, f"/{command}")
        assert await api.wait_for_texts(chat, 1, timeout_s=30) == [texts.not_enabled(command)]


async def test_assignment_is_sticky_across_a_weight_change_and_a_restart(
    db_url: str, tmp_path: Path, api: FakeBotAPI, tiny_model_file: str
) -> None:
    settings = inline_ab_settings(db_url, api, tmp_path, tiny_model_file)
    first_chats = list(range(401, 421))
    new_chats = list(range(421, 441))
    expected = {c: choose("default", c, {"a": 1, "b": 1}) for c in first_chats}
    assert set(expected.values()) == {"a", "b"}
    # Under the old weights some of the new chats would have gone to b: draining is visible.
    assert any(choose("default", c, {"a": 1, "b": 1}) == "b" for c in new_chats)
    async with running_service(settings, None) as service:
        for chat in first_chats:
            api.user_message(chat, "hello there")
        for chat in first_chats:
            await api.wait_for_texts(chat, 1, timeout_s=60)
        assert dict(await rows(service, "SELECT chat_id, variant FROM assignments")) == expected
        replies = await rows(service, "SELECT chat_id, variant FROM messages WHERE role = 'bot'")
        assert dict(replies) == expected  # every reply records its variant

    # Drain b (the variants are in the database now; the file only seeded them).
    drain = parse_admin("variants", "weight", "b", "0")
    assert await asyncio.to_thread(run_admin, settings, drain) == 0
    async with running_service(settings, None) as service:
        for chat in first_chats + new_chats:
            api.user_message(chat, "and again")
        for chat in first_chats:
            await api.wait_for_texts(chat, 2, timeout_s=60)
        for chat in new_chats:
            await api.wait_for_texts(chat, 1, timeout_s=60)
        assigned = dict(await rows(service, "SELECT chat_id, variant FROM assignments"))
        assert {c: assigned[c] for c in first_chats} == expected  # nobody moved
        assert {assigned[c] for c in new_chats} == {"a"}  # no new chat on a drained variant
        latest = await rows(
            service,
            "SELECT chat_id, variant FROM messages WHERE role = 'bot' AND id IN "
            "(SELECT max(id) FROM messages WHERE role = 'bot' GROUP BY chat_id)",
        )
        assert {c: v for c, v in latest if c in expected} == expected


async def test_model_command_lists_and_chooses_where_allowed(
    db_url: str, tmp_path: Path, api: FakeBotAPI, tiny_model_file: str
) -> None:
    chat = 451
    start = choose("default", chat, {"a": 1, "b": 1})
    other = "b" if start == "a" else "a"
    blind = inline_ab_settings(db_url, api, tmp_path, tiny_model_file)
    await assert_not_enabled(blind, api, chat, "model")
    allowed = blind.model_copy(update={"allow_model_choice": True})
    async with running_service(allowed, None) as service:
        api.user_message(chat, "hello")
        await api.wait_for_texts(chat, 2, timeout_s=30)
        api.user_message(chat, "/model")
        api.user_message(chat, "/model nonsense")
        api.user_message(chat, f"/model {other}")
        api.user_message(chat, "hello again")
        sent = await api.wait_for_texts(chat, 6, timeout_s=30)
        assert sent[2] == texts.variants_list(["a", "b"], start)
        assert sent[3] == texts.variant_unknown("nonsense", ["a", "b"])
        assert sent[4] == texts.variant_chosen(other)
        variants = await rows(
            service, "SELECT variant FROM messages WHERE role = 'bot' ORDER BY id"
        )
        assert variants == [(start,), (other,)]
        assert await rows(service, "SELECT variant, source FROM assignments") == [(other, "user")]


# --- the invariants through the worker boundary ----------------------------------------------


@pytest.fixture
async def workers(tmp_path: Path, tiny_model_file: str, sqlite_url: str) -> Any:
    """Two variants of the tiny model in worker processes (cache of 2 clones each)."""
    await asyncio.to_thread(migrate.upgrade, sqlite_url)
    engine = make_engine(sqlite_url)
    store = ConversationStore(make_sessionmaker(engine))
    vf = write_variants(tmp_path / "v.toml", tiny_model_file, {"a": 1, "b": 1})
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        variants_file=vf,
        data_dir=tmp_path,
        agent_cache_size=2,
        worker_threads=1,
        batch_max_wait_ms=30,
    )
    router = await VariantResponder.start(settings, store)
    yield router, store
    await router.close()
    await engine.dispose()


async def _turn(router: VariantResponder, store: ConversationStore, chat: int, text: str) -> Any:
    session = await store.active_session(chat)
    variant = await router.variant_for(session)
    result = await router.backends[variant].generate(session, text)
    stored = await store.record_turn(
        session.id, chat, text, result.text, facts=ReplyFacts(variant=variant)
    )
    router._holder[session.id] = variant
    router.turn_stored(session.id, stored.bot_message_id)
    return variant, result


def _decode(tiny_agent: Any, vec: list[int]) -> str:
    return " ".join(str(tiny_agent.dict.vec2txt(vec)).split())


async def test_isolation_eviction_and_persona_hold_through_the_worker_boundary(
    workers: Any, tiny_agent: Any
) -> None:
    router, store = workers
    likes = ["pizza", "music", "books", "travel", "coffee", "tea", "cats", "dogs"]
    chats = list(range(901, 909))
    canary_chat = next(c for c in chats if choose("default", c, {"a": 1, "b": 1}) == "a")
    personas = {c: f"i love {like} ." for c, like in zip(chats, likes, strict=True)}
    personas[canary_chat] = "my name is canary ."
    for chat in chats:
        await store.set_persona(chat, chat, personas[chat], notice="ok")
    rounds = ["hello one", "hello two", "hello three"]
    for index, text in enumerate(rounds):  # 8 chats over caches of 2: most turns are rebuilt
        results = await asyncio.gather(*(_turn(router, store, c, text) for c in chats))
        for chat, (variant, result) in zip(chats, results, strict=True):
            model_input = _decode(tiny_agent, result.model_input)
            assert variant == choose("default", chat, {"a": 1, "b": 1})
            # The persona stays pinned at the head, however often the clone was rebuilt.
            assert model_input.startswith("your persona : " + personas[chat]), model_input
            if chat != canary_chat:
                assert "canary" not in model_input  # never another chat's persona
            # Eviction is invisible: the earlier turns are there, rebuilt or not.
            for earlier in rounds[: index + 1]:
                assert earlier in model_input, (chat, model_input)
    stats = await router.worker_stats()
    assert {name: s["restarts"] for name, s in stats.items()} == {"a": 0, "b": 0}
    assert sum(s["misses"] for s in stats.values()) >= 12  # the caches really were too small


async def test_arena_shows_two_variants_and_keeps_the_pick(
    db_url: str, tmp_path: Path, api: FakeBotAPI, tiny_model_file: str
) -> None:
    from bot.engine.variants import load_experiment
    from bot.reports.variants import variant_report

    off = inline_ab_settings(db_url, api, tmp_path, tiny_model_file)
    chat = 461
    await assert_not_enabled(off, api, chat, "arena")
    on = off.model_copy(update={"arena": True})
    async with running_service(on, None) as service:
        api.user_message(chat, "/arena")
        api.user_message(chat, "hello there")
        sent = await api.wait_for_texts(chat, 3, timeout_s=30)
        assert sent[1] == texts.ARENA_READY
        [(match_id, va, ta, vb, tb)] = await rows(
            service, "SELECT id, variant_a, text_a, variant_b, text_b FROM arena_matches"
        )
        assert {va, vb} == {"a", "b"}
        assert sent[2] == texts.arena_duel(ta, tb)
        duel = api.last_sent(chat)
        keyboard = duel.reply_markup["inline_keyboard"][0]  # type: ignore[index]
        assert [b["callback_data"] for b in keyboard] == [
            f"x:{match_id}:a", f"x:{match_id}:b", f"x:{match_id}:tie"
        ]  # fmt: skip
        # Until the pick, the message has no reply in the history.
        assert await rows(service, "SELECT role FROM messages ORDER BY id") == [("user",)]
        update_id, pick = api.press(chat, duel.message_id, f"x:{match_id}:b")
        await api.wait_for(lambda: pick in api.callback_answers, what="the pick's answer")
        assert api.callback_answers[pick] == texts.arena_chosen("B")
        api.redeliver(update_id)
        _, again = api.press(chat, duel.message_id, f"x:{match_id}:a")
        _, forged = api.press(chat, duel.message_id, "x:99999:a")
        await api.wait_for(lambda: forged in api.callback_answers, what="the forged pick")
        assert api.callback_answers[again] == texts.ARENA_TWICE
        assert api.callback_answers[forged] == texts.ARENA_STALE
        history = await rows(service, "SELECT role, text, variant FROM messages ORDER BY id")
        assert history == [("user", "hello there", None), ("bot", tb, vb)]
        assert await rows(service, "SELECT winner FROM arena_matches") == [("b",)]

        # "Both bad": no reply stays; the message joins the next turn.
        api.user_message(chat, "/arena")
        api.user_message(chat, "tell me more")
        await api.wait_for_texts(chat, 5, timeout_s=30)
        [(second,)] = await rows(service, "SELECT max(id) FROM arena_matches")
        _, tie = api.press(chat, api.last_sent(chat).message_id, f"x:{second}:tie")
        await api.wait_for(lambda: tie in api.callback_answers, what="the tie's answer")
        api.user_message(chat, "what do you like")
        await api.wait_for_texts(chat, 6, timeout_s=30)
        roles = await rows(service, "SELECT role FROM messages ORDER BY id")
        assert [r for (r,) in roles] == ["user", "bot", "user", "user", "bot"]
        experiment = load_experiment(on)
        report = await variant_report(service.sessionmaker, experiment)
        ranks = {r.name: r for r in report.arena}
        assert {n: (r.matches, r.wins, r.ties) for n, r in ranks.items()} == {
            vb: (2, 1, 1),
            va: (2, 0, 1),
        }
        assert ranks[vb].strength > ranks[va].strength


async def test_a_drained_variant_takes_no_part_in_duels(
    db_url: str, tmp_path: Path, api: FakeBotAPI, tiny_model_file: str
) -> None:
    """Regression: a variant at weight 0 was still drawn into /arena duels (and ranked)."""
    from bot.db.models import AssignmentSource

    vf = write_variants(tmp_path / "v.toml", tiny_model_file, {"a": 1, "b": 0})
    settings = make_settings(
        db_url, api, tmp_path, variants_file=vf, model_workers="inline", arena=True
    )
    async with running_service(settings, None):
        api.user_message(471, "/arena")  # one variant left to duel: no arena
        assert await api.wait_for_texts(471, 1, timeout_s=30) == [texts.not_enabled("arena")]

    write_variants(vf, tiny_model_file, {"a": 1, "b": 1, "c": 0})
    # The edited file reaches the database through `admin variants reload`.
    assert await asyncio.to_thread(run_admin, settings, parse_admin("variants", "reload")) == 0
    async with running_service(settings, None) as service:
        chat = 472  # a chat that stays on the drained variant
        await service.store.set_variant(chat, Choice("default", "c"), AssignmentSource.ADMIN)
        api.user_message(chat, "/arena")
        api.user_message(chat, "hello there")
        sent = await api.wait_for_texts(chat, 2, timeout_s=30)
        assert sent[0] == texts.ARENA_READY
        pairs = await rows(service, "SELECT variant_a, variant_b FROM arena_matches")
        assert [set(pair) for pair in pairs] == [{"a", "b"}]


def _broken_variants(tmp_path: Path, model: str) -> tuple[Path, Path]:
    # Every file a model needs is there (bot.model_files), but its weights are no checkpoint:
    # only loading it finds out.
    broken = tmp_path / "broken"
    opt = json.loads(Path(model + ".opt").read_text())
    Path(str(broken) + ".opt").write_text(json.dumps({**opt, "dict_file": model + ".dict"}))
    broken.write_text("not a checkpoint")
    vf = tmp_path / "v.toml"
    vf.write_text(
        f'[[variants]]\nname = "good"\nmodel = "{model}"\ncontrol = true\n'
        f'[[variants]]\nname = "bad"\nmodel = "{broken}"\n'
    )
    return vf, broken


async def test_a_variant_that_cannot_load_is_one_clear_error_naming_it(
    tmp_path: Path, tiny_model_file: str, sqlite_url: str
) -> None:
    from bot.config import ConfigError

    vf, broken = _broken_variants(tmp_path, tiny_model_file)
    await asyncio.to_thread(migrate.upgrade, sqlite_url)
    engine = make_engine(sqlite_url)
    settings = Settings(_env_file=None, variants_file=vf, data_dir=tmp_path)  # type: ignore[call-arg]
    try:
        with pytest.raises(ConfigError) as caught:
            await VariantResponder.start(settings, ConversationStore(make_sessionmaker(engine)))
    finally:
        await engine.dispose()
    lines = str(caught.value).splitlines()
    assert lines[0] == "1 variant(s) cannot load:"
    assert lines[1].strip().startswith("variant 'bad': ")
    assert f"loading {broken} failed: " in lines[1]
    assert "good" not in str(caught.value)


async def test_context_is_the_model_input_through_the_worker(workers: Any, tiny_agent: Any) -> None:
    """What /context reports is what the model then reads: the next turn's input is exactly
    the inspected input plus the new message (nothing is truncated yet in this chat)."""
    router, store = workers
    chat = 951
    await store.set_persona(chat, chat, "i love dogs .", notice="ok")
    for text in ("hello one", "hello two"):
        await _turn(router, store, chat, text)
    session = await store.active_session(chat)
    view = await router.inspect(session)
    assert view.text.startswith("your persona : i love dogs .")
    assert view.visible_turns == 4
    _, result = await _turn(router, store, chat, "hello three")
    delimiter = list(tiny_agent.clone().history.delimiter_tok)
    new = tiny_agent.dict.txt2vec("hello three")
    assert result.model_input == view.model_input + delimiter + new


async def test_context_counts_what_no_longer_fits(
    db_url: str, tmp_path: Path, api: FakeBotAPI, tiny_model_file: str
) -> None:
    settings = make_settings(
        db_url, api, tmp_path, model_workers="inline", bot_model=tiny_model_file
    )
    chat = 961
    async with running_service(settings, None):
        api.user_message(chat, "/context")
        assert await api.wait_for_texts(chat, 1, timeout_s=30) == [texts.CONTEXT_EMPTY]
        api.user_message(chat, "/persona I love dogs.")
        await api.wait_for_texts(chat, 2, timeout_s=30)
        for i in range(8):  # far more than the tiny model's 64-token input (one at a time:
            # the flood limit counts 12 messages per 10 s)
            api.user_message(chat, f"tell me about dogs and cats and music {i}")
            await api.wait_for_texts(chat, 3 + i, timeout_s=30)
        api.user_message(chat, "/context")
        [*_, shown] = await api.wait_for_texts(chat, 11, timeout_s=30)
    lines = shown.splitlines()
    assert lines[:3] == ["What I read before my next reply:", "", "your persona: I love dogs."]
    kept = [line for line in lines if line.startswith(("you: ", "me: "))]
    dropped = int(lines[-1].split()[0].strip("("))
    assert kept and dropped > 0 and len(kept) + dropped == 16
    assert kept[-1].startswith("me: ")  # the newest turn is the bot's last reply


async def test_an_edit_regenerates_from_the_history_without_the_old_turn(
    workers: Any, tiny_agent: Any, tmp_path: Path
) -> None:
    """Through the worker: the regenerated reply's input holds the edited text and not the
    old one, and the history the next turn is rebuilt from holds only the edited turn."""
    from bot.conversations.turn import Turn
    from bot.conversations.usecases import UseCases

    router, store = workers
    settings = Settings(_env_file=None, data_dir=tmp_path, safety="off")  # type: ignore[call-arg]
    chat_actions = UseCases(store, router, settings).chat
    chat = 971
    await chat_actions.text(
        Turn(chat_id=chat, user_id=chat, texts=texts), "hello one", telegram_message_id=1
    )
    await chat_actions.text(
        Turn(chat_id=chat, user_id=chat, texts=texts), "tell me about cats", telegram_message_id=2
    )
    for row in await pending_outbox(store, chat):  # delivered (only those are edited in place)
        await mark_sent(store, row.id, 1000 + row.id)
    await chat_actions.edit(Turn(chat_id=chat, user_id=chat, texts=texts), 2, "tell me about dogs")
    session = await store.active_session(chat)
    view = await router.inspect(session)
    assert "dogs" in view.text and "cats" not in view.text
    ctx = await store.load_context(session.id, None)
    assert [m.text for m in ctx.messages if m.role == "user"] == [
        "hello one",
        "tell me about dogs",
    ]
    router.evict(session.id)  # rebuilt from the database: the same input
    assert (await router.inspect(await store.active_session(chat))).model_input == (
        view.model_input
    )
