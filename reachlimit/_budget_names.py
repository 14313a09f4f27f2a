"""The names and options of an app's budgets: what ``rl.budget(name, **options)`` and
``REACHLIMIT_BUDGETS`` may say, and how a budget's settings are worked out from the app's.

design:

    rl.budget("reports", active=1)        check_budget_name, check_budget_options (TypeError
                                          for an unknown option, as ReachLimit(...) raises)
    REACHLIMIT_BUDGETS = {"reports": {"active": 1}} (or that as JSON, from the environment)
                                          read_budgets: ValueError naming the key, the budget
                                          and the option
    budget_settings(app's Settings, name, configured, arguments)
                                          arguments > REACHLIMIT_BUDGETS > the app's settings,
                                          each value through its option's own check

Names match ``[a-z0-9_-]{1,32}``. ``"default"`` is the budget behind ``rl.cold()``: its
options are the ``REACHLIMIT_*`` keys themselves. ``"cold"`` is reserved: on Redis the default
budget's keys keep the name they had before budgets existed. ``metrics``, ``redis_url`` and
``redis_prefix`` are app-wide (one /metrics, one Redis, one prefix for every budget).
Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Set
from dataclasses import fields, replace
from typing import Any

from ._flask_settings import BUDGETS_KEY, OPTION_NAMES, Settings

__all__ = [
    "DEFAULT_BUDGET", "APP_WIDE", "RESERVED_BUDGETS", "check_budget_name",
    "check_budget_options", "read_budgets", "budget_settings", "declare",
]

#: The budget behind ``rl.cold()``; its options are the REACHLIMIT_* keys themselves.
DEFAULT_BUDGET = "default"
#: Options one app shares between all its budgets: one /metrics, one Redis and one prefix
#: (a dead worker's parent finds every budget under it).
APP_WIDE = frozenset({"metrics", "redis_url", "redis_prefix"})
#: On Redis the default budget keeps the limiter name it always had (``REDIS_LIMITER_NAME``),
#: so a budget may not take it.
RESERVED_BUDGETS = frozenset({"cold"})
_BUDGET_NAME = re.compile(r"[a-z0-9_-]{1,32}")


def check_budget_name(name: Any) -> str:
    """A budget's name: ``[a-z0-9_-]{1,32}``, not a reserved one; ValueError naming it."""
    if not isinstance(name, str) or not _BUDGET_NAME.fullmatch(name):
        raise ValueError(
            f"a budget name must be 1 to 32 of a-z, 0-9, '_' and '-', got {name!r}"
        )
    if name in RESERVED_BUDGETS:
        raise ValueError(f"the budget name {name!r} is reserved (the default budget's on Redis)")
    return name


def check_budget_options(where: str, options: Mapping[str, Any], error: type[Exception]) -> None:
    """A budget's options: known option names (``error`` naming the unknown ones), none of
    them app-wide (ValueError)."""
    unknown = sorted(set(options) - OPTION_NAMES)
    if unknown:
        raise error(
            f"{where}: unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(OPTION_NAMES - APP_WIDE))}"
        )
    shared = sorted(set(options) & APP_WIDE)
    if shared:
        # The message's words are no behaviour (no mutate); what it names is tested.
        raise ValueError(
            f"{where}: {', '.join(shared)} is the same for every budget of an app: set it "
            "on ReachLimit(...) or as its REACHLIMIT_* key"  # pragma: no mutate
        )


def read_budgets(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``REACHLIMIT_BUDGETS``: each name checked, each option name known and not app-wide
    (ValueError naming the key, the budget and the option). Values are checked later, with
    the rest of the budget's settings (:func:`budget_settings`)."""
    raw = config.get(BUDGETS_KEY)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"{BUDGETS_KEY} is not valid JSON: {exc}") from None
    if not isinstance(raw, Mapping) or not all(isinstance(v, Mapping) for v in raw.values()):
        raise ValueError(
            f'{BUDGETS_KEY} must map budget names to options, e.g. {{"reports": '
            f'{{"active": 1}}}}, got {raw!r}'
        )
    budgets: dict[str, dict[str, Any]] = {}
    for name, options in raw.items():
        if name == DEFAULT_BUDGET:
            raise ValueError(
                f"{BUDGETS_KEY}: the default budget's options are the REACHLIMIT_* keys "
                "themselves"
            )
        try:
            check_budget_name(name)
        except ValueError as exc:
            raise ValueError(f"{BUDGETS_KEY}: {exc}") from None
        check_budget_options(f"{BUDGETS_KEY}[{name!r}]", options, ValueError)
        budgets[name] = dict(options)
    return budgets


def budget_settings(
    base: Settings, name: str, configured: Mapping[str, Any], arguments: Mapping[str, Any]
) -> Settings:
    """Budget ``name``'s settings: ``arguments`` (``rl.budget(name, ...)``) win over
    ``configured`` (its ``REACHLIMIT_BUDGETS`` entry), which win over the app's ``base``.
    Each value goes through its option's check, the key it names being where it came from."""
    values: dict[str, Any] = {}
    for option in fields(Settings):
        if option.name in arguments:
            key = f"{option.name} (rl.budget({name!r}) argument)"
            values[option.name] = option.metadata["check"](key, arguments[option.name])
        elif option.name in configured:
            key = f"{BUDGETS_KEY}[{name!r}][{option.name!r}]"
            values[option.name] = option.metadata["check"](key, configured[option.name])
    return replace(base, **values)


def declare(
    name: str, options: Mapping[str, Any], before: Mapping[str, Any] | None,
    from_config: Set[str] = frozenset(),
) -> bool:
    """``rl.budget(name, **options)``'s checks: True when ``name`` is new (``before``, the
    options it was declared with, is None). "default" takes no options (its options are
    ReachLimit's); a name declared again with other options is a ValueError, and so are
    options for a name in ``from_config`` (built by an init_app from REACHLIMIT_BUDGETS
    alone: they could not reach it); each value is checked at once."""
    if options and name in from_config and before is None:
        # The message's last words are no behaviour (no mutate); what it names is tested.
        raise ValueError(
            f"budget {name!r} was built at init_app from REACHLIMIT_BUDGETS alone, so "
            f"options given to rl.budget({name!r}, ...) now would not reach it: declare "
            "it before init_app (its options win over its "  # pragma: no mutate
            "REACHLIMIT_BUDGETS entry)"  # pragma: no mutate
        )
    if name == DEFAULT_BUDGET:
        if options:
            # The message's words are no behaviour (no mutate); that it is raised is tested.
            raise ValueError(
                "the default budget's options are ReachLimit(...)'s and "  # pragma: no mutate
                "the REACHLIMIT_* keys: give a budget of other options "  # pragma: no mutate
                "another name"  # pragma: no mutate
            )
        return False
    check_budget_name(name)
    check_budget_options(f"rl.budget({name!r})", options, TypeError)
    budget_settings(Settings(), name, {}, options)  # each value checked now
    if before is not None and options and dict(options) != dict(before):
        raise ValueError(
            f"budget {name!r} is declared already, with other options ({dict(before)})"
        )
    return before is None
