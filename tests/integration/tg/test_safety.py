"""The safety gate through the real PTB Application and the loopback Bot API, with the real
offline classifier (alt-profanity-check): offensive replies replaced or deflected (block),
marked (flag), personas refused or marked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bot.safety import SafetyGate, fast_profanity_scorer, reference_profanity_scorer
from bot.texts import ENGLISH as texts
from tests.support.fakebotapi import FakeBotAPI
from tests.support.fixtures import ServeSettings, StartService
from tests.support.service_harness import EchoResponder, make_settings, rows

TOXIC = "you are a fucking idiot"
TOXIC_TOO = "shut up you stupid piece of shit"
CLEAN = "I like hiking on weekends"


async def test_the_classifier_tells_the_examples_apart() -> None:
    gate = SafetyGate("block")
    assert await gate.offensive([TOXIC, TOXIC_TOO, CLEAN, "hello, how are you?"]) == [
        True,
        True,
        False,
        False,
    ]


# Replies, user messages and personas of every kind the gate sees, offensive or not.
TEXTS = [
    TOXIC,
    TOXIC_TOO,
    CLEAN,
    "hello, how are you?",
    "",
    "   ",
    "I'm Sarah! I love hiking, my dog Max and pizza.",
    "what a damn shame, the bastard stole my bike",
    "go to hell",
    "you suck at this game lol",
    "Sex, drugs and rock and roll",
    "i work as a nurse in a hospital in chicago . what do you do for a living ?",
    "Ich heiße Anna und wohne in Berlin.",
    "¿Qué tal? 😀 emoji and ünïcödé",
    "kill kill kill",
    "a " * 500,
    "The quick brown fox jumps over the lazy dog. " * 20,
]


def test_the_fast_scorer_equals_the_package_s_predict_prob() -> None:
    from profanity_check import profanity_check

    fast = fast_profanity_scorer(profanity_check.vectorizer, profanity_check.model)
    assert fast is not None, "alt-profanity-check's model changed shape: see bot/safety.py"
    reference = reference_profanity_scorer()
    expected = reference(TEXTS)
    # The plain-Python TF-IDF row does scikit-learn's and scipy's arithmetic in their order:
    # equal to the last bit, in a batch and one at a time (the gate's usual call).
    assert fast(TEXTS) == expected
    assert [fast([t])[0] for t in TEXTS] == expected
    sparse = fast_profanity_scorer(profanity_check.vectorizer, profanity_check.model, sparse=True)
    assert sparse is not None
    assert sparse(TEXTS) == pytest.approx(expected, abs=1e-12)


def test_the_fast_scorer_refuses_a_model_of_another_shape() -> None:
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.svm import LinearSVC

    texts = ["good day", "bad words", "nice one", "awful stuff"] * 5
    labels = [0, 1, 0, 1] * 5
    vectorizer = TfidfVectorizer().fit(texts)
    features = vectorizer.transform(texts)
    sigmoid = CalibratedClassifierCV(LinearSVC(), method="sigmoid", cv=2).fit(features, labels)
    fast = fast_profanity_scorer(vectorizer, sigmoid)
    assert fast is not None
    assert fast(texts[:4]) == pytest.approx(list(sigmoid.predict_proba(features[:4])[:, 1]))
    # A vectorizer whose transform the plain-Python row does not repeat keeps its own.
    for other in (
        TfidfVectorizer(sublinear_tf=True),
        TfidfVectorizer(norm="l1"),
        TfidfVectorizer(dtype=np.float32),
    ):
        other.fit(texts)
        refit = CalibratedClassifierCV(LinearSVC(), method="sigmoid", cv=2)
        refit.fit(other.transform(texts), labels)
        fast = fast_profanity_scorer(other, refit)
        sparse = fast_profanity_scorer(other, refit, sparse=True)
        assert fast is not None and sparse is not None
        assert fast(texts[:4]) == sparse(texts[:4])
        want = list(refit.predict_proba(other.transform(texts[:4]))[:, 1])
        assert fast(texts[:4]) == pytest.approx(want, abs=1e-6)
    isotonic = CalibratedClassifierCV(LinearSVC(), method="isotonic", cv=2).fit(features, labels)
    assert fast_profanity_scorer(vectorizer, isotonic) is None


def _toxic(responder: EchoResponder, *candidates: str) -> EchoResponder:
    responder.reply_override = lambda chat, text: TOXIC
    responder.candidates = (TOXIC, *candidates)
    return responder


async def test_block_sends_the_next_clean_beam_or_the_deflection(
    api: FakeBotAPI, serve_db: ServeSettings
) -> None:
    responder = _toxic(EchoResponder(), TOXIC_TOO, CLEAN)
    service = await serve_db(responder)
    api.user_message(601, "say something")
    assert await api.wait_for_texts(601, 1) == [CLEAN]
    responder.candidates = (TOXIC, TOXIC_TOO)
    api.user_message(601, "again")
    assert await api.wait_for_texts(601, 2) == [CLEAN, texts.DEFLECTION]
    stored = await rows(
        service, "SELECT text, safety, unsafe_text FROM messages WHERE role = 'bot' ORDER BY id"
    )
    assert stored == [(CLEAN, "replaced", TOXIC), (texts.DEFLECTION, "deflected", TOXIC)]
    assert TOXIC not in " ".join(s.text for s in api.sent)
    # The responder's cached conversation heard the unsent reply: it is dropped.
    assert len(responder.evicted) >= 2


async def test_flag_sends_it_and_marks_it(api: FakeBotAPI, serve_db: ServeSettings) -> None:
    responder = _toxic(EchoResponder(), CLEAN)
    service = await serve_db(responder, safety="flag")
    api.user_message(611, "say something")
    assert await api.wait_for_texts(611, 1) == [TOXIC]
    assert await rows(
        service, "SELECT text, safety, unsafe_text FROM messages WHERE role = 'bot'"
    ) == [(TOXIC, "flagged", None)]


@pytest.mark.parametrize("mode", ["block", "flag", "off"])
async def test_an_offensive_persona_is_refused_or_marked(
    mode: str, db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    service = await start_service(
        make_settings(db_url, api, tmp_path, safety=mode), EchoResponder()
    )
    chat = 621
    api.user_message(chat, "/persona My name is Sarah. I love hiking.")
    api.user_message(chat, f"/persona {TOXIC_TOO}")
    sent = await api.wait_for_texts(chat, 2)
    personas = await rows(service, "SELECT persona, persona_safety FROM sessions")
    if mode == "block":
        assert sent[1] == texts.PERSONA_REFUSED
        assert personas == [("My name is Sarah. I love hiking.", None)]
    else:
        assert sent[1] == texts.persona_set(TOXIC_TOO)
        assert personas == [(TOXIC_TOO, "flagged" if mode == "flag" else None)]


async def test_off_changes_nothing(api: FakeBotAPI, serve_db: ServeSettings) -> None:
    responder = _toxic(EchoResponder(), CLEAN)
    service = await serve_db(responder, safety="off")
    api.user_message(631, "say something")
    assert await api.wait_for_texts(631, 1) == [TOXIC]
    assert await rows(service, "SELECT safety FROM messages WHERE role = 'bot'") == [(None,)]


async def test_stats_count_what_the_gate_did(api: FakeBotAPI, serve_db: ServeSettings) -> None:
    from bot.reports.stats import format_stats, stats

    responder = _toxic(EchoResponder(), CLEAN)
    service = await serve_db(responder)
    api.user_message(641, "one")
    await api.wait_for_texts(641, 1)
    responder.candidates = (TOXIC,)
    api.user_message(641, "two")
    await api.wait_for_texts(641, 2)
    figures = await stats(service.sessionmaker)
    assert (figures.replies_replaced, figures.replies_deflected, figures.replies_flagged) == (
        1,
        1,
        0,
    )
    assert "Safety: 2 offensive replies (1 replaced, 1 deflected, 0 sent flagged)" in (
        format_stats(figures)
    )


async def test_a_loaded_classifier_scores_short_batches_on_the_event_loop() -> None:
    """Loading (about a second) is on a worker thread, once; a reply and its candidates are
    then scored on the loop's own thread; a batch over INLINE_CHARS on a worker thread."""
    import threading

    from bot.safety import INLINE_CHARS

    loop_thread = threading.get_ident()
    loads: list[int] = []
    calls: list[tuple[int, int]] = []

    def load() -> object:
        loads.append(threading.get_ident())

        def score(items: list[str]) -> list[float]:
            calls.append((threading.get_ident(), len(items)))
            return [1.0 if "idiot" in t else 0.0 for t in items]

        return score

    gate = SafetyGate("block", scorer=load)  # type: ignore[arg-type]
    assert await gate.offensive([TOXIC, CLEAN]) == [True, False]
    assert await gate.offensive([CLEAN] * 3) == [False] * 3
    assert await gate.offensive(["x" * (INLINE_CHARS + 1)]) == [False]
    assert len(loads) == 1 and loads[0] != loop_thread
    assert calls[:2] == [(loop_thread, 2), (loop_thread, 3)]
    assert calls[2][1] == 1 and calls[2][0] != loop_thread
