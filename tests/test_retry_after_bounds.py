"""The "auto" Retry-After at its upper bound: a base and spread that add up to exactly the
highest figure keep it; one more second takes the spread off instead."""

from __future__ import annotations

import pytest

from reachlimit._retry_after import AutoRetryAfter

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(("build_seconds", "expected"), [(24.0, 30), (25.0, 25 - 6)])
def test_a_figure_of_exactly_the_highest_keeps_its_spread(
    build_seconds: float, expected: int
) -> None:
    auto = AutoRetryAfter(1, 4, randint=lambda low, high: high)  # the widest spread
    auto.record(build_seconds)
    assert auto.base(0) == build_seconds and AutoRetryAfter.HIGHEST == 30
    assert auto.seconds(0) == expected
