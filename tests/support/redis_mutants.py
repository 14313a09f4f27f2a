"""Mutants of the Lua scripts of ``reachlimit.redis``, for the mutant tests
(``tests/test_redis_mutants.py``, ``tests/test_redis_fairness_mutants.py``,
``tests/test_redis_cache_mutants.py``, ``tests/test_redis_flight_mutants.py``).

A mutant is the real text of a script with one piece (or a few) replaced, registered on the
object's own client in place of the script the object registered. Every piece replaced must
be found exactly once where it is replaced (:func:`broken`), and exactly once in the ``.lua``
file it is said to come from (:func:`in_fragment`, called when a test module builds its
mutants): a change of the real scripts then fails the mutant's test loudly, instead of
quietly testing the unchanged code.

``install(obj, changes, scripts)`` replaces the named script attributes of one object (a
limiter, a cache, a flight); a limiter's hot paths send EVALSHA themselves with a head of
their own (the SHA first), which is replaced too (``LIMITER_SCRIPTS`` names each one's).
``mutant_class(base, changes, scripts)`` does it for every object a class makes (the checks
of ``tests/support/limiter_checks.py`` and ``tests/support/fairness.py`` make their own
limiters through a factory).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, cast

from reachlimit.redis import lua

#: One replacement: (the real piece, what the mutant has instead).
Change = tuple[str, str]

#: Each script a ``RedisColdLimiter`` registers (its attribute), and the attribute holding
#: the EVALSHA head its hot paths send themselves, if it has one.
LIMITER_SCRIPTS: dict[str, str | None] = {
    "_acquire_script": "_acquire_head",
    "_refusing_script": "_refusing_head",
    "_release_script": "_release_head",
    "_poll_script": "_poll_head",
    "_renew_script": None,
    "_stats_script": None,
    "_record_script": None,
    "_give_up_script": None,
    "_adopt_script": None,
}

#: Every ``.lua`` file a mutant was built of (by :func:`in_fragment`), in this process.
MUTATED: set[str] = set()

T = TypeVar("T")


def broken(text: str, changes: Iterable[Change], where: str = "the script") -> str:
    """``text`` with each ``(old, new)`` of ``changes`` applied, each ``old`` found exactly
    once (``where`` names the text in the failure)."""
    out = text
    for old, new in changes:
        assert out.count(old) == 1, f"{where} no longer holds {old!r} once"
        out = out.replace(old, new)
    assert out != text, f"the mutant of {where} changes nothing"
    return out


def in_fragment(fragment: str, *changes: Change) -> tuple[Change, ...]:
    """``changes``, each checked to replace a piece found exactly once in the ``.lua`` file
    ``fragment`` (a name of ``lua.FRAGMENTS``): the file the mutant is a mutant of."""
    text = lua.FRAGMENTS[fragment]
    for old, _ in changes:
        assert text.count(old) == 1, f"{fragment}.lua no longer holds {old!r} once"
    MUTATED.add(fragment)
    return changes


def install(
    obj: Any, changes: Iterable[Change], scripts: Mapping[str, str | None] | Iterable[str]
) -> None:
    """Replace each script attribute of ``obj`` named in ``scripts`` (with the attribute of
    its EVALSHA head, or None, when a mapping) by the mutant of the text it registered."""
    heads = scripts if isinstance(scripts, Mapping) else dict.fromkeys(scripts)
    changes = tuple(changes)
    client = obj._client
    for attr, head_attr in heads.items():
        assert hasattr(obj, attr), f"{type(obj).__name__} has no {attr} any more"
        text: str = getattr(obj, attr).script
        script = client.register_script(broken(text, changes, attr))
        setattr(obj, attr, script)
        if head_attr is not None:  # the hot paths send this SHA themselves
            head = getattr(obj, head_attr)
            setattr(obj, head_attr, (script.sha.encode(), *head[1:]))


def mutant_class(
    base: type[T], changes: Iterable[Change], scripts: Mapping[str, str | None] | Iterable[str]
) -> type[T]:
    """A subclass of ``base`` whose every object runs the mutants of ``scripts`` (as
    :func:`install`), checked on the text each object registered before it is used."""
    changes = tuple(changes)
    scripts = dict(scripts) if isinstance(scripts, Mapping) else tuple(scripts)
    cls: type[Any]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        super(cls, self).__init__(*args, **kwargs)
        install(self, changes, scripts)

    cls = type(f"Mutant{base.__name__}", (base,), {"__init__": __init__})
    return cast("type[T]", cls)
