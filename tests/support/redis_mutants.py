"""Mutants of the Lua scripts of ``reachlimit.redis``, for the mutant tests
(``tests/test_redis_mutants.py``, ``tests/test_redis_fairness_mutants.py``,
``tests/test_redis_lead_mutants.py``, ``tests/test_redis_cache_mutants.py``,
``tests/test_redis_cluster_mutants.py``, ``tests/test_redis_flight_mutants.py``,
``tests/test_redis_members_mutants.py``).

A mutant is the real text of a script with one piece (or a few) replaced, registered on the
object's own client in place of the script the object registered. Every piece replaced must
be found exactly once where it is replaced (:func:`broken`), and exactly once in the ``.lua``
file it is said to come from (:func:`in_file`, called when a test module builds its
mutants): a change of the real scripts then fails the mutant's test loudly, instead of
quietly testing the unchanged code. A file that serves several operations is one script:
a piece found once in it belongs to one operation (or to the steps several share), and a
mutant of it changes only what that piece does.

``install(obj, changes)`` replaces the script of one object (a limiter, a cache, a flight,
a member: each has one, ``_script``; a limiter's is a ``PackedScript``, replaced by one of
the mutant), and remembers the mutant's text for the test's own calls of
that object's script (``script_text``: the ghosts of ``tests/support/redis_limiters.py`` run
it). ``mutant_class(base, changes)`` does it for every object a class makes (the checks of
``tests/support/limiter_checks.py`` and ``tests/support/fairness.py`` make their own
limiters through a factory).

Every mutant test has the same shape: a check, a function of ``make`` (what makes the objects
under test) and the test's fixtures, passes with the real scripts and fails, saying what it
is said to, with the mutant. A :class:`Mutant` carries that where it is defined: its changes,
the check that must catch it and what the check's failure says (and, where a test asks it,
the checks it must still pass); ``caught_alike`` makes several that one check catches with
one failure. ``Mutant.caught(make, *args)`` runs its check on objects ``make`` makes running
the mutant (``installing``); a mutant of a script a function registers at each call
(``release_owner``, ``release_claims``, a start's settings) names the ``lua`` attribute it is
put in for the test instead (``in_lua``: the test passes its ``monkeypatch``).
``rows(globals())`` makes a module's mutants the rows of its parametrized test, each with the
id of its name (``FAST_PATH_OVERBOOKS``: ``fast-path-overbooks``), and ``checks(globals())``
the checks they name, each to pass with the real scripts; ``assert_caught`` checks a failure.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import pytest

from reachlimit.redis import lua
from reachlimit.redis._packed import PackedScript

#: One replacement: (the real piece, what the mutant has instead).
Change = tuple[str, str]

#: Every ``.lua`` file a mutant was built of (by :func:`in_file`), in this process.
MUTATED: set[str] = set()

T = TypeVar("T")

#: The text of the mutant installed on each object, by object (:func:`install`).
_INSTALLED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def broken(text: str, changes: Iterable[Change], where: str = "the script") -> str:
    """``text`` with each ``(old, new)`` of ``changes`` applied, each ``old`` found exactly
    once (``where`` names the text in the failure)."""
    out = text
    for old, new in changes:
        assert out.count(old) == 1, f"{where} no longer holds {old!r} once"
        out = out.replace(old, new)
    assert out != text, f"the mutant of {where} changes nothing"
    return out


def in_file(name: str, *changes: Change) -> tuple[Change, ...]:
    """``changes``, each checked to replace a piece found exactly once in the ``.lua`` file
    ``name`` (a name of ``lua.FILES``): the file the mutant is a mutant of."""
    text = lua.FILES[name]
    for old, _ in changes:
        assert text.count(old) == 1, f"{name}.lua no longer holds {old!r} once"
    MUTATED.add(name)
    return changes


def install(obj: Any, changes: Iterable[Change]) -> None:
    """Replace the script of ``obj`` (its ``_script``) by the mutant of the text it
    registered (a limiter's ``PackedScript`` by one of the mutant)."""
    assert hasattr(obj, "_script"), f"{type(obj).__name__} has no _script any more"
    text: str = obj._script.script
    mutant = broken(text, changes, f"{type(obj).__name__}'s")
    if isinstance(obj._script, PackedScript):  # the limiter's: sent pre-packed
        obj._script = PackedScript(obj._client, mutant)
    else:
        obj._script = obj._client.register_script(mutant)
    _INSTALLED[obj] = mutant


def script_text(obj: Any, default: str | None = None) -> str:
    """The text of the script ``obj`` runs: the mutant installed on it, else ``default``
    (by default the limiter's script, ``lua.LIMITER`` as it is now)."""
    return _INSTALLED.get(obj, lua.LIMITER if default is None else default)


def mutant_class(base: type[T], changes: Iterable[Change]) -> type[T]:
    """A subclass of ``base`` whose every object runs the mutant of its script (as
    :func:`install`), checked on the text each object registered before it is used."""
    changes = tuple(changes)
    cls: type[Any]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        super(cls, self).__init__(*args, **kwargs)
        install(self, changes)

    cls = type(f"Mutant{base.__name__}", (base,), {"__init__": __init__})
    return cast("type[T]", cls)


def installing(make: Callable[..., T], changes: Iterable[Change]) -> Callable[..., T]:
    """``make`` whose every object runs the mutant of its script (as :func:`install`)."""
    changes = tuple(changes)

    def made(*args: Any, **kwargs: Any) -> T:
        obj = make(*args, **kwargs)
        install(obj, changes)
        return obj

    return made


def assert_caught(reason: str, check: Callable[..., None], *args: Any) -> None:
    """``check(*args)`` fails, saying ``reason``: a mutant caught, and for its own fault."""
    with pytest.raises(AssertionError, match=reason):
        check(*args)


def check_id(check: Callable[..., None]) -> str:
    """A check's id in a parametrized test: its name without ``check_``."""
    return check.__name__.removeprefix("check_")


@dataclass(frozen=True)
class Mutant:
    """A mutant (its changes), the check that must catch it and what the check's failure
    says: each stated once, where the mutant is defined. ``in_lua`` names the attribute of
    ``lua`` the mutant is put in for the test, where a function registers the script at each
    call; ``intact`` are checks it must pass (the rest of it is right: it is caught for its
    own fault)."""

    changes: tuple[Change, ...]
    check: Callable[..., None]
    reason: str
    in_lua: str | None = None
    intact: tuple[Callable[..., None], ...] = ()

    def caught(
        self, make: Callable[..., Any], *args: Any, monkeypatch: pytest.MonkeyPatch | None = None
    ) -> None:
        """The check, on objects ``make`` makes running the mutant (or with ``lua.<in_lua>``
        replaced by it, every object made meanwhile running it too), fails for ``reason``;
        each of ``intact`` passes on them."""
        if self.in_lua is None:
            make = installing(make, self.changes)
        else:
            assert monkeypatch is not None, f"a mutant of lua.{self.in_lua} needs monkeypatch"
            text = broken(getattr(lua, self.in_lua), self.changes, self.in_lua)
            monkeypatch.setattr(lua, self.in_lua, text)
        assert_caught(self.reason, self.check, make, *args)
        for check in self.intact:
            check(make, *args)


def caught_alike(
    check: Callable[..., None], reason: str, *changes: tuple[Change, ...]
) -> tuple[Mutant, ...]:
    """A :class:`Mutant` of each of ``changes``, all caught by ``check`` with the same
    failure (``reason``): the check and its failure stated once for them all."""
    return tuple(Mutant(c, check, reason) for c in changes)


def mutants(namespace: Mapping[str, object]) -> dict[str, Mutant]:
    """Every :class:`Mutant` of ``namespace`` (a module's ``globals()``), in the order they
    were defined, by id: its name in lower case, with hyphens (``FAST_PATH_OVERBOOKS``:
    ``fast-path-overbooks``)."""
    return {
        name.lower().replace("_", "-"): value
        for name, value in namespace.items()
        if isinstance(value, Mutant)
    }


def checks(namespace: Mapping[str, object]) -> list[Callable[..., None]]:
    """Every check the mutants of ``namespace`` name, once each, in the order they are first
    named: the checks that must pass with the real scripts."""
    return list(dict.fromkeys(m.check for m in mutants(namespace).values()))


def rows(
    namespace: Mapping[str, object], checks: Iterable[Callable[..., None]] | None = None
) -> list[Any]:
    """The mutants of ``namespace`` (:func:`mutants`; only those one of ``checks`` catches,
    where given) as the rows of a parametrized test, each a ``pytest.param`` with its id."""
    among = None if checks is None else tuple(checks)
    return [
        pytest.param(m, id=id)
        for id, m in mutants(namespace).items()
        if among is None or m.check in among
    ]
