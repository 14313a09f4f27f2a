"""Waiting for a state: the one polling loop of the tests and the benchmarks' harness."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Upper bound on anything a test waits for that is certain to happen. Only a failing (or
#: hopelessly overloaded) run ever reaches it; no assertion depends on how close it gets.
DEADLINE = 20.0


def wait_until(
    what: object, probe: Callable[[], Any], timeout: float = DEADLINE, interval: float = 0.001
) -> Any:
    """Call ``probe`` until it returns something true (and return that); fail with
    ``AssertionError`` after ``timeout`` seconds. ``what`` names the state in the failure.

    The interval only spaces the reads of a state; no outcome depends on it. The failure is
    an ``AssertionError`` (not ``pytest.fail``), so that a check run against a deliberately
    broken limiter can catch it like any other failed assertion."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout} s waiting for {what}")
        time.sleep(interval)
