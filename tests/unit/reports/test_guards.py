"""The guard metrics' text rules (bot.reports.guards), on replies worked out by hand."""

from __future__ import annotations

import math

from bot import texts
from bot.reports.guards import distinct_share, failure_texts, normalized, repeats_itself


def test_distinct_share_compares_casefolded_with_whitespace_collapsed() -> None:
    # "Hello there" and "hello  there " are one text; "fine" and "Fine." are two.
    replies = ["Hello there", "hello  there ", "fine", "Fine."]
    assert normalized("  Hello\n there ") == "hello there"
    assert distinct_share(replies) == 3 / 4
    assert distinct_share(["a", "b"]) == 1.0
    assert math.isnan(distinct_share([]))


def test_a_reply_repeats_itself_by_its_previous_reply_or_a_trigram_twice() -> None:
    assert repeats_itself("I like dogs.", "i  like DOGS.")  # the conversation's previous one
    assert not repeats_itself("I like dogs.", "I like cats.")
    assert not repeats_itself("I like dogs.", None)
    # "i like dogs" twice within one reply; punctuation does not separate words' n-grams
    assert repeats_itself("I like dogs. Do you? I like dogs!", None)
    # two words repeated is not a 3-gram repeated
    assert not repeats_itself("I like dogs and I like cats", None)
    assert not repeats_itself("yes", None)


def test_failed_turns_are_told_in_every_shipped_language() -> None:
    found = set(failure_texts())
    for language in texts.LANGUAGES:
        catalog = texts.for_language(language)
        assert {catalog.NO_REPLY, catalog.APOLOGY} <= found
    assert "Sorry, I couldn't come up with a reply just now. Please try again." in found
    # nothing else: a notice that is not one of these is not a failed turn
    assert len(found) <= 2 * len(texts.LANGUAGES)
