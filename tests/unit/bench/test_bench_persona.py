"""bench.persona's probe set and matcher: a stated fact counts, a contradicting one does not,
and the probe set stays out of the training templates."""

from __future__ import annotations

import math

import pytest

from bench import persona as bench
from bot.training.persona_data import KINDS, TRAIN_VALUES


@pytest.fixture(scope="module")
def probes() -> dict[str, object]:
    return bench.load_probes()


def test_the_probe_set_is_versioned_and_covers_every_kind(probes: dict[str, object]) -> None:
    assert probes["version"] == 1
    rows = bench.questions(probes)  # type: ignore[arg-type]
    assert len({r["id"] for r in rows}) >= 50
    assert {r["kind"] for r in rows} == set(KINDS)
    for row in rows:  # every fact is in its persona's text, its value one of its kind's
        assert bench.states(row["persona"], row["value"]), row
        assert row["value"] in probes["values"][row["kind"]]  # type: ignore[index]
    # Several phrasings per kind, of the personas and of the questions.
    for kind in KINDS:
        asked = {r["question"].lower() for r in rows if r["kind"] == kind}
        assert len(asked) >= 3, kind


def test_the_probe_values_are_disjoint_from_the_training_templates(
    probes: dict[str, object],
) -> None:
    probe_values = probes["values"]
    assert isinstance(probe_values, dict)
    every_train = {v for values in TRAIN_VALUES.values() for v in values}
    for kind, values in probe_values.items():
        for value in values:
            assert value not in every_train, (kind, value)
            # Not even as a word of a longer training value, nor the other way round.
            for train in TRAIN_VALUES[kind]:
                assert not bench.states(train, value), (value, train)
                assert not bench.states(value, train), (value, train)


def test_a_stated_fact_counts() -> None:
    assert bench.states("My name is Sarah, nice to meet you!", "sarah")
    assert bench.states("i'm a park ranger.", "park ranger")
    assert bench.states("I love to hike in the hills", "hiking")  # the verb of an -ing hobby
    assert bench.states("i have two ferrets", "ferret")  # plural
    assert bench.states("yes, i love enchilada", "enchiladas")  # singular
    assert not bench.states("I'm from Sarahville", "sarah")  # word boundaries
    assert not bench.states("I've always wanted to go to bed. What about you?", "sarah")


def test_a_contradicting_fact_is_rejected(probes: dict[str, object]) -> None:
    known = bench.known_values(probes)  # type: ignore[arg-type]
    assert bench.contradicts("My name is Emily.", "sarah", known["name"]) == "emily"
    assert bench.contradicts("i work as a nurse", "midwife", known["job"]) == "nurse"
    assert bench.contradicts("I live in Edinburgh", "reykjavik", known["home"]) == "edinburgh"
    # A value the training templates make up is one too.
    assert bench.contradicts("Hi, I'm kaskri!", "sarah", known["name"], "name") == "kaskri"
    assert bench.contradicts("Hi, I'm Sarah!", "sarah", known["name"], "name") is None
    # Its own value, or a longer form of it, is no contradiction.
    assert bench.contradicts("My name is Sarah.", "sarah", known["name"]) is None
    assert bench.contradicts("i have a guinea pig", "guinea pig", known["pet"]) is None
    assert bench.contradicts("i have a guinea pig", "pig", known["pet"]) is None


def test_an_answer_shape_naming_another_value_contradicts() -> None:
    # Values in no list (what the current recipe makes up, garbled copies) in a plain answer shape.
    assert bench.contradicts("my name is mimilo. and you?", "milo", [], "name") == "mimilo"
    assert bench.contradicts("I live in Kyoyoto!", "kyoto", [], "home") == "kyoyoto"
    assert bench.contradicts("i work as a nurse and i love it", "midwife", [], "job") == "nurse"
    assert bench.contradicts("my favorite food is pizza", "gnocchi", [], "food") == "pizza"
    assert bench.contradicts("i have a pet cat", "ferret", [], "pet") == "cat"
    # The shape of another kind is not this kind's fact.
    assert bench.contradicts("my name is mimilo", "kyoto", [], "home") is None
    # The persona's value, a form or a word of it, or a vague slot, is no contradiction.
    for reply, value, kind in [
        ("My name is Milo, nice to meet you!", "milo", "name"),
        ("i work as a park ranger.", "park ranger", "job"),
        ("my hobby is to hike", "hiking", "hobby"),
        ("i live in kyoto, japan", "kyoto", "home"),
        ("i live in the city", "kyoto", "home"),
        ("my name is not important", "milo", "name"),
        ("i'm from a small town", "kyoto", "home"),
        ("i love cats. what about you?", "ferret", "pet"),
    ]:
        assert bench.contradicts(reply, value, [], kind) is None, reply


def test_the_scores(probes: dict[str, object]) -> None:
    known = bench.known_values(probes)  # type: ignore[arg-type]
    rows = [
        {"kind": "name", "value": "sarah"},
        {"kind": "job", "value": "midwife"},
        {"kind": "pet", "value": "ferret"},
        {"kind": "home", "value": "kyoto"},
    ]
    with_persona = ["I'm Sarah!", "i am a nurse.", "i have a ferret.", "I'm from Kyoto"]
    without = ["I'm Sarah!", "i'm not sure", "i have a dog", "i'm not sure"]
    got = bench.score(rows, with_persona, without, known)
    assert got["recall"] == pytest.approx(0.75)
    assert got["base_rate"] == pytest.approx(0.25)
    assert got["lift_pp"] == pytest.approx(50.0)
    assert got["contradiction_rate"] == pytest.approx(0.25)  # the nurse
    assert got["distinct_share"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        bench.score(rows, with_persona[:2], without, known)


def test_model_names_and_result_names() -> None:
    assert bench.parse_models(["new=/a/model", "old=/b/model"]) == [
        ("new", "/a/model"),
        ("old", "/b/model"),
    ]
    assert bench.parse_models(["/x/chitchat/model"]) == [("chitchat", "/x/chitchat/model")]
    with pytest.raises(SystemExit):
        bench.parse_models(["a=/x", "a=/y"])
    figures = {"recall": 0.5}
    assert bench.result_names(0, "new", figures) == {"persona_recall": 0.5}
    assert bench.result_names(1, "old", figures) == {"persona_recall_old": 0.5}


def test_no_probe_value_looks_made_up_by_the_first_recipe(probes: dict[str, object]) -> None:
    """Else a reply stating the fact would also count as contradicting it."""
    import re

    from bot.training.persona_data import MADE_UP_SUFFIXES

    syllable = "|".join(bench.FIRST_RECIPE_SYLLABLES)
    for kind, values in probes["values"].items():  # type: ignore[attr-defined]
        suffix = "|".join(re.escape(s) for s in MADE_UP_SUFFIXES[kind])
        made_up = re.compile(rf"(?:{syllable}){{2,3}}(?:{suffix})")
        for value in values:
            for form in bench.variants(value):
                assert not made_up.fullmatch(form), (kind, value, form)


def test_distinct_share_folds_case_and_spaces() -> None:
    # The distinct-replies figures are the guards' (bot.reports.guards), not a copy of them.
    assert bench.distinct_share(["I'm not sure.", "i'm  not sure.", "Hi!", "hi"]) == 0.75
    assert math.isnan(bench.distinct_share([]))
