"""Issue 32, item 2: chats were parked forever when nothing weighted could serve. With the only
weighted variant one no replica could load (or one still loading), new chats went to its lane
and waited there with no reply, while /readyz stayed green and `admin variants weight/remove`
accepted the change that caused it.

Now a new chat is only assigned to a variant served now (the control when no weighted one is,
with the probability actually used recorded), /readyz fails while a weighted variant cannot
load, and the admin commands refuse such a change unless --force, which says what follows.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from bot.admin.cli import run_admin
from bot.app import Service
from bot.conversations.store import ConversationStore
from bot.engine import live, served
from bot.engine.router import VariantResponder
from bot.engine.spec import Backend
from bot.engine.variants import Experiment, Variant, load_experiment
from tests.integration.admin.test_admin import parse_admin
from tests.integration.engine.test_live_variants import admin_settings, cli
from tests.integration.engine.test_variants_service import write_variants
from tests.support.fakebotapi import FakeBotAPI
from tests.support.service_harness import make_settings, rows, running_service
from tests.support.waits import until


def broken_model(model_file: str, dest: Path) -> str:
    """Every file a model needs (its options, weights and dictionary), but weights that are no
    checkpoint: accepted when added, it fails when a replica loads it."""
    dest.mkdir(parents=True, exist_ok=True)
    broken = dest / "model"
    opt = json.loads(Path(model_file + ".opt").read_text())
    Path(f"{broken}.opt").write_text(json.dumps({**opt, "model_file": str(broken)}))
    shutil.copy(model_file + ".dict", f"{broken}.dict")
    broken.write_text("not a checkpoint")
    return str(broken)


async def assignment(service: Service, chat: int) -> tuple[str, float, dict[str, float]]:
    [(variant, probability, allocation)] = await rows(
        service,
        "SELECT variant, probability, allocation FROM assignments WHERE chat_id = :c",
        c=chat,
    )
    return str(variant), float(probability), json.loads(allocation)["split"]


async def test_chats_are_not_parked_when_the_only_weighted_variant_cannot_load(
    db_url: str, tmp_path: Path, api: FakeBotAPI, tiny_model_file: str
) -> None:
    vf = write_variants(tmp_path / "v.toml", tiny_model_file, {"a": 1})
    settings = make_settings(db_url, api, tmp_path, variants_file=vf, model_workers="inline")
    cand = broken_model(tiny_model_file, tmp_path / "cand")
    async with running_service(settings, None) as service:
        responder: Any = service.responder
        seed = load_experiment(settings)
        await live.add(service.sessionmaker, seed, settings, {"name": "cand", "model": cand})
        await until(lambda: "cand" in responder.load_errors, within_s=30, what="cand failing")

        # /readyz fails while a weighted variant cannot load, and names it.
        readiness = await service.health.readiness()
        assert readiness["ready"] is False
        assert "variant cand: cannot load: " in readiness["checks"]["model"]["detail"]

        # The admin command refuses to leave new chats only cand, once the replica says so.
        async def reported() -> bool:
            [(info,)] = await rows(service, "SELECT info FROM replicas")
            return "cand" in json.loads(info).get("load_errors", {})

        await until(reported, within_s=15, what="the replica reporting cand's load error")
        proc = await asyncio.to_thread(cli, settings, tmp_path, "variants", "weight", "a", "0")
        assert proc.returncode == 2, proc.stdout
        assert "would leave no variant with a weight above 0 that can serve" in proc.stderr
        assert "cand: no running replica can load it" in proc.stderr
        assert responder.experiment.get("a").weight == 1  # nothing changed

        # --force makes it, and says where new chats go.
        proc = await asyncio.to_thread(
            cli, settings, tmp_path, "variants", "weight", "a", "0", "--force"
        )
        assert proc.returncode == 0, proc.stderr
        assert "forced: every new chat goes to a" in proc.stdout
        await until(lambda: responder.experiment.get("a").weight == 0, within_s=10, what="0")

        # A new chat is answered by the control, which is what its assignment records.
        api.user_message(901, "hello there")
        await api.wait_for_texts(901, 1, timeout_s=30)
        assert await assignment(service, 901) == ("a", 1.0, {"a": 1.0})


async def test_new_chats_go_to_served_variants_while_a_candidate_loads(
    db_url: str,
    tmp_path: Path,
    api: FakeBotAPI,
    tiny_model_file: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A valid candidate's load takes 10-16 s with a real BlenderBot; here the test holds it
    until it has seen a new chat answered meanwhile."""
    loading = asyncio.Event()
    release = asyncio.Event()
    real_start = served.start_backend

    async def held_start(variant: Any, *args: Any) -> Any:
        if variant.name == "c":
            loading.set()
            await release.wait()
        return await real_start(variant, *args)

    monkeypatch.setattr(served, "start_backend", held_start)
    vf = write_variants(tmp_path / "v.toml", tiny_model_file, {"a": 1})
    settings = make_settings(db_url, api, tmp_path, variants_file=vf, model_workers="inline")
    async with running_service(settings, None) as service:
        responder: Any = service.responder
        seed = load_experiment(settings)
        await live.add(
            service.sessionmaker, seed, settings, {"name": "c", "model": tiny_model_file}
        )
        experiment, _, forced = await live.set_weight(service.sessionmaker, seed, settings, "a", 0)
        assert forced == ""  # c's model is complete and no replica failed to load it
        await asyncio.wait_for(loading.wait(), 15)
        await until(lambda: responder.experiment.version == experiment.version, within_s=10)

        api.user_message(902, "hello there")
        await api.wait_for_texts(902, 1, timeout_s=30)
        assert await assignment(service, 902) == ("a", 1.0, {"a": 1.0})

        release.set()
        await until(lambda: "c" in responder.ready, within_s=30, what="c serving")
        api.user_message(903, "hello there")
        await api.wait_for_texts(903, 1, timeout_s=30)
        assert await assignment(service, 903) == ("c", 1.0, {"c": 1.0})


