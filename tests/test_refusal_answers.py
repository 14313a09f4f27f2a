"""The refusal's answer as the extension sends it (``reachlimit._answers``): its Retry-After a
whole number of seconds and at least 1, in the header, the body and the app's own sentence;
the headers it carries; the sentence of a reason it has none for; the Cache-Status of a
stale answer whose entry has just gone past its TTL, and of a hit (its texts made once and
kept, a bounded number of them)."""

from __future__ import annotations

import json

import pytest
from werkzeug.datastructures import Headers

from reachlimit import Answer, Busy, _answers
from reachlimit._answers import REFUSAL_SENTENCES, cache_status, refusal_sentence, render_refusal

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(("given", "sent"), [(0, 1), (1, 1), (2, 2), (7, 7)])
def test_retry_after_is_at_least_one_second_everywhere_it_is_said(given: int, sent: int) -> None:
    busy = Busy(Busy.QUEUE_FULL, given)
    body, headers = render_refusal(busy, "reports", "Busy; back in {retry_after} s")
    assert json.loads(body) == {"error": f"Busy; back in {sent} s", "retryAfter": sent}
    assert Headers(headers)["Retry-After"] == str(sent)
    assert refusal_sentence(busy, "reports", "{retry_after}") == str(sent)


def test_a_refusal_carries_its_type_length_retry_after_and_no_store_only() -> None:
    body, headers = render_refusal(Busy(Busy.TIMEOUT, 3))
    sent = Headers(headers)
    assert sorted(name.lower() for name, _ in headers) == [
        "cache-control", "content-length", "content-type", "retry-after"
    ]
    assert (sent["Content-Type"], sent["Content-Length"], sent["Cache-Control"]) == (
        "application/json", str(len(body)), "no-store"
    )
    # Spelt as HTTP documents them (any case means the same, but a client that compares
    # names exactly, or a log grep, finds them as the docs write them).
    assert [name for name, _ in headers] == [
        "Content-Type", "Content-Length", "Retry-After", "Cache-Control"
    ]
    # Without a budget's name, the sentence is the default budget's.
    assert json.loads(body)["error"] == REFUSAL_SENTENCES[Busy.TIMEOUT].format(budget="default")


def test_a_reason_without_a_sentence_of_its_own_is_said_as_a_timeout() -> None:
    sentence = refusal_sentence(Busy("some_new_reason", 2), "reports")
    assert sentence == REFUSAL_SENTENCES[Busy.TIMEOUT].format(budget="reports")


@pytest.mark.parametrize("fresh_for", [0.0, 0.4, None, -0.5, -3.2])
def test_a_stale_answer_says_a_negative_ttl_even_at_the_ttls_end(fresh_for: float | None) -> None:
    expected = -1 if fresh_for is None or fresh_for > -1 else int(fresh_for // 1)
    assert cache_status(Answer("v", "stale", fresh_for)) == f"reachlimit; hit; ttl={expected}"


def test_a_hit_says_its_whole_seconds_left_however_many_were_said_before() -> None:
    """A hit's text is made once per whole second and kept, a bounded number of them: every
    one said is right, across more seconds than are kept, and said again after."""
    for seconds in [*range(5000), 3599, 0, 4999]:
        for fraction in (0.0, 0.5, 0.999):
            text = cache_status(Answer("v", "hit", seconds + fraction))
            assert text == f"reachlimit; hit; ttl={seconds}", (seconds, fraction)
            # The texts kept are bounded (the module's memo): never more than it says.
            assert len(_answers._hit_texts) <= _answers._HIT_TEXTS_KEPT
    # Freshness not known (a cache without one, or a shared one without a stale window), and
    # a fields tuple as ColdPath.fetch_warm_fields answers it.
    assert cache_status(Answer("v", "hit")) == "reachlimit; hit"
    assert cache_status(("v", "hit", float("inf"))) == "reachlimit; hit"
    assert cache_status(("v", "hit", 12.7)) == "reachlimit; hit; ttl=12"


@pytest.mark.parametrize(("fresh_for", "said"), [(-0.5, 0), (-1.5, -1), (0.0, 0)])
def test_a_hit_without_freshness_left_says_it_as_int_does(fresh_for: float, said: int) -> None:
    """No hit is answered past its TTL (that is a stale answer), but one that said so would
    get int()'s whole seconds, as it always did."""
    assert cache_status(Answer("v", "hit", fresh_for)) == f"reachlimit; hit; ttl={said}"
    assert cache_status(Answer("v", "hit", fresh_for)) == f"reachlimit; hit; ttl={said}"
