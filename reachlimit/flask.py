"""Flask extension: run expensive endpoints through :class:`~reachlimit.ColdPath` budgets.

design::

    rl.cold(key, build) / budget.cold(key, build)      (the request's handler thread)
      app.extensions["reachlimit"] -> the default budget's state; .budgets -> every budget
      key    str, bytes, int or a tuple of those (reachlimit._keys), else TypeError: first,
             so nothing is held or counted; the same rule in process and on Redis
      client(request), the app's callable (REACHLIMIT_CLIENT "none": None), on every call
                                     (its exception propagates; a value that breaks the key
                                     rule is a TypeError: before the path, so nothing held)
      disabled budget (REACHLIMIT_ENABLED false, or enabled=False): the build runs here and
               now through the value rule, its value returned; no cache, singleflight,
               limiter, Redis, socket watch or Cache-Status (the key and client rules hold)
      ColdPath.fetch_warm_fields(key, build)   a fresh or stale entry: its value returned
                                       at once; its Cache-Status (RFC 9211) is left in the
                                       request's environ, for the app's WSGI callable to send
                                       (init_app wraps app.wsgi_app: _sending_cache_status)
      on a miss only: client = request.remote_addr (the default, "remote_addr"), and
             cancel = a watch on the client's socket (gunicorn / Werkzeug), or None
      ColdPath.fetch_cold(key, build, cancel, client)
        value ........................ returned, with its Cache-Status, as above
        Busy ......................... ColdRefused: 429 (or 503) JSON naming the budget,
                                       Retry-After, Cache-Status ...; fwd-status=429
        Busy("unavailable") .......... 503 JSON, Retry-After (Redis down, fallback "refuse")
        Cancelled .................... 499, logged; nobody is left to read it
        anything build raised ........ propagates unchanged to the app's own handlers
      build, where the path runs it (its build_wrapper, set by reachlimit._budgets): its
               value through the value rule (reachlimit._values: bytes, str or JSON-able,
               decoded as Redis would; else TypeError naming the key, nothing cached); timed
               with REACHLIMIT_RETRY_AFTER="auto"; a refresh runs it in an app context
    @rl.cached / @budget.cached(...)   the view as the build, its whole 200 answer cached
                                       and replayed: reachlimit._cached; view.forget(...)
    rl.forget(key) / budget.forget(key) -> bool    one key off every level of the warm cache
    rl.clear_cache() / budget.clear_cache()        every key; on Redis both raise
                                       reachlimit.Unavailable when Redis cannot be reached

Refusals: ``ColdRefused`` is an ``HTTPException`` carrying its finished response; its handler
(ours, registered by ``init_app`` for exactly that class unless the app has its own) is found
before the app's ``errorhandler(429)`` or ``errorhandler(Exception)``: Flask looks by code,
then by the exception's own class before its bases. An app's ``errorhandler(ColdRefused)``
replaces ours, and its answer still gets the refusal's ``Cache-Status`` and (a 429/503
without one) ``Retry-After`` as it is sent.

Cache-Status is added to the headers as the answer is sent, by the wrapper ``init_app`` puts
around ``app.wsgi_app`` (a middleware the app adds, before or after, works as ever), not to
the response object: the app's own ``after_request`` functions do not see it. Added to the
response, werkzeug would copy and check it again on the way out: that and Flask's
after-request call cost a warm hit about a quarter of all the extension cost it.

Budgets: ``rl.budget(name, ...)`` declares one (a :class:`Budget`: its name and options),
before ``init_app`` (built there, in every app) or after (built in each app on first use);
what a budget is made of is ``reachlimit._budgets``. One ReachLimit per app. The extension
never stores the app: everything lives in ``app.extensions["reachlimit"]``, so one
``ReachLimit`` serves any number of apps.

Elsewhere (standard library only; names re-exported here): settings ``_flask_settings``,
budgets ``_budget_names`` and ``_budgets``, the decorator ``_cached``, "auto" Retry-After
``_retry_after``, Redis and ``release_worker`` ``_flask_redis``, texts ``_answers``, client
gone ``_cancel``. Only this module imports Flask. The client (fair admission) defaults to
``remote_addr``: the peer, or ProxyFix's rightmost trusted hop, never the leftmost
``X-Forwarded-For`` entry. A refresh (REACHLIMIT_STALE > 0) runs ``build`` outside the
request, in an app context: a build given to ``cold`` must read the request before (else it
fails there: logged once, the stale entry kept); ``cached`` views get a request context.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping
from functools import partial, update_wrapper
from types import MappingProxyType
from typing import Any, cast, overload

from flask import (
    Flask,
    Request,
    Response,
    current_app,
    has_app_context,
    has_request_context,
    jsonify,
    request,
)
from werkzeug.exceptions import HTTPException
from werkzeug.local import LocalProxy

from . import Busy, Cancelled, ColdPath, ColdPathStats
from ._answers import cache_status
from ._budget_names import DEFAULT_BUDGET, declare, read_budgets
from ._budgets import AppBudgets, BudgetState, metrics_group
from ._cached import CachedView, FlaskFace, bare_or_called, cached_view
from ._cancel import watch_client

# The settings, the "auto" Retry-After and the Redis wiring live in modules of their own
# (standard library only); their names are re-exported here, where they always were.
from ._flask_redis import REDIS_LIMITER_NAME as REDIS_LIMITER_NAME
from ._flask_redis import release_worker
from ._flask_settings import CLIENT_NONE as CLIENT_NONE
from ._flask_settings import CLIENT_REMOTE_ADDR as CLIENT_REMOTE_ADDR
from ._flask_settings import (
    CONFIG_KEYS,
    OPTION_NAMES,
    Settings,
    read_settings,
    warn_threads,
    warn_unknown_keys,
)
from ._flask_settings import RETRY_AFTER_AUTO as RETRY_AFTER_AUTO
from ._flask_settings import SPARE_THREADS as SPARE_THREADS
from ._keys import check_key
from ._retry_after import AutoRetryAfter
from ._values import run_ruled

__all__ = [
    "ReachLimit", "Budget", "ColdRefused", "ClientGone", "Settings", "CONFIG_KEYS",
    "release_worker", "check_threads", "AutoRetryAfter",
]

log = logging.getLogger("reachlimit")

#: Where cold() leaves the answer's Cache-Status (and a refusal's Retry-After) for the
#: app's WSGI callable to send (_sending_cache_status).
_STATUS_KEY = "reachlimit.cache_status"
_RETRY_KEY = "reachlimit.retry_after"

# The current app and request, each asked for its object once, with Werkzeug's
# ``LocalProxy._get_current_object()``: public despite its underscore (the way Flask's
# and Werkzeug's documentation give to reach the object behind a proxy). One look-up
# of the proxied object, where an attribute read through the proxy costs about six
# times as much. (Flask types its context proxies as the objects they stand for: the
# casts say what they are. Each proxy keeps the one function for its life.)
_current_app: Callable[[], Flask] = cast("LocalProxy[Flask]", current_app)._get_current_object
_current_request: Callable[[], Request] = cast(
    "LocalProxy[Request]", request
)._get_current_object

#: nginx's code for "client closed the request": nobody is left to read the answer.
STATUS_CLIENT_GONE = 499


class ColdRefused(HTTPException):
    """A refusal turned into its finished JSON response; ``busy`` is the library's reason,
    ``retry_after`` its whole seconds, ``budget`` the budget's name. ``init_app`` registers
    :func:`_send_finished` for this class unless the app has a handler of its own for it
    (before or after ``init_app``: see the module's design note for what the app's answer
    keeps). The class's ``code`` is what Flask files handlers under; an instance's is its
    response's."""

    code = 429

    def __init__(self, response: Response, busy: Busy, budget: str = DEFAULT_BUDGET) -> None:
        super().__init__(response=response)
        self.code = response.status_code
        self.busy = busy
        self.retry_after = max(1, int(busy.retry_after))
        self.budget = budget


