"""Exceptions raised by reachlimit.

Both refusals share one base class so that a caller can catch "the limiter said no" in one
clause; only the Flask layer turns them into HTTP responses.
"""

from __future__ import annotations

__all__ = ["ReachLimitError", "Busy", "Cancelled", "LeaderFailed", "Unavailable"]


class ReachLimitError(Exception):
    """Base class of every exception reachlimit raises on purpose."""


class Busy(ReachLimitError):
    """The cold limiter refused the request.

    ``reason`` is ``"queue_full"`` (refused at once: every queue place was taken) or
    ``"timeout"`` (admitted to the queue, but no slot came free within the wait) or
    ``"displaced"`` (admitted, then its place was taken by a leader of a client that held
    fewer places: fair admission) or ``"deadline"`` (its place in the queue could not start
    within its wait by the limiter's estimate of build time: refused at once, or as soon as
    the estimate said so, instead of at the end of the wait) or ``"unavailable"`` (the shared
    limiter's Redis cannot be reached and its fallback is to refuse).
    ``retry_after`` is the whole number of seconds a client should wait before trying again.
    """

    QUEUE_FULL = "queue_full"
    TIMEOUT = "timeout"
    DISPLACED = "displaced"
    DEADLINE = "deadline"
    UNAVAILABLE = "unavailable"

    # No __init__ of our own: BaseException's C initialiser keeps the refusal path cheap
    # (a Python __init__ would more than double the cost of raising). The fields are args.
    args: tuple[str, int]

    @property
    def reason(self) -> str:
        """Why it refused: ``QUEUE_FULL``, ``TIMEOUT``, ``DISPLACED``, ``DEADLINE`` or
        ``UNAVAILABLE`` (their values; the class says what each means)."""
        return self.args[0]

    @property
    def retry_after(self) -> int:
        """Whole seconds: what the refusal's ``Retry-After`` says (a 429; a 503 when
        ``unavailable``)."""
        return self.args[1]

    def __str__(self) -> str:
        return f"busy ({self.reason}); retry after {self.retry_after} s"


class Cancelled(ReachLimitError):
    """The caller's cancel object was set before or while it waited."""

    def __str__(self) -> str:
        return "cancelled while waiting"


class LeaderFailed(ReachLimitError):
    """The leader of a shared flight (in another process) raised an exception.

    An exception object cannot cross a process, so a follower raises this one instead,
    carrying the name of the leader's exception type (``type_name``) and its message
    (``message``, cut to a bounded length).
    """

    args: tuple[str, str]

    @property
    def type_name(self) -> str:
        """The qualified name of the leader's exception type (``"KeyError"``), no module."""
        return self.args[0]

    @property
    def message(self) -> str:
        """``str()`` of the leader's exception, cut to a bounded length."""
        return self.args[1]

    def __str__(self) -> str:
        return f"the leader's build failed: {self.type_name}: {self.message}"


class Unavailable(ReachLimitError):
    """A shared-cache operation asked for explicitly (``clear_cache()``, ``forget()``) could
    not reach the shared backend: nothing is known to be done there. ``where`` is the
    backend's address with any password masked; ``reason`` says what failed (scrubbed of
    secrets too). Never raised on a request's path: there Redis failing is a degraded mode."""

    args: tuple[str, str]

    @property
    def where(self) -> str:
        """The shared backend's address (a Redis URL), any password masked."""
        return self.args[0]

    @property
    def reason(self) -> str:
        """What failed: the Redis client's error in one line, its type and message, any
        secret of the URL replaced by ``***``."""
        return self.args[1]

    def __str__(self) -> str:
        return f"the shared cache at {self.where} cannot be reached: {self.reason}"
