"""What the Flask extension's answers say: the refusal's body and headers (its sentence
naming the budget refused, or the app's own REACHLIMIT_REFUSAL_MESSAGE), and the
``Cache-Status`` header (RFC 9211) of every answer of a view that called ``rl.cold()``.

Standard library only; ``reachlimit.flask`` sends what these functions write.

``Cache-Status`` (RFC 9211), on every answer of a view that called ``cold()`` (the last call,
if it called it more than once): ``reachlimit; hit; ttl=<s>`` (fresh; whole seconds of
freshness left), ``reachlimit; hit; ttl=<negative s>`` (stale, refreshed meanwhile),
``reachlimit; fwd=uri-miss; stored`` (built by this request; without ``stored`` when the
build's value is not cached: None or NOT_FOUND), ``reachlimit; fwd=uri-miss; collapsed``
(shared another request's build) and ``reachlimit; fwd=uri-miss; fwd-status=429`` (or 503)
on a refusal. Ours is added to the header's list (an entry the view set stays first).
"""

from __future__ import annotations

import json
import math
from math import floor
from typing import Any

from ._errors import Busy
from ._path import NOT_FOUND

__all__ = [
    "REFUSAL_SENTENCES", "refusal_sentence", "render_refusal", "cache_status", "refused_status",
]

#: The built-in sentences of a refusal, by reason; ``{budget}`` is the budget's name.
REFUSAL_SENTENCES = {
    Busy.QUEUE_FULL: "Too many '{budget}' builds are running or waiting right now; please "
    "retry shortly.",
    Busy.TIMEOUT: "Waited too long for a free '{budget}' build slot; please retry shortly.",
    Busy.DISPLACED: "This request's place in the '{budget}' queue went to another client's "
    "request (the queue is shared fairly); please retry shortly.",
    Busy.DEADLINE: "The '{budget}' queue is moving too slowly for this request to start "
    "within its wait; please retry shortly.",
    Busy.UNAVAILABLE: "The shared build limiter of '{budget}' is unavailable right now; "
    "please retry shortly.",
}


def refusal_sentence(busy: Busy, budget: str, message: str | None = None) -> str:
    """The sentence of a refusal of ``budget``: the app's ``message`` (REACHLIMIT_REFUSAL_
    MESSAGE, its ``{budget}`` and ``{retry_after}`` filled in) for a busy refusal (queue full,
    timeout, displaced, deadline), else the built-in sentence of its reason. "unavailable" (Redis
    down, fallback "refuse") always keeps its own: it is the service's failure, not a crowd."""
    retry_after = max(1, int(busy.retry_after))
    if message is not None and busy.reason != Busy.UNAVAILABLE:
        return message.format(budget=budget, retry_after=retry_after)
    sentence = REFUSAL_SENTENCES.get(busy.reason, REFUSAL_SENTENCES[Busy.TIMEOUT])
    return sentence.format(budget=budget)


def render_refusal(
    busy: Busy, budget: str = "default", message: str | None = None
) -> tuple[bytes, list[tuple[str, str]]]:
    """The refusal's JSON body and its headers (rendered once per kind by the extension)."""
    retry_after = max(1, int(busy.retry_after))
    sentence = refusal_sentence(busy, budget, message)
    body = json.dumps({"error": sentence, "retryAfter": retry_after}).encode()
    # Header names are matched in any case (RFC 9110 5.1): spelt in another, they say the same.
    return body, [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
        ("Retry-After", str(retry_after)),
        ("Cache-Control", "no-store"),
    ]


_INF = math.inf

#: The Cache-Status of a fresh hit, by its whole seconds of freshness left: each made once
#: (formatting the number cost a warm hit about 2,000 instructions; finding the text, 250).
#: At most _HIT_TEXTS_KEPT are kept: emptied when full, and made again as they come. No lock:
#: two threads may make the same text at once, and either is right.
_hit_texts: dict[int, str] = {}
_HIT_TEXTS_KEPT = 4096


def cache_status(answer: tuple[Any, str, float | None]) -> str:
    """The ``Cache-Status`` (RFC 9211) of an answer of ``ColdPath.fetch`` (an
    :class:`~reachlimit.Answer`, or its fields as ``ColdPath.fetch_warm_fields`` gives them)."""
    value, status, fresh_for = answer
    if status == "hit":
        if fresh_for is None or fresh_for == _INF:  # a cache that does not know
            return "reachlimit; hit"
        try:
            return _hit_texts[floor(fresh_for)]  # (kept for whole seconds above 0 only)
        except KeyError:
            return _hit_text(fresh_for)
    if status == "stale":
        # min(-1, ...) makes -1 of any figure from 0 up: the 0.0 put for None could be any.
        return f"reachlimit; hit; ttl={min(-1, math.floor(fresh_for or 0.0))}"
    if status == "collapsed":
        return "reachlimit; fwd=uri-miss; collapsed"
    if value is None or value is NOT_FOUND:
        return "reachlimit; fwd=uri-miss"  # built, and not stored
    return "reachlimit; fwd=uri-miss; stored"


def _hit_text(fresh_for: float) -> str:
    """The Cache-Status of a hit with ``fresh_for`` seconds left, made now (and kept, for
    a hit's whole seconds above 0: what ``cache_status`` finds)."""
    seconds = int(fresh_for)
    text = f"reachlimit; hit; ttl={seconds}"
    # (int() is floor() there. Which texts are kept never changes what is answered: this
    # line's mutants are equivalent.)
    if fresh_for > 0:  # pragma: no mutate
        if len(_hit_texts) >= _HIT_TEXTS_KEPT:
            _hit_texts.clear()
        _hit_texts[seconds] = text
    return text


def refused_status(status: int) -> str:
    """The ``Cache-Status`` of a refusal answered with HTTP ``status`` (429 or 503)."""
    return f"reachlimit; fwd=uri-miss; fwd-status={status}"
