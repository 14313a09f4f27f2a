"""The constructors' invalid-argument tests: :func:`invalid_arguments`, their cases written one
argument a line (its message, then the values that each raise it), and
:func:`assert_value_error`, the check that one call raises ``ValueError`` with exactly that
message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def invalid_arguments(**cases: tuple[str, list[Any]]) -> pytest.MarkDecorator:
    """Parametrize ``kwargs`` and ``message``: for each ``name=(message, values)``, in order,
    ``{name: value}`` and ``message`` for every one of the values."""
    return pytest.mark.parametrize(
        ("kwargs", "message"),
        [({name: value}, message) for name, (message, values) in cases.items() for value in values],
    )


def assert_value_error(call: Callable[[], object], message: str) -> None:
    """``call()`` raises ``ValueError`` saying exactly ``message``."""
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value) == message
