"""The Flask extension's settings: each option's name, default and check, written once.

design:

    ReachLimit(**overrides) / init_app(app) / release_worker(config, pid)
      read_settings(config, overrides) -> Settings (frozen)
        each field of Settings is an option: REACHLIMIT_<NAME> is its config key, <name>
        its ReachLimit argument, its metadata["check"] turns the raw value (a string from
        the environment, say) into the setting or raises ValueError naming the key
        argument > config key > default

``warn_unknown_keys`` logs each ``REACHLIMIT_*`` config key the extension does not read, and
each ``REACHLIMIT_*`` environment variable that is no config key, with the nearest known one;
``BUDGETS_KEY`` (REACHLIMIT_BUDGETS) is read by ``reachlimit._budget_names``; ``warn_threads``
adds up every enabled budget's active + queue. ``enabled`` (REACHLIMIT_ENABLED) False turns a
budget's machinery off: the extension then runs each build directly (``reachlimit.flask``).

``warn_threads`` takes the gunicorn worker's ``threads`` setting from ``reachlimit.gunicorn``'s
hooks (for the warning that it is too few). The client option's meaning (``client_of``)
is here too: None for "remote_addr" (read inline by the extension), ``_nobody`` for "none",
the app's callable otherwise, its value checked by the key rule (``reachlimit._keys``).

Standard library only, like the core: Flask's ``Request`` is never imported here, so the
client callable's argument is typed ``Any`` (``ClientFunc``). ``reachlimit.flask`` re-exports
``Settings`` and ``CONFIG_KEYS``.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, cast

from ._keys import checked_client
from ._urls import REDIS_SCHEMES, SCHEMES_TEXT, mask_url, redis_url_problem
from .gunicorn import BOOT_ID_VARIABLE

__all__ = ["Settings", "CONFIG_KEYS", "ClientFunc", "SPARE_THREADS", "RETRY_AFTER_AUTO",
           "CLIENT_REMOTE_ADDR", "CLIENT_NONE", "BUDGETS_KEY", "warn_unknown_keys"]

log = logging.getLogger("reachlimit")

#: The app's client callable, ``(request) -> key``: the request is Flask's ``Request``
#: (not imported here, so that this module needs only the standard library); the key is a
#: str, bytes, int, a tuple of those (``reachlimit._keys``) or None.
ClientFunc = Callable[[Any], Hashable]

#: Threads a worker needs beyond ``active + queue``: room for warm hits and fast refusals
#: while every build slot and queue place is taken.
SPARE_THREADS = 4


# -- settings: each option's name, default and check are written once, here ---------------

Check = Callable[[str, Any], Any]


def _whole(minimum: int, allowed: str | None = None) -> Check:
    """A whole number >= minimum; numeric strings (from the environment) are accepted."""
    def check(key: str, value: Any) -> int:
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value, re.ASCII):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{key} must be {allowed or f'a whole number >= {minimum}'}, "
                             f"got {value!r}")
        return int(value)
    return check


# _one_of, _choice and _option run once, at import, to make the fields of Settings: a
# mutation tool that switches its mutants on per call (after import) can run none of theirs,
# so they are left out of it (no mutate block). The checks they make are tested like any
# other option's (tests/test_flask_ext.py).
def _one_of(*choices: int) -> Check:  # pragma: no mutate block
    allowed = " or ".join(map(str, choices))
    whole = _whole(0, allowed)

    def check(key: str, value: Any) -> int:
        number: int = whole(key, value)
        if number not in choices:
            raise ValueError(f"{key} must be {allowed}, got {value!r}")
        return number
    return check


def _seconds(key: str, value: Any) -> float:
    """A finite number of seconds > 0."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not (number > 0 and math.isfinite(number)):
        raise ValueError(f"{key} must be a number of seconds > 0, got {value!r}")
    return number


#: A stale window longer than a day is allowed, but logged as suspicious.
SUSPICIOUS_STALE = 86_400.0


