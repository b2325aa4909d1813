"""The safety gate (SAFETY=off|flag|block): replies and personas through an offline classifier.

The classifier is alt-profanity-check: a linear SVM over character and word n-grams, shipped in
its wheel with scikit-learn as its only dependency, a few milliseconds per text on a CPU.
ParlAI's own safety list and classifier are downloaded at run time and cannot be used offline.
It scores offensive language (profanity, insults, slurs), not every harmful meaning: an operator
who needs more should put a stronger classifier behind the same interface.

- block (the default): a flagged reply is replaced by the best-scoring candidate beam that
  passes; when none does, by a short neutral deflection. The flagged text is stored with the
  reply (`messages.unsafe_text`) and never sent. An offensive /persona is refused.
- flag: replies and personas go through unchanged and are stored marked, for the admins.
- off: no classifier at all.

The classifier is loaded on a worker thread (about a second, at start: `warm_up`). Once
loaded, a short batch of texts (a reply and its candidate beams, a persona: up to
`INLINE_CHARS` characters in all) is scored on the event loop, in about a millisecond; a hop to
the worker thread took 12-14 ms p50 of a turn at 50 users, nearly all of it waiting for the
thread (docs/benchmarks.md, "Issue 38, fourth pass"). Longer batches still go to the thread.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from bot import texts

log = logging.getLogger(__name__)


class SafetyMark(StrEnum):
    """`messages.safety` and `sessions.persona_safety`: what the gate did."""

    FLAGGED = "flagged"  # offensive, kept (SAFETY=flag)
    REPLACED = "replaced"  # offensive; a clean candidate beam was sent instead
    DEFLECTED = "deflected"  # offensive, and so were all candidates: the deflection was sent


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to send and store for one reply."""

    text: str
    mark: SafetyMark | None = None  # None: it passed
    unsafe_text: str | None = None  # the flagged reply that was not sent (block)
    check_ms: float = 0.0  # time in the classifier


Scorer = Callable[[list[str]], list[float]]

# A loaded classifier scores batches of up to this many characters on the event loop (the
# module's note); longer ones on a worker thread.
INLINE_CHARS = 4096

_scorer: Scorer | None = None
_scorer_lock = threading.Lock()


def profanity_scorer() -> Scorer:
    """alt-profanity-check's probability of offensive language, loaded once per process.

    The package's `predict_prob` runs scikit-learn's CalibratedClassifierCV, whose input checks
    and per-call label encoding cost about 3.5 ms a text here, holding the GIL against the event
    loop. The model is five sigmoid-calibrated linear SVMs over one TF-IDF vectorizer, so the
    same probability is one product per classifier over the text's few terms:
    `fast_profanity_scorer`, equal to `predict_prob` to the last bit on
    tests/integration/tg/test_safety.py's texts (`python -m bench.safety`: 0.01-0.02 ms a short
    text, against 0.4-0.8 ms through the vectorizer's sparse transform, the way before). A model
    of another shape (a newer wheel) keeps `predict_prob`."""
    global _scorer
    with _scorer_lock:
        if _scorer is None:
            from profanity_check import profanity_check

            fast = fast_profanity_scorer(profanity_check.vectorizer, profanity_check.model)
            if fast is None:
                log.info("the profanity model has an unexpected shape; using predict_prob")
                _scorer = reference_profanity_scorer()
            else:
                _scorer = fast
        return _scorer


def reference_profanity_scorer() -> Scorer:
    """The package's own `predict_prob`, as it is."""
    from profanity_check import predict_prob

    def score(items: list[str]) -> list[float]:
        return [float(p) for p in predict_prob(items)]

    return score


def fast_profanity_scorer(vectorizer: Any, model: Any, *, sparse: bool = False) -> Scorer | None:
    """`model.predict_proba(vectorizer.transform(items))[:, 1]` without scikit-learn's per-call
    overhead, for a binary CalibratedClassifierCV of sigmoid-calibrated linear classifiers
    (what alt-profanity-check ships); None for any other shape.

    Per calibrated classifier i: f_i = x . w_i + c_i (the decision function), p_i =
    expit(-(a_i f_i + b_i)) (_SigmoidCalibration.predict); the probability is the mean of the
    p_i (CalibratedClassifierCV.predict_proba averages its classifiers). x is the TF-IDF row,
    built in plain Python for a TfidfVectorizer of the usual settings; with `sparse=True`, or
    for another vectorizer, it is the vectorizer's own transform, with a sparse product."""
    import numpy as np
    from scipy.special import expit  # type: ignore[import-untyped]

    try:
        members = list(model.calibrated_classifiers_)
        if list(model.classes_) != [0, 1] or not members:
            return None
        weights, intercepts, slopes, offsets = [], [], [], []
        for member in members:
            [calibrator] = member.calibrators
            coef = np.asarray(member.estimator.coef_, dtype=np.float64)
            if member.method != "sigmoid" or coef.shape[0] != 1:
                return None
            weights.append(coef[0])
            intercepts.append(float(np.ravel(member.estimator.intercept_)[0]))
            slopes.append(float(calibrator.a_))
            offsets.append(float(calibrator.b_))
    except (AttributeError, TypeError, ValueError):
        return None
    w = np.stack(weights).T  # features x classifiers
    c, a, b = np.array(intercepts), np.array(slopes), np.array(offsets)

    def score(items: list[str]) -> list[float]:
        decision = vectorizer.transform(items) @ w + c
        return [float(p) for p in expit(-(a * decision + b)).mean(axis=1)]

    terms = None if sparse else _tfidf_terms(vectorizer, w)
    if terms is None:
        return score
    analyze = vectorizer.build_analyzer()
    idf = [float(x) for x in vectorizer.idf_]
    rows = [tuple(float(x) for x in r) for r in w]

    def score_short(items: list[str]) -> list[float]:
        """The same, a text at a time in plain Python: scikit-learn's transform builds a sparse
        matrix and checks its input at about 0.4 ms a call, for a reply of a few words. The
        arithmetic is scikit-learn's and scipy's, in their order: count x idf, the row's l2
        norm summed column by column, then each classifier's sum over the row's columns."""
        decisions = np.zeros((len(items), len(c)))
        for row, text in enumerate(items):
            counts: dict[int, int] = {}
            for token in analyze(text):
                j = terms.get(token)
                if j is not None:
                    counts[j] = counts.get(j, 0) + 1
            if not counts:
                continue
            columns = sorted(counts)
            values = [counts[j] * idf[j] for j in columns]
            squares = 0.0
            for v in values:
                squares += v * v
            norm = math.sqrt(squares)
            sums = [0.0] * len(c)
            for j, v in zip(columns, values, strict=True):
                x = v / norm
                for i, weight in enumerate(rows[j]):
                    sums[i] += x * weight
            decisions[row] = sums
        return [float(p) for p in expit(-(a * (decisions + c) + b)).mean(axis=1)]

    return score_short


