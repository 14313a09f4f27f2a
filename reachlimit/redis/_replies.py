"""The small integers the Redis limiter's scripts answer with, and a poll's request.

Shared by ``_limiter`` (acquire) and ``_wait`` (the waiting loop's polls); the same whether
the client decodes responses or not.
"""

from __future__ import annotations

# Replies of the scripts (small integers: cheap to send, the same with decode_responses on/off).
_FULL, _GRANTED, _QUEUED, _GIVEN_UP = 0, 1, 2, 3
_WAITING, _TIMEOUT, _CANCELLED, _GONE, _DISPLACED = 2, 3, 4, 5, 6  # poll replies
#: An acquire's or a poll's reply: refused because its place cannot start within its wait
#: (no wasted waits), ``{7, Retry-After in s}``.
_LATE = 7
#: What a displaced waiter's doorbell holds (bytes, or str with decode_responses).
_DISPLACED_BELL = (b"d", "d")
#: How a late waiter's doorbell begins: "l<its Retry-After in s>".
_LATE_BELL = (b"l", "l")
# What a poll tells Redis about the waiter.
_STAY, _GIVE_UP, _ABANDON = 0, 1, 2  # abandon = leave on an error: counted nowhere