def _stale(key: str, value: Any) -> float:
    """A finite number of seconds >= 0 (0: off); more than a day is logged as suspicious."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not (number >= 0 and math.isfinite(number)):
        raise ValueError(
            f"{key} must be a number of seconds >= 0 (0: no stale answers), got {value!r}"
        )
    if number > SUSPICIOUS_STALE:
        # no mutate: the words of a log line; when it is logged, and its figures, are tested.
        log.warning(
            "%s is %g s, more than a day: an entry may then be "  # pragma: no mutate
            "served that long past its TTL while its refreshes fail; "  # pragma: no mutate
            "is that meant?",  # pragma: no mutate
            key, number,
        )
    return number


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{key} must be true or false, got {value!r}")


def _choice(*choices: str) -> Check:  # pragma: no mutate block (see _one_of)
    allowed = " or ".join(repr(c) for c in choices)

    def check(key: str, value: Any) -> str:
        text = value.strip().lower() if isinstance(value, str) else value
        if text not in choices:
            raise ValueError(f"{key} must be {allowed}, got {value!r}")
        return str(text)
    return check


#: The key a check is given for a ``ReachLimit(...)`` argument: "<name> (ReachLimit argument)"
#: (a budget's: "<name> (rl.budget('<budget>') argument)"); only arguments end so.
_ARGUMENT = " (ReachLimit argument)"
_ARGUMENT_END = " argument)"

#: REACHLIMIT_RETRY_AFTER's one word: a Retry-After worked out per refusal (AutoRetryAfter).
RETRY_AFTER_AUTO = "auto"


def _retry_after(key: str, value: Any) -> int | str:
    """A whole number of seconds >= 1, or "auto"."""
    if isinstance(value, str) and value.strip().lower() == RETRY_AFTER_AUTO:
        return RETRY_AFTER_AUTO
    number: int = _whole(1, "a whole number >= 1 or 'auto'")(key, value)
    return number


#: REACHLIMIT_CLIENT's names: the request's remote_addr, or everybody one client.
CLIENT_REMOTE_ADDR = "remote_addr"
CLIENT_NONE = "none"


def _client(key: str, value: Any) -> str | ClientFunc:
    """"remote_addr" or "none"; as the ReachLimit argument, also a callable
    ``(request) -> key``. Never a header by name: which header to trust is the app's
    decision, made in its callable or by ProxyFix."""
    if callable(value):
        if key.endswith(_ARGUMENT_END):
            return cast("ClientFunc", value)  # pragma: no mutate (cast's type: no run-time effect)
        raise ValueError(
            f"{key} must be 'remote_addr' or 'none' (a callable only as the ReachLimit "
            f"argument client=), got {value!r}"
        )
    text = value.strip().lower() if isinstance(value, str) else value
    if text not in (CLIENT_REMOTE_ADDR, CLIENT_NONE):
        callable_too = (
            " or a callable (request) -> key" if key.endswith(_ARGUMENT_END) else ""
        )
        raise ValueError(f"{key} must be 'remote_addr' or 'none'{callable_too}, got {value!r}")
    return str(text)


def _redis_url(key: str, value: Any) -> str | None:
    """None or empty: no Redis (in-process limits); else a redis://, rediss://, unix://,
    redis+sentinel:// or redis+cluster:// URL. The error shows the URL with its password
    masked."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or not value.strip().startswith(REDIS_SCHEMES):
        raise ValueError(
            f"{key} must be a {SCHEMES_TEXT} URL (or empty for in-process "
            f"limits), got {mask_url(value)!r}"
        )
    problem = redis_url_problem(value.strip())
    if problem is not None:
        raise ValueError(f"{key} {mask_url(value.strip())!r}: {problem}")
    return value.strip()