def _tfidf_terms(vectorizer: Any, w: Any) -> dict[str, int] | None:
    """term -> column of a fitted TfidfVectorizer whose transform `score_short` repeats (raw
    counts, idf, l2 norm), else None (the vectorizer's own transform is used)."""
    import numpy as np
    from sklearn.feature_extraction.text import TfidfVectorizer  # type: ignore[import-untyped]

    if not isinstance(vectorizer, TfidfVectorizer):
        return None
    settings = vectorizer.get_params()
    plain = {"binary": False, "sublinear_tf": False, "use_idf": True, "norm": "l2"}
    if any(settings.get(k) != v for k, v in plain.items()):
        return None
    if np.dtype(settings.get("dtype")) != np.float64:
        return None  # its transform would round to float32
    try:
        terms = {str(t): int(j) for t, j in vectorizer.vocabulary_.items()}
        if len(vectorizer.idf_) != w.shape[0]:
            return None
    except AttributeError:
        return None
    return terms


class SafetyGate:
    """The gate of one service; `scorer` is the classifier (a test may pass its own)."""

    def __init__(
        self,
        mode: str,
        threshold: float = 0.5,
        scorer: Callable[[], Scorer] | None = None,
        *,
        deflection: str = texts.ENGLISH.DEFLECTION,
    ) -> None:
        self.mode = mode
        self.threshold = threshold
        self._scorer = scorer or profanity_scorer
        self._loaded: Scorer | None = None  # what `_scorer` gave, once loaded
        # What replaces a reply when every candidate was offensive (in the model's language).
        self.deflection = deflection

    @property
    def on(self) -> bool:
        """Whether anything is checked."""
        return self.mode != "off"

    async def warm_up(self) -> None:
        """Load the classifier now (about a second), not on the first reply."""
        if self.on:
            await self._load()

    async def _load(self) -> Scorer:
        """The classifier, loaded on a worker thread the first time."""
        if self._loaded is None:
            self._loaded = await asyncio.to_thread(self._scorer)
        return self._loaded

    async def offensive(self, items: Sequence[str]) -> list[bool]:
        """Whether each text is offensive: a short batch scored on the event loop, a long one
        on a worker thread (the module's note)."""
        if not items:
            return []
        texts_ = list(items)
        scorer = await self._load()
        if sum(len(t) for t in texts_) <= INLINE_CHARS:
            scores = scorer(texts_)
        else:
            scores = await asyncio.to_thread(scorer, texts_)
        return [s >= self.threshold for s in scores]

    async def reply(self, text: str, candidates: Sequence[str] = ()) -> Verdict:
        """The reply to send: `text` if it passes, else (block) the first candidate that does,
        else the deflection; with flag, `text` marked. `candidates` are the other beams, best
        first (they may include `text`)."""
        if not self.on:
            return Verdict(text)
        started = time.perf_counter()
        others = [c for c in dict.fromkeys(candidates) if c != text]
        if self.mode == "flag":
            [bad] = await self.offensive([text])
            ms = (time.perf_counter() - started) * 1000.0
            return Verdict(text, SafetyMark.FLAGGED if bad else None, None, ms)
        verdicts = await self.offensive([text, *others])
        ms = (time.perf_counter() - started) * 1000.0
        if not verdicts[0]:
            return Verdict(text, None, None, ms)
        clean = next((c for c, bad in zip(others, verdicts[1:], strict=True) if not bad), None)
        if clean is not None:
            return Verdict(clean, SafetyMark.REPLACED, text, ms)
        return Verdict(self.deflection, SafetyMark.DEFLECTED, text, ms)

    async def persona(self, persona: str) -> bool:
        """Whether a persona is offensive (always False with SAFETY=off)."""
        if not self.on or not persona:
            return False
        [bad] = await self.offensive([persona])
        return bad
