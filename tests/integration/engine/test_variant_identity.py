"""Issue 34, item 4: assignments that mean what they say, on SQLite and PostgreSQL.

- A chat moved off a removed variant was stored as a fresh `hash` draw with the new split, so
  the sample-ratio check cried mismatch on a clean 1:1 split and its inverse-propensity weight
  was wrong. It is now `moved`, counted at the draw it came from.
- Votes and ratings were keyed by the variant's name, so a name removed and added again with
  another model inherited the old model's votes, in the report and in Thompson's posterior. They
  now belong to the variant's identity, and a re-added name starts from zero.

Real database, the real `admin variants remove/add` (run_admin), the real router deciding and
recording assignments and identities, the real store, the real report. Only the model backends
are stand-ins (a reply's text is all the router needs of them here).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest
import scipy.stats
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.admin.cli import run_admin
from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.db import variants as stored
from bot.db.conversations import ReplyFacts
from bot.engine import live, served
from bot.engine.assign import choose
from bot.engine.bandit import thompson_split
from bot.engine.protocol import Generated
from bot.engine.router import VariantResponder
from bot.engine.spec import Backend
from bot.engine.variants import load_experiment
from bot.reports import stats as service_stats
from bot.reports.variants import variant_report
from bot.reports.variants_text import format_variant_report
from tests.integration.admin.test_admin import parse_admin
from tests.integration.engine.test_live_variants import admin_settings
from tests.support.waits import until

EXP = "identity-test"
DOC = Path(__file__).resolve().parents[3] / "docs" / "variants.md"
SQL_START, SQL_END = "<!-- identity-sql:start -->", "<!-- identity-sql:end -->"
CHATS = range(1, 41)


class StandIn:
    """A variant's backend that answers with its own name (no model: the router, the store
    and the report are what is under test)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True
        self.state = ""
        self.restart_reasons: dict[str, int] = {}
        self.closed = False

    async def generate(self, session: Any, user_text: str, *, on_draft: Any = None) -> Generated:
        return Generated(f"{self.name} says hi", [], 1, 1.0)

    def evict(self, session_id: int) -> None:
        pass

    def turn_stored(self, session_id: int, last_message_id: int) -> None:
        pass

    def set_persona(self, session_id: int, persona: str) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


def write_file(tmp_path: Path, allocation: str = "weights") -> Path:
    path = tmp_path / "variants.toml"
    path.write_text(
        f'experiment = "{EXP}"\nallocation = "{allocation}"\n'
        '[[variants]]\nname = "a"\nmodel = "zoo:blender/blender_90M/model"\ncontrol = true\n'
        '[[variants]]\nname = "b"\nmodel = "zoo:blender/blender_90M/model"\n'
        'inference = "nucleus"\ntopp = 0.9\n'
    )
    return path


async def serving(
    settings: Settings, store: ConversationStore, monkeypatch: pytest.MonkeyPatch
) -> VariantResponder:
    """The router a replica runs, on the stored experiment (seeded from the file), following
    its changes when `refresh` is called; a variant added later gets a stand-in backend."""

    async def start_backend(variant: Any, *args: Any) -> Backend:
        return cast(Backend, StandIn(variant.name))

    monkeypatch.setattr(served, "start_backend", start_backend)
    loaded = await live.ensure_seeded(store.sessionmaker, load_experiment(settings), settings)
    backends = {v.name: cast(Backend, StandIn(v.name)) for v in loaded.experiment.variants}
    return VariantResponder(loaded.experiment, backends, store, settings=settings)


class Replica(NamedTuple):
    """A replica's settings and router (`serving`), on write_file's variants."""

    settings: Settings
    responder: VariantResponder


@pytest.fixture
async def replica(
    db_url: str, tmp_path: Path, store: ConversationStore, monkeypatch: pytest.MonkeyPatch
) -> Replica:
    settings = admin_settings(db_url, tmp_path, write_file(tmp_path))
    return Replica(settings, await serving(settings, store, monkeypatch))


async def admin(settings: Settings, *argv: str) -> None:
    assert await asyncio.to_thread(run_admin, settings, parse_admin("variants", *argv)) == 0


async def turn(
    responder: VariantResponder, store: ConversationStore, chat: int, vote: int = 0
) -> str:
    """One turn of `chat` as the conversation layer takes it: the router's reply stored with
    its variant and identity, and the user's vote on it (0: none); returns the variant."""
    session = await store.active_session(chat, chat)
    reply = await responder.respond(session, "hello")
    facts = ReplyFacts(variant=reply.variant, variant_version=reply.variant_version)
    stored_turn = await store.record_turn(session.id, chat, "hello", reply.text, facts=facts)
    if vote:
        await store.vote(chat, chat, stored_turn.bot_message_id, vote)
    assert reply.variant is not None
    return reply.variant


