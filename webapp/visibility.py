"""Visibility: the blacklisted pubkeys and hidden name prefixes that keep nodes out of sight.

A hidden node answers 404 exactly like an unknown one, is left out of the node list, and never
appears in another node's report. ``webapp/README.md`` ("Visibility") gives the rules and how a
change reaches the warm cache.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from .meshcore import normalize_pubkey

__all__ = ["Hider", "Visibility", "VisibilityRules"]


class Hider(Protocol):
    """Anything that can say whether an identity is hidden (the rules, or their holder)."""

    def is_hidden(self, pubkey: str, name: str | None) -> bool: ...


@dataclass(frozen=True, slots=True)
class VisibilityRules:
    """One immutable set of visibility rules and the generation it belongs to."""

    blacklist: frozenset[str] = frozenset()
    hidden_prefixes: tuple[str, ...] = ()  # case-folded, non-empty
    generation: int = 0

    def is_hidden(self, pubkey: str, name: str | None) -> bool:
        """Blacklisted pubkey, or a name starting with a hidden prefix (ignoring case)."""
        if pubkey in self.blacklist:
            return True
        if self.hidden_prefixes and name:
            return name.casefold().startswith(self.hidden_prefixes)
        return False


def _parse_blacklist(pubkeys: Iterable[str]) -> frozenset[str]:
    keys: set[str] = set()
    for raw in pubkeys:
        text = raw.strip()
        if not text:
            continue
        key = normalize_pubkey(text)
        if key is None:
            raise ValueError(f"blacklist entry {text!r} is not a 64-hex-char pubkey")
        keys.add(key)
    return frozenset(keys)


def _parse_prefixes(prefixes: Iterable[str]) -> tuple[str, ...]:
    # An empty prefix would hide every node: it is dropped, not honoured.
    return tuple(dict.fromkeys(p.strip().casefold() for p in prefixes if p.strip()))


class Visibility:
    """The blacklist and hidden name prefixes currently in force.

    Every change that alters the rules (blacklist or prefixes) bumps ``generation``, which
    is part of the warm-cache key, so no report built under old rules is served again.
    ``current`` is an immutable :class:`VisibilityRules`: a request takes it once and
    uses that one set throughout. Thread-safe.
    """

    def __init__(self, blacklist: Iterable[str] = (), hidden_prefixes: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._rules = VisibilityRules(  # replaced whole under _lock; read without it
            _parse_blacklist(blacklist), _parse_prefixes(hidden_prefixes), 0
        )

    @property
    def current(self) -> VisibilityRules:
        return self._rules

    @property
    def generation(self) -> int:
        return self._rules.generation

    def is_hidden(self, pubkey: str, name: str | None) -> bool:
        return self._rules.is_hidden(pubkey, name)

    def set_blacklist(self, pubkeys: Iterable[str]) -> int:
        """Replace the blacklist (raises ``ValueError`` on a malformed pubkey); returns the
        generation now in force, bumped only if the set actually changed."""
        keys = _parse_blacklist(pubkeys)
        with self._lock:
            old = self._rules
            if keys != old.blacklist:
                self._rules = VisibilityRules(keys, old.hidden_prefixes, old.generation + 1)
            return self._rules.generation

    def set_hidden_prefixes(self, prefixes: Iterable[str]) -> int:
        """Replace the hidden name prefixes; returns the generation now in force."""
        parsed = _parse_prefixes(prefixes)
        with self._lock:
            old = self._rules
            if parsed != old.hidden_prefixes:
                self._rules = VisibilityRules(old.blacklist, parsed, old.generation + 1)
            return self._rules.generation
