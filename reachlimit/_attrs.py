"""``shown``: a read-only property made from a field's name, for ``reachlimit.redis`` (and
``reachlimit._grant.FiguresOf``, kept for it) until those classes declare plain properties,
as the rest of the library does. It is typed ``Any``, so that the annotation of the class
attribute gives instances the right type::

    class Box:
        size: int = shown("_size")
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

__all__ = ["shown"]


def shown(field: str, doc: str | None = None) -> Any:
    """A read-only property whose value is ``self.<field>`` (a dotted path is allowed)."""
    # pragma: no mutate start (run at import only, before a test can turn a mutant on)
    return property(attrgetter(field), doc=doc)
    # pragma: no mutate end