async def report(sessionmaker: async_sessionmaker[AsyncSession], settings: Settings) -> Any:
    experiment = await live.current(sessionmaker, load_experiment(settings), settings)
    return await variant_report(sessionmaker, experiment)


async def test_removing_a_variant_leaves_the_sample_ratio_check_clean(
    replica: Replica,
    store: ConversationStore,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    settings, responder = replica
    # 40 chats split 1:1 by the hash, each with a 👍 on its first reply.
    drawn = {chat: await turn(responder, store, chat, 1) for chat in CHATS}
    assert drawn == {chat: choose(EXP, chat, {"a": 1, "b": 1}) for chat in CHATS}
    n_a = sum(1 for v in drawn.values() if v == "a")
    n_b = len(drawn) - n_a
    # The draw's own chi-square against 1:1, by hand: 2 (n_a - 20)^2 / 20.
    clean = 2 * (n_a - 20) ** 2 / 20
    before = await report(sessionmaker, settings)
    assert before.srm.chi2 == pytest.approx(clean) and not before.srm.warn

    await admin(settings, "remove", "b")
    assert await responder.refresh()
    # b's chats come back and are moved to a: a move, not a draw.
    for chat in CHATS:
        assert await turn(responder, store, chat, 1) == "a"
    after = await report(sessionmaker, settings)
    # The same chi-square as the draw's: the removal is no mismatch.
    assert after.srm.chi2 == pytest.approx(clean)
    assert after.srm.p_value == pytest.approx(float(scipy.stats.chi2.sf(clean, 1)))
    assert not after.srm.warn
    assert "WARNING: sample ratio mismatch" not in format_variant_report(after)
    async with sessionmaker() as db:
        rows = {
            int(chat): (str(variant), str(source), probability, allocation)
            for chat, variant, source, probability, allocation in await db.execute(
                text("SELECT chat_id, variant, source, probability, allocation FROM assignments")
            )
        }
    for chat, was in drawn.items():
        variant, source, probability, allocation = rows[chat]
        assert variant == "a"
        if was == "a":
            assert (source, probability) == ("hash", 0.5)
        else:
            # Its draw is kept, with what it drew; it has no probability of being in a.
            assert (source, probability) == ("moved", None)
            draw = json.loads(allocation)
            assert (draw["drawn"], draw["split"]) == ("b", {"a": 0.5, "b": 0.5})

    a, b = after.get("a"), after.get("b")
    assert a is not None and b is not None and not b.served
    assert (a.chats, a.chats_hash, b.chats, b.chats_hash) == (40, n_a, 0, n_b)
    assert (a.expected_chats, b.expected_chats) == (pytest.approx(20), pytest.approx(20))
    # The weights: only a's own draws, each 2 👍 at probability 0.5 (the moved chats' 👍 on
    # a are in its plain rate, not in its weighted one).
    assert (a.ipw_chats, a.ipw_up_rate) == (n_a, pytest.approx(1.0))
    assert (a.votes_up, a.votes_down) == (2 * n_a + n_b, 0)


async def test_a_fallback_chat_is_no_draw(
    replica: Replica,
    store: ConversationStore,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """With no weighted variant served, a new chat goes to the control with probability 1:
    source `fallback`, out of the sample-ratio check and the weights (b never had a chance at
    it, which no weight corrects)."""
    settings, responder = replica
    for chat in CHATS:
        await turn(responder, store, chat, 1)
    clean = (await report(sessionmaker, settings)).srm.chi2
    for backend in responder.backends.values():
        cast(StandIn, backend).alive = False
    cast(StandIn, responder.backends["a"]).alive = True
    await admin(settings, "weight", "a", "0", "--force")
    assert await responder.refresh()
    chat = next(c for c in range(100, 200) if choose(EXP, c, {"a": 1, "b": 1}) == "b")
    assert await turn(responder, store, chat, 1) == "a"
    async with sessionmaker() as db:
        row = (
            await db.execute(
                text("SELECT source, probability FROM assignments WHERE chat_id = :c"), {"c": chat}
            )
        ).one()
    assert tuple(row) == ("fallback", 1.0)
    after = await report(sessionmaker, settings)
    assert after.srm.chi2 == pytest.approx(clean)
    assert after.get("a").ipw_chats == sum(  # type: ignore[union-attr]
        1 for c in CHATS if choose(EXP, c, {"a": 1, "b": 1}) == "a"
    )


async def test_a_name_added_again_starts_from_zero(
    db_url: str,
    tmp_path: Path,
    store: ConversationStore,
    sessionmaker: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = admin_settings(db_url, tmp_path, write_file(tmp_path, "thompson"))
    responder = await serving(settings, store, monkeypatch)
    # Old b: 👍 on every reply; a: 👎 on every reply, each chat's conversation rated.
    votes = {"a": -1, "b": 1}
    first = {chat: choose(EXP, chat, {"a": 1, "b": 1}) for chat in range(1, 11)}
    for chat, name in first.items():
        # A first turn under Thompson: the split from no votes is 1:1, as the hash above.
        assert await turn(responder, store, chat, votes[name]) == name
        await store.end_session(chat, notice="bye")
        await store.rate(chat, chat, None, 5 if name == "b" else 1)
    old_b = sum(1 for name in first.values() if name == "b")
    old_a = len(first) - old_b
    before = await report(sessionmaker, settings)
    b = before.get("b")
    assert b is not None and (b.votes_up, b.turns, b.ratings) == (old_b, old_b, old_b)

    # b removed, then added again with another model: a new identity.
    await admin(settings, "remove", "b")
    await admin(settings, "add", "b", "--model", "zoo:blender/blender_400Mdistill/model")
    assert await responder.refresh()

    after = await report(sessionmaker, settings)
    b = after.get("b")
    a = after.get("a")
    assert b is not None and a is not None and b.served
    assert (b.votes_up, b.votes_down, b.turns, b.ratings) == (0, 0, 0, 0)
    assert b.up_rate != b.up_rate  # NaN: no votes
    assert (a.votes_up, a.votes_down, a.ratings) == (0, old_a, old_a)
    line = next(v for v in (await service_stats.stats(sessionmaker)).variants if v.name == "b")
    assert (line.replies, line.votes_up, line.votes_down) == (0, 0, 0)

    # Thompson's posterior: b from Beta(1, 1), a from its own votes.
    async with sessionmaker() as db:
        counts = await stored.vote_counts(db, ["a", "b"], EXP)
    assert counts == {"a": (0, old_a), "b": (0, 0)}
    split = await responder.allocator.split(responder.experiment, ["a", "b"])
    assert split == pytest.approx(thompson_split({"a": (0, old_a), "b": (0, 0)}))

    # The new b's own replies and votes count for it; the old ones stay in the history.
    chat = next(c for c in range(100, 400) if choose(EXP, c, split) == "b")
    assert await turn(responder, store, chat, -1) == "b"
    b = (await report(sessionmaker, settings)).get("b")
    assert b is not None and (b.turns, b.votes_up, b.votes_down) == (1, 0, 1)
    # The history, by the query of docs/variants.md.
    doc = DOC.read_text(encoding="utf-8")
    sql = doc.split(SQL_START, 1)[1].split(SQL_END, 1)[0].split("```sql\n", 1)[1]
    sql = sql.split("```", 1)[0]
    async with sessionmaker() as db:
        result = await db.execute(text(sql))
        columns = list(result.keys())
        rows = [dict(zip(columns, row, strict=True)) for row in result]
    history = [
        (r["identity"], r["model"], r["retired_at"] is not None, r["up"], r["down"])
        for r in rows
        if (r["experiment"], r["name"]) == (EXP, "b")
    ]
    assert [row[1:] for row in history] == [
        ("zoo:blender/blender_90M/model", True, old_b, 0),
        ("zoo:blender/blender_400Mdistill/model", False, 0, 1),
    ]
    current = responder.experiment.get("b")
    assert current is not None and current.version == history[1][0]

    # The same history from `admin variants list --all-versions` (its JSON).
    capsys.readouterr()
    await admin(settings, "list", "--all-versions", "--json")
    listed = json.loads(capsys.readouterr().out)["identities"]
    assert [
        (i["id"], i["model"], i["retired_at"] is not None, i["replies"], i["votes_up"],
         i["votes_down"])
        for i in listed
        if i["name"] == "b"
    ] == [
        (history[0][0], "zoo:blender/blender_90M/model", True, old_b, old_b, 0),
        (history[1][0], "zoo:blender/blender_400Mdistill/model", False, 1, 0, 1),
    ]  # fmt: skip
    await admin(settings, "list", "--all-versions")
    table = capsys.readouterr().out
    assert "every identity of its variants" in table and "current" in table


async def test_a_new_model_for_a_name_is_a_new_identity_but_threads_are_not(
    db_url: str,
    tmp_path: Path,
    store: ConversationStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`admin variants reload` after the file changed b's threads only: the same identity (the
    same replies, faster or slower); its generation options: a new one. While the new model
    loads, the old one answers, and its replies count for the old identity."""
    path = write_file(tmp_path)
    settings = admin_settings(db_url, tmp_path, path)
    responder = await serving(settings, store, monkeypatch)
    first = responder.experiment.get("b")
    control = responder.experiment.get("a")
    assert first is not None and control is not None and control.version < first.version
    path.write_text(path.read_text() + "threads = 2\n")
    await admin(settings, "reload")
    await responder.refresh()
    same = responder.experiment.get("b")
    assert same is not None and same.version == first.version
    await until(lambda: not responder._loading, what="b restarted with 2 threads")

    release = asyncio.Event()

    async def held_start(variant: Any, *args: Any) -> Backend:
        await release.wait()
        return cast(Backend, StandIn(variant.name))

    monkeypatch.setattr(served, "start_backend", held_start)
    path.write_text(path.read_text().replace("topp = 0.9", "topp = 0.5"))
    await admin(settings, "reload")
    await responder.refresh()
    changed = responder.experiment.get("b")
    assert changed is not None and changed.version > first.version
    kept = responder.experiment.get("a")
    assert kept is not None and kept.version == control.version
    chat = next(c for c in range(1, 100) if choose(EXP, c, {"a": 1, "b": 1}) == "b")
    session = await store.active_session(chat, chat)
    reply = await responder.respond(session, "hi")
    assert (reply.variant, reply.variant_version) == ("b", first.version)  # the old model
    release.set()
    await until(lambda: not responder._loading, what="b's new model serving")
    reply = await responder.respond(session, "hi")
    assert (reply.variant, reply.variant_version) == ("b", changed.version)


async def test_a_name_added_again_with_the_same_model_between_two_polls_is_new_too(
    replica: Replica,
    store: ConversationStore,
) -> None:
    """The replica sees the same model under the name and keeps its backend; the replies it
    stores from then on carry the new identity all the same."""
    settings, responder = replica
    old = responder.experiment.get("b")
    backend = responder.backends["b"]
    await admin(settings, "remove", "b")
    await admin(settings, "add", "b", "--model", "zoo:blender/blender_90M/model",
                "--inference", "nucleus", "--topp", "0.9")  # fmt: skip
    assert await responder.refresh()
    new = responder.experiment.get("b")
    assert old is not None and new is not None and new.version > old.version
    assert responder.backends["b"] is backend
    chat = next(c for c in range(1, 100) if choose(EXP, c, {"a": 1, "b": 1}) == "b")
    reply = await responder.respond(await store.active_session(chat, chat), "hi")
    assert (reply.variant, reply.variant_version) == ("b", new.version)


async def test_the_arena_ranking_forgets_the_duels_of_a_removed_identity(
    replica: Replica,
    store: ConversationStore,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    settings, responder = replica
    old_b = responder.experiment.get("b")
    assert old_b is not None

    async def duel(chat: int) -> None:
        """An /arena duel of a and b (the router's pair), which b wins."""
        match = await store.request_arena(chat, chat, notice="duel")
        session = await store.active_session(chat, chat)
        x, y = await responder.duel(session, "a joke?")
        await store.record_duel(
            session.id, chat, match, "a joke?", ((x.variant, x.text), (y.variant, y.text)),
            text="pick", markup=None, versions=(x.variant_version, y.variant_version),
        )  # fmt: skip
        assert await store.decide_duel(chat, match, "a" if x.variant == "b" else "b")

    for chat in (1, 2, 3):
        await duel(chat)
    ranking = (await report(sessionmaker, settings)).arena
    assert [(r.name, r.matches, r.wins) for r in ranking] == [("b", 3, 3), ("a", 3, 0)]
    async with sessionmaker() as db:
        winners = await db.execute(
            text("SELECT variant_version FROM messages WHERE variant = 'b' AND role = 'bot'")
        )
        assert [tuple(r) for r in winners] == [(old_b.version,)] * 3

    await admin(settings, "remove", "b")
    await admin(settings, "add", "b", "--model", "zoo:blender/blender_400Mdistill/model")
    assert await responder.refresh()
    await until(lambda: not responder._loading, what="the new b serving")
    assert (await report(sessionmaker, settings)).arena == ()
    await duel(4)
    ranking = (await report(sessionmaker, settings)).arena
    assert [(r.name, r.matches, r.wins) for r in ranking] == [("b", 1, 1), ("a", 1, 0)]
