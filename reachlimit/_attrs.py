"""Read-only attributes declared in one line each.

A class that shows several of its private fields read-only would otherwise spend three
lines of ``@property`` per field; these helpers make such a property from the field's name.
Annotate the class attribute with the field's type where it is used, so that type checkers
see the right type on instances::

    class Box:
        size: int = shown("_size")
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

__all__ = ["shown", "arg"]


def shown(field: str, doc: str | None = None) -> Any:
    """A read-only property whose value is ``self.<field>`` (a dotted path is allowed)."""
    # pragma: no mutate start (run at import only, before a test can turn a mutant on)
    return property(attrgetter(field), doc=doc)
    # pragma: no mutate end


def arg(index: int, doc: str | None = None) -> Any:
    """A read-only property whose value is ``self.args[index]``: an exception's fields kept
    in ``args`` (so that the exception needs no ``__init__`` of its own and pickles as is)."""
    # pragma: no mutate start (run at import only, before a test can turn a mutant on)
    return property(lambda self: self.args[index], doc=doc)
    # pragma: no mutate end