def _redis_prefix(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or "{" in value or "}" in value:
        raise ValueError(f"{key} must be a non-empty string without braces, got {value!r}")
    return value.strip()


def _refusal_message(key: str, value: Any) -> str | None:
    """None or empty: the built-in sentences (``reachlimit._answers``); else the refusal's
    sentence, a ``str.format`` text that may use ``{budget}`` and ``{retry_after}``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a text, got {value!r}")
    try:
        # Any budget name and whole number would do (mutants that keep the types are
        # equivalent); a format spec of the wrong type (budget:d) is refused.
        value.format(budget="default", retry_after=2)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        raise ValueError(
            f"{key} may use only the fields {{budget}} and {{retry_after}} (write {{{{ and "
            f"}}}} for braces), got {value!r}: {type(exc).__name__}: {exc}"
        ) from None
    return value.strip()


def _option(default: Any, check: Check, *, show: bool = True) -> Any:  # pragma: no mutate block
    return field(default=default, metadata={"check": check}, repr=show)


@dataclass(frozen=True)
class Settings:
    """One app's configuration, read once by ``init_app``.

    Each field is an option: its name in upper case after ``REACHLIMIT_`` is the config key,
    its name as it is the ``ReachLimit(...)`` argument, and its metadata holds its check."""

    #: False: every cold() and decorated view of the budget runs its build directly in the
    #: request (no cache, no singleflight, no limits, no Redis, no Cache-Status): for an
    #: app's tests, as Flask-Limiter's RATELIMIT_ENABLED. Also per budget.
    enabled: bool = _option(True, _flag)
    active: int = _option(2, _whole(1))
    queue: int = _option(8, _whole(0))
    wait: float = _option(3.0, _seconds)
    #: Whole seconds, or "auto": worked out per refusal from recent build times.
    retry_after: int | str = _option(2, _retry_after)
    cache_ttl: float = _option(300.0, _seconds)
    cache_size: int = _option(256, _whole(1))
    #: Seconds past its TTL an entry may still be answered while one refresh runs (0: off);
    #: with it, early refresh of entries near their TTL's end.
    stale: float = _option(0.0, _stale)
    status: int = _option(429, _one_of(429, 503))
    cancel_on_disconnect: bool = _option(True, _flag)
    #: Prometheus metrics (``reachlimit.prometheus``, needs prometheus_client).
    metrics: bool = _option(False, _flag)
    #: A Redis URL: one budget shared by every process on it (``reachlimit.redis``, needs
    #: redis-py). None or empty: in-process limits. Never shown in a repr (its password).
    redis_url: str | None = _option(None, _redis_url, show=False)
    #: The prefix of the shared limiter's keys (processes that share a budget share it).
    redis_prefix: str = _option("reachlimit", _redis_prefix)
    #: Seconds a shared build slot outlives a process that died without giving it back.
    lease: float = _option(10.0, _seconds)
    #: While Redis is unavailable: "local" (each process's own limits) or "refuse" (503).
    redis_fallback: str = _option("local", _choice("local", "refuse"))
    #: Who asks, for fair admission: "remote_addr", "none" (one client: plain FIFO), or (as
    #: the ReachLimit argument only) a callable ``(request) -> key``.
    client: str | ClientFunc = _option(CLIENT_REMOTE_ADDR, _client)
    #: The sentence of a busy refusal (queue full, timeout, displaced, deadline),
    #: ``{budget}`` and ``{retry_after}`` filled in; None: the built-in sentences, naming
    #: the budget.
    refusal_message: str | None = _option(None, _refusal_message)
    #: No wasted waits: a leader whose place in the queue cannot start within its wait by
    #: the estimate of build time is refused at once ("deadline"), not at its wait's end.
    deadline: bool = _option(True, _flag)

    @property
    def limiter_retry_after(self) -> int:
        """The whole seconds the limiter puts on its refusals: the setting, or with "auto"
        the default 2 (the extension works out each refusal's own figure instead)."""
        return self.retry_after if isinstance(self.retry_after, int) else 2


_CONFIG_PREFIX = "REACHLIMIT_"
OPTION_NAMES = frozenset(f.name for f in fields(Settings))

#: The config key of the named budgets: ``{"<name>": {"<option>": value, ...}, ...}`` (or
#: that as a JSON text, from the environment).
BUDGETS_KEY = "REACHLIMIT_BUDGETS"

#: Every config key the extension reads, e.g. for an app that takes them from the environment.
CONFIG_KEYS = (*(_CONFIG_PREFIX + f.name.upper() for f in fields(Settings)), BUDGETS_KEY)

#: The one REACHLIMIT_* name that is no config key and never warned about: the boot id a
#: gunicorn config exports (``reachlimit.gunicorn``; ``reachlimit.redis``'s owner ids).
NOT_CONFIG_KEYS = frozenset({BOOT_ID_VARIABLE})


def warn_unknown_keys(
    config: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> None:
    """Log one warning per ``REACHLIMIT_*`` key of ``config`` that the extension does not
    read, naming the nearest known key (a typo would otherwise be silently ignored); then
    the same for each ``REACHLIMIT_*`` variable of ``environ`` (``os.environ``, at
    ``init_app``) that is no config key, unless ``config`` has it too (warned about once,
    above). :data:`NOT_CONFIG_KEYS` are never warned about."""
    for key in _unknown(config):
        log.warning("unknown config key %s: reachlimit does not read it%s", key, _nearest(key))
    if environ is None:
        return
    for key in _unknown(environ):
        if key not in config:
            log.warning(
                "unknown environment variable %s: it is no reachlimit config key%s",
                key, _nearest(key),
            )


_KNOWN_NAMES = frozenset((*CONFIG_KEYS, *NOT_CONFIG_KEYS))


def _unknown(names: Mapping[str, Any]) -> list[str]:
    """The ``REACHLIMIT_*`` names of ``names`` that are neither config keys nor
    :data:`NOT_CONFIG_KEYS`, sorted."""
    return sorted(
        k for k in names
        if isinstance(k, str) and k.startswith(_CONFIG_PREFIX) and k not in _KNOWN_NAMES
    )


def _nearest(key: str) -> str:
    """"; did you mean <the nearest known key>?", or "" when none is near."""
    # Compared without the prefix every key shares (it would make any two look close).
    cut = len(_CONFIG_PREFIX)
    near = difflib.get_close_matches(
        key[cut:], sorted(k[cut:] for k in _KNOWN_NAMES),
        n=1,  # pragma: no mutate (only the best is shown: any n >= 1 has the same best first)
    )
    return f"; did you mean {_CONFIG_PREFIX}{near[0]}?" if near else ""


def read_settings(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> Settings:
    """Constructor arguments win over ``REACHLIMIT_*`` config keys, which win over defaults."""
    values: dict[str, Any] = {}
    for option in fields(Settings):
        name = option.name
        if name in overrides:
            key, raw = name + _ARGUMENT, overrides[name]
        else:
            key = _CONFIG_PREFIX + name.upper()
            raw = config.get(key, option.default)
        values[name] = option.metadata["check"](key, raw)
    return Settings(**values)


def client_of(
    setting: str | ClientFunc,
) -> ClientFunc | None:
    """What a budget's state holds for the ``client`` setting: None for "remote_addr" (read
    inline by the extension), else what gives the client of a request."""
    if setting == CLIENT_REMOTE_ADDR:
        return None
    if setting == CLIENT_NONE:
        return _nobody
    assert callable(setting)
    return _checked(setting)


def _nobody(request: Any) -> None:
    """REACHLIMIT_CLIENT="none": every request is the one anonymous client."""
    return None


def _checked(client: ClientFunc) -> ClientFunc:
    """The app's client callable, its value checked by the key rule (``reachlimit._keys``:
    str, bytes, int or a tuple of those, or None; a TypeError naming the callable otherwise,
    with and without Redis). Its own exceptions propagate unchanged: both are the app's bug,
    raised before anything is held."""

    def client_of(request: Any) -> Hashable:
        name = client(request)
        # The common case: no call. A shortcut: checked_client passes a str too, so a mutant
        # that never takes it is equivalent (not marked: a pragma would hide `is not`'s).
        if type(name) is str:
            return name
        return checked_client(name, client)

    return client_of


def warn_threads(threads: int | None, budgets: list[tuple[int, int]]) -> None:
    """Warn when gunicorn gives a worker (``threads``; None: not gunicorn) fewer threads
    than the ``(active, queue)`` of every budget added up, plus :data:`SPARE_THREADS`."""
    needed = sum(active + queue for active, queue in budgets) + SPARE_THREADS
    if threads is not None and threads < needed:
        # The why is no behaviour (no mutate); the figures and the advice are tested.
        log.warning(
            "gunicorn runs %d thread(s) per worker, fewer than active + queue + %d = %d "
            "(over the app's %d budget(s)): "
            "the queue can never fill and warm requests starve "  # pragma: no mutate
            "behind cold ones; "  # pragma: no mutate
            "start gunicorn with --threads %d or more",
            threads, SPARE_THREADS, needed, len(budgets), needed,
        )