def test_admin_refuses_to_leave_only_weighted_variants_whose_model_is_incomplete(
    sqlite_url: str, tmp_path: Path, tiny_model_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """No replica running: the model files are checked where the replicas read them."""
    settings = admin_settings(
        sqlite_url, tmp_path, write_variants(tmp_path / "v.toml", tiny_model_file, {"a": 1, "b": 1})
    )
    cand_dir = tmp_path / "cand"
    shutil.copytree(Path(tiny_model_file).parent, cand_dir)
    opt = json.loads((cand_dir / "model.opt").read_text())
    opt.update(model_file=str(cand_dir / "model"), dict_file=str(cand_dir / "model.dict"))
    (cand_dir / "model.opt").write_text(json.dumps(opt))

    def admin(*argv: str) -> tuple[int, str, str]:
        status = run_admin(settings, parse_admin("variants", *argv))
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    assert admin("add", "cand", "--model", str(cand_dir / "model"))[0] == 0
    (cand_dir / "model").unlink()  # its weights are gone after it was added
    assert admin("weight", "a", "0")[0] == 0  # b still serves
    status, _, err = admin("remove", "b")
    assert status == 2
    assert f"cand: the model at {cand_dir / 'model'} is incomplete" in err
    assert "pass --force" in err
    status, out, _ = admin("remove", "b", "--force")
    assert status == 0 and "forced: every new chat goes to a (the control" in out
    status, out, _ = admin("list", "--json")
    assert [v["name"] for v in json.loads(out)["variants"]] == ["a", "cand"]


async def test_new_chats_avoid_a_weighted_variant_whose_backend_is_down(
    store: ConversationStore,
) -> None:
    """A variant that loaded once but takes no turns now (a worker restarting again and again,
    a Ray variant with no replica running) is not served either: new chats, and the lane the
    chat pool waits on for them, go where a backend is up; they follow it back once it is."""
    experiment = Experiment(
        "down-test", (Variant("a", "zoo:x", 0.0, True), Variant("b", "zoo:x", 1.0, False))
    )
    up, down = SimpleNamespace(alive=True), SimpleNamespace(alive=False)
    backends = {"a": cast(Backend, up), "b": cast(Backend, down)}
    responder = VariantResponder(experiment, backends, store)
    assert await responder.lane_of(951) == "a"
    assert await responder.variant_for(await store.active_session(951)) == "a"
    down.alive = True
    assert await responder.lane_of(952) == "b"
    assert await responder.variant_for(await store.active_session(952)) == "b"
    assert await responder.variant_for(await store.active_session(951)) == "a"  # sticky


def test_a_broken_model_in_the_variants_file_does_not_lock_out_the_admin_commands(
    sqlite_url: str, tmp_path: Path, tiny_model_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file only seeds the experiment for `admin variants`: a variant whose weights went
    missing must still be listed, drained and removed by the commands that fix it."""
    cand = tmp_path / "cand"
    shutil.copytree(Path(tiny_model_file).parent, cand)
    (cand / "model").unlink()
    vf = tmp_path / "v.toml"
    vf.write_text(
        f'[[variants]]\nname = "a"\nmodel = "{tiny_model_file}"\ncontrol = true\n'
        f'[[variants]]\nname = "cand"\nmodel = "{cand / "model"}"\nweight = 0\n'
    )
    settings = admin_settings(sqlite_url, tmp_path, vf)
    assert run_admin(settings, parse_admin("variants", "list")) == 0
    assert run_admin(settings, parse_admin("variants", "remove", "cand")) == 0
    assert "removed cand" in capsys.readouterr().out


async def test_the_lane_of_a_single_variant_needs_no_read(
    store: ConversationStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one variant every chat's lane is it, stored or not, served or down: the lane is
    answered without reading the chat's variant (a checkout per turn); with two it is read."""
    reads: list[int] = []
    original = store.variant_of

    async def variant_of(chat_id: int) -> str | None:
        reads.append(chat_id)
        return await original(chat_id)

    monkeypatch.setattr(store, "variant_of", variant_of)
    alone = Experiment("one", (Variant("only", "zoo:x", 1.0, True),))
    backend = SimpleNamespace(alive=False)
    responder = VariantResponder(alone, {"only": cast(Backend, backend)}, store)
    assert await responder.lane_of(961) == "only"  # down: still its lane
    backend.alive = True
    assert await responder.variant_for(await store.active_session(961)) == "only"
    assert await responder.lane_of(961) == "only"  # stored
    assert reads == []
    two = Experiment(
        "two", (Variant("only", "zoo:x", 1.0, True), Variant("b", "zoo:x", 0.0, False))
    )
    up = cast(Backend, SimpleNamespace(alive=True))
    assert await VariantResponder(two, {"only": up, "b": up}, store).lane_of(961) == "only"
    assert reads == [961]
