"""Settings of the randomized limiter tests (the ``stress`` marker): short or long form, the
seed, how long one step may wait, and the exceptions they raise on purpose.

Short form by default (part of every run). ``REACHLIMIT_STRESS=long`` runs about ten times
the examples, rounds and operations; ``REACHLIMIT_STRESS_SEED=<int>`` changes the seed of
every randomized test (default 20261129).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.waiting import wait_until

LONG = os.environ.get("REACHLIMIT_STRESS", "").strip().lower() == "long"
SEED = int(os.environ.get("REACHLIMIT_STRESS_SEED", "20261129"))

#: The marks of a stress test file: the marker, and a timeout that fits the form.
MARKS = [pytest.mark.stress, pytest.mark.timeout(1800 if LONG else 60)]

#: How long one step may wait for the effect it caused. A healthy run needs milliseconds; the
#: bound only turns a lost wake-up or a leaked slot into a failure instead of a hang.
STEP_TIMEOUT = 3.0

#: ``wait_until`` with the step's bound, polled often: a run waits for thousands of steps.
wait_for_step = functools.partial(wait_until, timeout=STEP_TIMEOUT, interval=0.0005)


class TokenBroken(Exception):
    """Raised by a cancel object's is_set() on purpose."""


class BodyError(Exception):
    """Raised inside a grant's with-block on purpose."""


def leave_grant(grant: Any, mode: str, work: Callable[[], object] | None = None) -> str:
    """Hold ``grant`` in a with-block, run ``work()`` there, and leave the way ``mode`` says:
    ``exit`` (the block's end releases), ``release`` (released early, inside the block),
    ``double`` (released twice: the second must raise RuntimeError) or ``raise`` (the body
    raises BodyError, which must come out of the block). Returns "ok", or what went wrong."""
    try:
        with grant:
            if work is not None:
                work()
            if mode == "release":
                grant.release()
            elif mode == "double":
                grant.release()
                try:
                    grant.release()
                except RuntimeError:
                    pass
                else:
                    return "a second release() did not raise RuntimeError"
            elif mode == "raise":
                raise BodyError()
    except BodyError:
        return "ok" if mode == "raise" else "unexpected BodyError"
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        return f"leaving the grant raised {exc!r}"
    return "ok" if mode != "raise" else "the body's exception was swallowed"