class ClientGone(HTTPException):
    """The client left while its request waited; answered (and logged) as 499."""

    code = STATUS_CLIENT_GONE

    def __init__(self) -> None:
        super().__init__(  # its body is never read (the client left): any body is the same
            response=Response(b"", status=f"{STATUS_CLIENT_GONE} Client Closed Request")
        )


def _send_finished(exc: ColdRefused | ClientGone) -> Response:
    """The error handler of our own exceptions: their finished response, as it is."""
    response = exc.response
    assert isinstance(response, Response)
    return response


#: A WSGI callable: ``app(environ, start_response)``, answering the body's pieces.
_WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _sending_cache_status(wsgi_app: _WSGIApp) -> _WSGIApp:
    """``wsgi_app`` (the app's ``app.wsgi_app``), sending with each answer the Cache-Status
    that cold() left in its request's environ, and a refusal's Retry-After on a 429 or 503
    that lacks it (an app's own refusal handler's): added to the headers as they are sent
    (the module's note says why)."""

    def app_sending_cache_status(
        environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            cache_status = environ.get(_STATUS_KEY)
            if cache_status is not None:
                # Added, not set: Cache-Status is a list (RFC 9211), and a header the view set
                # already (an upstream cache's entry, say) stays before ours. (Appended to
                # the list given, as a WSGI server adds its own.)
                headers.append(("Cache-Status", cache_status))
                if "fwd-status=" in cache_status and status[:4] in _REFUSED_STATUSES:
                    # A refusal (the last call was refused) answered 429 or 503: with its
                    # Retry-After, if the answer (an app's own refusal handler's) has none.
                    # (Header names in any case are the same header, to werkzeug as to HTTP.)
                    retry_after = environ.get(_RETRY_KEY)
                    if (
                        retry_after is not None
                        and ("Retry-After", retry_after) not in headers  # (as ours has it)
                        and all(name.lower() != "retry-after" for name, _ in headers)
                    ):
                        headers.append(("Retry-After", retry_after))
            return start_response(status, headers, exc_info)

        return wsgi_app(environ, start)

    # (What it wraps, as inspect.unwrap() finds it: Flask's own, or a middleware's.)
    return update_wrapper(app_sending_cache_status, wsgi_app, assigned=(), updated=())


#: The status lines' starts of the refusals that get a Retry-After.
_REFUSED_STATUSES = ("429 ", "503 ")


def _in_app_context(app: Flask, build: Callable[[], Any]) -> Callable[[], Any]:
    """``build``, run in an app context of ``app`` when none is active (a refresh's thread)."""

    def run() -> Any:
        if has_app_context():
            return build()
        with app.app_context():
            return build()

    return run


#: The apps whose ReachLimit was set up in this process (init_app), for check_threads.
_set_up: weakref.WeakSet[Flask] = weakref.WeakSet()


def check_threads(threads: int) -> None:
    """Warn (on the ``reachlimit`` logger) for each app set up in this process whose enabled
    budgets need more handler threads than ``threads``: ``active + queue`` of every budget,
    plus ``SPARE_THREADS`` (4). ``reachlimit.gunicorn``'s hooks
    call it with the worker's ``threads`` setting (once the worker, or the preloading master,
    has loaded the app); another threaded server's operator may call it with its own."""
    if not isinstance(threads, int):
        return  # not a number: nothing to compare
    for app in list(_set_up):
        state = app.extensions.get("reachlimit")
        if isinstance(state, BudgetState) and state.budgets is not None:
            warn_threads(threads, [(s.settings.active, s.settings.queue)
                                   for s in state.budgets.states.values() if s.enabled])


def _not_initialised() -> RuntimeError:
    return RuntimeError(
        "ReachLimit is not initialised on this app: "  # pragma: no mutate (words)
        "call init_app(app) first"  # pragma: no mutate (words)
    )


def _current_state() -> BudgetState:
    """The current app's default budget (``app.extensions["reachlimit"]``)."""
    try:
        state: BudgetState = _current_app().extensions["reachlimit"]
    except KeyError:
        raise _not_initialised() from None
    return state


def _current() -> tuple[Flask, Request]:
    return _current_app(), _current_request()


def _cold(state: BudgetState, key: Hashable, build: Callable[[], Any]) -> Any:
    """``cold()`` of budget ``state`` in the current request, its key checked already."""
    asking = _current_request()
    client: Hashable = None
    if not state.warm_first:  # (the common case goes straight to the warm read)
        if state.counters is not None:
            state.counters.ensure_running()  # the first request of this (forked) process
        # The app's client callable runs on every call, warm hits included: its failure (or
        # a value that breaks the key rule) leaves nothing behind, and an app's tests meet it.
        client_of = state.client_of
        if client_of is not None:
            client = client_of(asking)
        if not state.enabled:  # off (REACHLIMIT_ENABLED): the build, here and now
            return run_ruled(build, key, "")
    answer = state.path.fetch_warm_fields(key, build)  # (an Answer's fields)
    if answer is not None:
        asking.environ[_STATUS_KEY] = cache_status(answer)
        return answer[0]
    if state.client_of is None:
        # remote_addr is a plain attribute werkzeug set from environ["REMOTE_ADDR"]
        # (after ProxyFix, if the app has it): the cheapest read of it there is.
        client = asking.remote_addr
    return _cold_miss(state, asking, key, build, client)


def _cold_miss(
    state: BudgetState, asking: Request, key: Hashable, build: Callable[[], Any],
    client: Hashable,
) -> Any:
    """``cold()`` past a warm read that found nothing: layers 2 to 5 for ``client``."""
    path = state.path
    cancel = watch_client(asking.environ) if state.cancel_on_disconnect else None
    try:
        answer = path.fetch_cold(key, build, cancel, client)
    except Busy as busy:
        if state.retry_auto is not None:
            busy = state.auto_busy(busy)
        refusal = state.refusal(busy)
        environ = asking.environ
        environ[_STATUS_KEY] = refusal.cache_status
        environ[_RETRY_KEY] = refusal.retry_after
        # A one-item list rather than bytes: with Content-Length already among the
        # headers, the response need not measure and set it again.
        response = Response([refusal.body], refusal.status, refusal.headers)
        raise ColdRefused(response, busy, state.name) from None
    except Cancelled:
        # pragma below: an INFO line's words and argument are no behaviour
        log.info("client left while waiting for %r; answered 499", key)  # pragma: no mutate
        raise ClientGone() from None
    asking.environ[_STATUS_KEY] = cache_status(answer)
    return answer.value


def _decorator(
    state_of: Callable[[], BudgetState], key: Callable[..., Hashable] | None,
    mimetype: str | None,
) -> Callable[[Callable[..., Any]], CachedView]:
    """``cached(key=..., mimetype=...)`` of the budget ``state_of()`` finds."""

    def cold(cache_key: Hashable, build: Callable[[], Any]) -> Any:
        return _cold(state_of(), cache_key, build)  # the decorator checked its key

    def forget(cache_key: Hashable) -> bool:
        return state_of().forget(cache_key)

    face = FlaskFace(cold, forget, _current, _current_app, has_request_context)
    return partial(cached_view, face, key=key, mimetype=mimetype)


def _health(states: Mapping[str, BudgetState]) -> Response:
    """The health view's answer for an app's budgets (see ``ReachLimit.health_view``)."""
    # The figures first: reading them is what notices Redis failing, so the health of
    # Redis read after them agrees with them (never "degraded" beside "up").
    figures = {
        name: {**state.stats().as_dict(), "enabled": state.enabled}
        for name, state in states.items()
    }
    # One Redis per app: the health of any budget on it (none when every budget is off).
    redis = next((s.redis for s in states.values() if s.redis is not None), None)
    extra = {} if redis is None else {"redis": redis.figures()}
    default = figures[DEFAULT_BUDGET]
    # "reach": the default budget's figures under their old name, deprecated (one release).
    body = {"status": "ok", DEFAULT_BUDGET: default, "reach": default, "budgets": figures}
    response = jsonify({**body, **extra})
    response.headers["Cache-Control"] = "no-store"  # (any case: the same header)
    return response


class _Decorates:
    """The ``cached`` decorator :class:`ReachLimit` and :class:`Budget` share: each finds
    its budget in the current app with ``_state``."""

    def _state(self) -> BudgetState:
        raise NotImplementedError  # pragma: no cover (ReachLimit and Budget have their own)

    @overload
    def cached(self, view: Callable[..., Any], /) -> CachedView: ...

    @overload
    def cached(
        self, view: None = None, /, *, key: Callable[..., Hashable] | None = None,
        mimetype: str | None = None,
    ) -> Callable[[Callable[..., Any]], CachedView]: ...

    def cached(
        self, view: Callable[..., Any] | None = None, /, *,
        key: Callable[..., Hashable] | None = None, mimetype: str | None = None,
    ) -> Any:
        """A view decorator (the extension's: the default budget; a :class:`Budget`'s: that
        budget; see ``reachlimit._cached``): the view is the build, its whole answer the
        cached one, with ``Cache-Status``. ``@rl.cached`` and ``@rl.cached()`` are the same
        (and ``@budget.cached``, ``@budget.cached()``); ``key`` and ``mimetype`` are
        keyword-only (the one positional argument is the view).

        The view returns what Flask takes: a value (JSON-able -> JSON; str -> text, bytes ->
        octets, both of ``mimetype``, default text/plain; charset=utf-8 and
        application/octet-stream; ``NOT_FOUND`` -> 404), ``(body, status)``, ``(body,
        headers)``, ``(body, status, headers)`` or a Response. A tuple is Flask's tuple
        form, never a JSON list. Only a status-200 answer without ``Set-Cookie`` is cached
        and shared, whole (status, headers but hop-by-hop ones and Content-Length, body);
        any other answer is the answer of the request that built it alone. A streamed
        response is a TypeError naming the view.

        ``key(**view_args)`` -> str, bytes, int or a tuple of those (a TypeError otherwise,
        with and without Redis); default: the request's path and its query string's
        ``name=value`` pairs as sent, sorted by name; the endpoint is part of either.
        ``view.forget(query=None, /, **view_args) -> bool`` (in an app context) drops the
        entries of those view arguments (and that query: a str or bytes as sent, or a
        mapping) under each endpoint the view is registered at."""
        return bare_or_called(_decorator(self._state, key, mimetype), view)


class ReachLimit(_Decorates):
    """``ReachLimit(app=None, **overrides)``: the Flask face of :class:`~reachlimit.ColdPath`.

    Overrides are the config keys in lower case without the ``REACHLIMIT_`` prefix
    (``enabled``, ``active``, ``queue``, ``wait``, ``retry_after``, ``cache_ttl``, ``cache_size``,
    ``stale``, ``status``, ``cancel_on_disconnect``, ``metrics``, ``redis_url``,
    ``redis_prefix``, ``lease``, ``redis_fallback``, ``client``, ``refusal_message``,
    ``deadline``) and win over the app's config. They are the default budget's, and every
    budget's defaults.

    ``deadline`` (REACHLIMIT_DEADLINE, default true; also per budget): a leader whose place
    in the queue cannot start within ``wait`` by the limiter's estimate of build time is
    answered at once (429 and Retry-After, like a full queue) instead of waiting its whole
    wait to be told; false waits it out as before.

    ``enabled`` (REACHLIMIT_ENABLED, default true; also per budget) false turns the
    machinery off, for an app's tests: every ``cold()`` and decorated view runs its build
    directly in the request (no cache, singleflight, limits, Redis connection or
    ``Cache-Status``); the key, client and value rules still hold, so a test still catches
    their breaking. A disabled budget's figures stay at zero (``enabled: false`` in the
    health view).

    ``client`` (REACHLIMIT_CLIENT) says who asks, for fair admission: ``"remote_addr"``
    (default), ``"none"`` (plain FIFO), or - as an argument only - a callable ``(request) ->
    key`` (the authenticated user's id, say: str, bytes, int or a tuple of those, else a
    TypeError), called once per ``cold()``, warm hits included; None from it is the one
    anonymous client.

    ``retry_after="auto"`` works out each refusal's Retry-After from recent build times
    (:class:`AutoRetryAfter`; its clock and random source are attributes of
    ``app.extensions["reachlimit"].retry_auto``, for tests).

    With ``redis_url`` (REACHLIMIT_REDIS_URL) the cold limiters are shared by every process
    on that Redis and prefix; Redis failing is a degraded mode (``redis_fallback``), never an
    error of the app. Other kinds of guarded work: :meth:`budget`.
    """

    def __init__(self, app: Flask | None = None, **overrides: Any) -> None:
        unknown = sorted(set(overrides) - OPTION_NAMES)
        if unknown:
            raise TypeError(
                f"unknown ReachLimit option(s): {', '.join(unknown)}; "
                f"known: {', '.join(sorted(OPTION_NAMES))}"
            )
        self._overrides = dict(overrides)
        #: Every budget declared, by name (the default one is always there).
        self._budgets: dict[str, Budget] = {DEFAULT_BUDGET: Budget(self, DEFAULT_BUDGET, {})}
        #: Budgets some init_app built from REACHLIMIT_BUDGETS alone (not declared then).
        self._from_config: set[str] = set()
        if app is not None:
            self.init_app(app)

    def budget(self, name: str, **overrides: Any) -> Budget:
        """Declare budget ``name`` (``[a-z0-9_-]{1,32}``; ValueError naming it otherwise)
        with its own options (``ReachLimit``'s names and checks, but ``metrics``,
        ``redis_url`` and ``redis_prefix``, which are the app's; TypeError for an unknown
        one, ValueError for a bad value, at once) and return it. Unset options are the
        budget's ``REACHLIMIT_BUDGETS`` entry's, then the app's settings.

        May be called before ``init_app`` (at import time, next to ``rl = ReachLimit()``):
        the budget is then built in each app at its ``init_app``. Called after, the budget
        is built in each app already initialised at its first use there (cold, cached,
        stats, the health and metrics views). ``rl.budget(name)`` again returns the same
        object; declaring a name again with other options is a ValueError, and so is
        declaring options, after an ``init_app``, for a budget that app built from its
        ``REACHLIMIT_BUDGETS`` alone (they could not reach it: declare it before)."""
        known = self._budgets.get(name)
        before = None if known is None else known.options
        if declare(name, overrides, before, self._from_config):
            self._budgets[name] = Budget(self, name, overrides)
        return self._budgets[name]

    def init_app(self, app: Flask) -> None:
        """Read the config (raising ``ValueError`` naming a bad key; warning of unknown
        ``REACHLIMIT_*`` keys, and of ``REACHLIMIT_*`` environment variables that are no
        config key), build this app's budgets, and warn when gunicorn gives the
        worker too few threads. ``RuntimeError`` when the app has a ``ReachLimit`` already
        (this one or another): one extension per app, and a budget per kind of work."""
        present = app.extensions.get("reachlimit")
        if present is not None:
            raise RuntimeError(
                "this app has a ReachLimit already (init_app was called twice, or by two "
                "ReachLimit objects): for another kind of guarded work, declare a budget on "
                "the one you have: reports = rl.budget('reports', active=1)"
            )
        warn_unknown_keys(app.config, os.environ)
        settings = read_settings(app.config, self._overrides)
        configured = read_budgets(app.config)
        # A refresh runs its build on a refresher thread: in an app context of its own.
        budgets = AppBudgets(
            self, settings, configured, metrics_group(settings), partial(_in_app_context, app)
        )
        for name, declared in self._budgets.items():  # the default first
            budgets.build(name, declared.options)
        only_configured = [name for name in configured if name not in self._budgets]
        for name in only_configured:
            budgets.build(name, {})
        self._from_config.update(only_configured)
        app.extensions["reachlimit"] = budgets.states[DEFAULT_BUDGET]
        spec = app.error_handler_spec.get(None, {})
        for answered in (ColdRefused, ClientGone):
            if answered not in spec.get(answered.code, {}):  # an app's own handler stays
                app.register_error_handler(answered, _send_finished)
        # (Installed where a middleware the app adds later, ProxyFix say, wraps it in turn.)
        app.wsgi_app = _sending_cache_status(app.wsgi_app)  # type: ignore[method-assign,assignment]
        _set_up.add(app)  # for check_threads, once a gunicorn hook knows the worker's threads

    def close(self, app: Flask | None = None) -> None:
        """Stop ``app``'s (default: the current app's) background work for good, in every
        budget: refreshers; on Redis the counters (flushed once more), the renewer, waker
        and flusher threads, then the connections. For the end of a process or a test; the
        budgets must not be used afterwards. Safe to call more than once."""
        state = (app or _current_app()).extensions.get("reachlimit")
        if not isinstance(state, BudgetState) or state.budgets is None:
            raise RuntimeError(
                "ReachLimit is not initialised on this app: call init_app(app)"  # pragma: no mutate
            )
        state.budgets.close()

    # -- per request ------------------------------------------------------------------

    def cold(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """Run the five layers for ``key`` in the current request (default budget) and return
        the value ``build`` returned, as the value rule makes it (``reachlimit._values``: a
        tuple comes back a list; what is not bytes, str or JSON-able is a ``TypeError``
        naming the key, raised where the build returned it, and nothing is cached).

        ``key`` is a str, bytes, int or a tuple of those (``True`` is the key ``1``), in
        process as on Redis: anything else (a float, a UUID, None) is a ``TypeError`` raised
        here, before anything is held or counted.

        A refusal raises :class:`ColdRefused` (the finished 429/503 response); a client that
        left while waiting raises :class:`ClientGone` (499); ``build``'s own exceptions pass
        through unchanged and are never cached. The request's client is worked out first:
        a client callable's exception, or a value of it that breaks the key rule
        (TypeError), reaches the app's error handlers before anything is held or counted.
        With the budget disabled (``enabled``), ``build`` runs at once and its value (by
        the value rule) is returned."""
        # (_current_state(), written out: a warm hit runs this)
        try:
            state: BudgetState = _current_app().extensions["reachlimit"]
        except KeyError:
            raise _not_initialised() from None
        if type(key) is not str:  # (a str passes the check: skipping it only saves time)
            check_key(key, "cold()")  # first: nothing held or counted, in process or not
        if state.warm_first:  # (_cold's way, written out: most calls are warm hits)
            asking = _current_request()  # (first: outside a request, nothing is counted)
            answer = state.path.fetch_warm_fields(key, build)
            if answer is not None:
                asking.environ[_STATUS_KEY] = cache_status(answer)
                return answer[0]
            return _cold_miss(state, asking, key, build, asking.remote_addr)
        return _cold(state, key, build)

    # The current app's default budget, for cached(): _current_state itself, not a method
    # calling it (a decorated view asks it on every request, a warm hit too).
    _state = staticmethod(_current_state)

    # -- figures and housekeeping -------------------------------------------------------

    @property
    def path(self) -> ColdPath:
        """The current app's default :class:`~reachlimit.ColdPath`."""
        return _current_state().path

    def settings(self) -> Settings:
        return _current_state().settings

    def stats(self) -> ColdPathStats:
        """The current app's figures (default budget): the limiter's plus the path's. On
        Redis, the whole service's (the path's counters as every process added them up in
        Redis, each at most about a second behind); while Redis is unavailable, this
        process's. A disabled budget's are zeros (its capacity as configured): nothing went
        through its path."""
        return _current_state().stats()

    def clear_cache(self) -> None:
        """Empty the current app's default warm cache (when it can be emptied; needs an app
        context). On Redis: every process's entries in Redis and this process's first level
        at once, every other process's first level within its ``local_ttl`` (1 s); raises
        :class:`reachlimit.Unavailable` (URL masked) when Redis cannot be reached - tried
        even while the health says Redis is down - and the fallback cache is emptied in any
        case."""
        _current_state().clear_cache()

    def forget(self, key: Hashable) -> bool:
        """Drop ``key`` (a ``cold()`` key of the default budget) from every level of the
        warm cache; True when it was there (on any level). Needs an app context. In process:
        the TTLCache entry, fresh or stale. On Redis: the shared entry (and its place in the
        cache's index), this process's first level and the fallback cache; every other
        process stops answering it within its first level's ``local_ttl`` (1 s). Raises
        :class:`reachlimit.Unavailable` (URL masked) when Redis cannot be reached, as
        :meth:`clear_cache`. A build of ``key`` running meanwhile stores its value when it
        ends. ``key`` follows :meth:`cold`'s rule (TypeError)."""
        return _current_state().forget(key)

    def health_view(self) -> Response:
        """A view function: ``{"status": "ok", "default": {<the default budget's
        figures>}, "budgets": {"<name>": {<figures>}, ...}}`` (every budget, the default
        included, each with ``enabled``: false for a disabled budget, whose figures are
        zeros); on Redis also ``"redis": {"url" (masked), "up", "down_for", "outages",
        "last_error"}``, and the figures are every process's (``backend: "redis"``), or
        this process's fallback's while Redis is unavailable (``degraded: true``).

        ``"reach"`` is the default budget's figures too, under the name they had before
        the key was the budget's name: deprecated, and gone in the next release."""
        return _health(self._all_states())

    def metrics_view(self) -> Response:
        """A view function: the Prometheus text format (``GET /metrics``) of every budget,
        each figure labelled ``budget``. With several gunicorn workers in prometheus_client's
        multiprocess mode, the figures of the whole server, whichever worker answers. 404
        when metrics are off; 503 (logged) when the figures cannot be read - never a
        traceback."""
        metrics = self._all_states()[DEFAULT_BUDGET].metrics
        if metrics is None:
            response = jsonify(error="metrics are off: set REACHLIMIT_METRICS=true")
            response.status_code = 404
            return response
        try:
            body = metrics.exposition()
        except Exception:
            log.exception("reachlimit metrics could not be read")  # pragma: no mutate (words)
            return Response("metrics unavailable\n", status=503, mimetype="text/plain")
        response = Response(body, content_type=metrics.content_type)
        response.headers["Cache-Control"] = "no-store"  # (any case: the same header)
        return response

    def _all_states(self) -> dict[str, BudgetState]:
        """Every budget of the current app, those declared since its init_app built now."""
        budgets = _current_state().budgets
        assert budgets is not None
        if budgets.owner is self:
            for declared in self._budgets.values():
                declared._state()
        return budgets.states


class Budget(_Decorates):
    """One budget of the apps a :class:`ReachLimit` serves: ``rl.budget(name, **options)``.

    Its ``cold``, ``cached``, ``forget``, ``stats``, ``clear_cache``, ``settings`` and
    ``path`` are the current app's, like the extension's own (which are the ``"default"``
    budget's). The object holds its name, its ``options`` and its ``ReachLimit``, never an
    app: it finds its state in ``app.extensions["reachlimit"]`` on every call (building it
    there on its first use in an app initialised before the budget was declared).
    ``rl.budget(name, enabled=False)`` turns this budget's machinery off (see
    ``ReachLimit``)."""

    def __init__(self, rl: ReachLimit, name: str, options: Mapping[str, Any]) -> None:
        self.rl = rl
        self.name = name
        #: The options it was declared with (read-only).
        self.options: Mapping[str, Any] = MappingProxyType(dict(options))

    def __repr__(self) -> str:
        return f"<reachlimit Budget {self.name!r}>"

    def cold(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """:meth:`ReachLimit.cold` in this budget."""
        state = self._state()
        if type(key) is not str:  # (as ReachLimit.cold)
            check_key(key, "cold()")
        return _cold(state, key, build)

    def stats(self) -> ColdPathStats:
        """:meth:`ReachLimit.stats` of this budget."""
        return self._state().stats()

    def forget(self, key: Hashable) -> bool:
        """:meth:`ReachLimit.forget` in this budget."""
        return self._state().forget(key)

    def clear_cache(self) -> None:
        """:meth:`ReachLimit.clear_cache` in this budget."""
        self._state().clear_cache()

    def settings(self) -> Settings:
        return self._state().settings

    @property
    def path(self) -> ColdPath:
        return self._state().path

    def _state(self) -> BudgetState:
        """This budget in the current app, built now if it was declared after the app's
        ``init_app`` (RuntimeError when the app's ReachLimit is another one)."""
        budgets = _current_state().budgets
        assert budgets is not None
        state = budgets.states.get(self.name)
        if state is not None:
            return state
        if budgets.owner is not self.rl:
            raise RuntimeError(
                f"budget {self.name!r} is not one of this app's: declare it with rl.budget("
                f"{self.name!r}, ...) on the ReachLimit that initialised "  # pragma: no mutate
                "the app"  # pragma: no mutate (words)
            )
        # (ensure() finds the state by name only for a thread that lost the race to build it)
        return budgets.ensure(self.name, self.options)
