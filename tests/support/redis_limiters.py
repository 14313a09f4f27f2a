"""Limiters on the test Redis and reads of what they keep there, shared by the Redis test
modules: the ``make_limiter`` fixture (``make_limiter(**kwargs)``: a ``RedisColdLimiter`` on
the test's ``plain_client``, whose calls go out pre-packed as on the extension's client, or on
``client=``, or a subclass as ``cls=``; every one made is closed at
teardown), the ``factory`` fixture built on it (``factory(cls)``: a factory with
``ColdLimiter``'s signature for the checks of ``tests/support/limiter_checks.py`` and
``tests/support/fairness.py``, each limiter on a fresh name), the scripts' answer codes
(``GRANTED``, ``QUEUED``, ``FULL``, ``POLL_*``) and what a poll tells Redis (``STAY``,
``GIVE_UP``), :class:`LimiterScript` (the limiter's script run by the test itself: ghosts; its
``first_of_two_promoted``, two of them queued behind a grant, the first handed its slot),
``doorbell`` (a waiter's doorbell key), ``server_ms`` (Redis's own clock in ms), ``state_of``
(every key matching a pattern with its full content) and ``burst_accounted`` (a shared
budget's figures once every request of a burst is counted there). The fixtures are
registered for the whole suite by ``tests/conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from reachlimit.redis import RedisColdLimiter, RedisLimiterStats
from tests.support.redis_clients import closed_at_teardown
from tests.support.redis_mutants import script_text
from tests.support.waiting import wait_until

#: What the limiter's scripts answer: an acquire (granted, queued, refused full) and a poll.
GRANTED, QUEUED, FULL = 1, 2, 0
POLL_GRANTED, POLL_WAITING, POLL_TIMEOUT, POLL_CANCELLED = 1, 2, 3, 4
#: What a poll tells Redis about its waiter (``lua/limiter.lua``'s poll, ARGV[4]): it stays,
#: or it gives up (its client left: counted cancelled).
STAY, GIVE_UP = 0, 1


def doorbell(lim: RedisColdLimiter, token: str) -> str:
    """The doorbell key of ``lim``'s waiter ``token`` (``T:w:<token>``, ``lua/README.md``);
    ``doorbell(lim, "*")`` matches every one of them."""
    return lim.keys[0].removesuffix("holders") + "w:" + token


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class LimiterScript:
    """``lua/limiter.lua`` (or the mutant installed on ``lim``:
    ``tests/support/redis_mutants.py``) run by the test itself on ``lim``'s budget, with its
    public key names and settings (the first of ``keys``, from which the script builds the
    others; ``settings()``, ``PRESENCE``), through
    ``client``: an attempt the test drives one script at a time. A *ghost* is one admitted by
    :meth:`acquire` that never polls nor renews unless the test does: what a process that died
    looks like from Redis (with a ``lim`` whose ``PRESENCE`` is long, a waiter that stays)."""

    def __init__(self, client: redis.Redis, lim: RedisColdLimiter) -> None:
        own = lim.settings()
        self.keys = lim.keys[:1]  # the script's one KEYS entry: T:holders
        #: ARGV[2] of every operation: the presence period, the lease, then the settings.
        self.figures = (
            f"{_ms(lim.PRESENCE)} {own['lease_ms']} {own['active']} {own['queue']} "
            f"{own['wait_ms']} {own['deadline']}"
        )
        self._script = client.register_script(script_text(lim))

    @classmethod
    def first_of_two_promoted(
        cls, client: redis.Redis, lim: RedisColdLimiter, first: str = "w1", second: str = "w2"
    ) -> LimiterScript:
        """The ghosts of ``lim`` (one slot, two queue places or more) in this state: a grant
        of ``lim``'s own held, ``first`` and ``second`` queued behind it, then that grant
        released: ``first`` is handed the slot (its doorbell rung), ``second`` still waits."""
        ghosts = cls(client, lim)
        holder = lim.acquire()
        assert ghosts.acquire(first)[0] == QUEUED
        assert ghosts.acquire(second)[0] == QUEUED
        holder.release()
        return ghosts

    def run(self, op: str, *args: str | int) -> Any:
        """One operation of the script with its own arguments (after the figures)."""
        return self._script(keys=self.keys, args=[op, self.figures, *args])

    def acquire(self, token: str, who: str = "-") -> tuple[int, int]:
        """An acquire of ``token`` for client id ``who`` ("-": the anonymous client):
        (status, the budget's wait in ms when queued; a late refusal's Retry-After in s;
        else 0)."""
        reply = self.run("acquire", token, who)
        if isinstance(reply, list):
            return int(reply[0]), int(reply[1])
        return int(reply), 0

    def poll(self, token: str, leaving: int = STAY) -> tuple[int, int]:
        """A poll of waiter ``token``: (outcome, milliseconds left of its wait)."""
        reply = self.run("poll", token, leaving)
        return int(reply[0]), int(reply[1])

    def release(self, token: str, timed: bool = False) -> int:
        """A release of ``token``'s slot: 1 if it was still its own (now freed), else 0.
        ``timed``: a waiter was promoted to it (Redis records how long it was held)."""
        return int(self.run("release", token, "t") if timed else self.run("release", token))

    def renew(self, *tokens: str) -> list[str]:
        """A renewal of ``tokens``' leases: the tokens Redis no longer holds."""
        return [t.decode() if isinstance(t, bytes) else str(t) for t in self.run("renew", *tokens)]


@pytest.fixture(name="make_limiter")
def make_limiter_fixture(plain_client: redis.Redis) -> Iterator[Callable[..., RedisColdLimiter]]:
    """``make_limiter(**kwargs)``: a limiter on the test's plain client (or ``client=``, or
    a subclass as ``cls=``); every one made is closed at teardown."""
    def build(**kwargs: Any) -> RedisColdLimiter:
        cls = kwargs.pop("cls", RedisColdLimiter)
        lim: RedisColdLimiter = cls(kwargs.pop("client", plain_client), **kwargs)
        return lim

    yield from closed_at_teardown(build)


@pytest.fixture(name="factory")
def factory_fixture(
    make_limiter: Callable[..., RedisColdLimiter],
) -> Callable[[type[RedisColdLimiter]], Callable[..., RedisColdLimiter]]:
    """``factory(cls)``: a limiter factory with ColdLimiter's signature
    (``make(active, queue, wait, clock)``), making ``cls`` on a fresh name each call. Every
    wait is a minute, except with a ``clock`` that steps on each read (a check that needs its
    waits to run out): then 0.05 s. Every limiter made is closed at teardown."""
    names = itertools.count()

    def for_class(cls: type[RedisColdLimiter]) -> Callable[..., RedisColdLimiter]:
        def make(
            active: int = 2, queue: int = 8, wait: float = 3.0, clock: Any = None, **_: Any
        ) -> RedisColdLimiter:
            runs_out = getattr(clock, "step", 0) > 0
            return make_limiter(
                cls=cls, name=f"check-{next(names)}", active=active, queue=queue,
                wait=0.05 if runs_out else 60.0,
            )  # fmt: skip

        return make

    return for_class


def refusals(stats: RedisLimiterStats) -> int:
    """Every refusal a shared limiter counted: the queue full, a wait ended (a timeout, or a
    waiter dropped for missing its presence), a place taken over (displaced), a wait that
    could not start in time (``deadline``, where the figures have it)."""
    deadline: int = getattr(stats, "deadline", 0)
    return stats.rejected_full + stats.rejected_timeout + stats.displaced + deadline


def burst_accounted(
    watch: RedisColdLimiter, burst: int, before: RedisLimiterStats | None = None
) -> RedisLimiterStats:
    """``watch``'s figures (a limiter of the test's on the budget of a service, with its
    settings) once every one of a ``burst`` of distinct cold keys sent since ``before`` (the
    figures read just before, nothing held or queued then; None: a budget not used yet) is
    accounted for in Redis: holding a slot, waiting in the queue, or refused and counted.

    Awaited, not read: while the requests arrive the figures lag them, and on a loaded machine
    a waiter whose process did not poll within its presence period (about a second) is
    dropped from the queue and refused "waited too long" - counted when it polls, its place
    perhaps taken by a later request of the burst - so the figures add up again only once
    it has polled."""
    if before is not None:
        assert before.active == before.queued == 0, before
    base = 0 if before is None else refusals(before)
    seen: list[RedisLimiterStats] = []

    def accounted() -> bool:
        stats = watch.stats()
        seen.append(stats)
        return stats.active + stats.queued + refusals(stats) - base == burst

    wait_until(f"the {burst} requests of the burst accounted for in Redis", accounted)
    return seen[-1]


def reservations_over(client: redis.Redis, tag: str) -> bool:
    """Whether no recovery reservation of the budget ``tag`` ("{<prefix>:<name>}") is in
    force on ``client``'s server: a process back from an outage reserves the other
    processes' shares for a moment (``lua/limiter.lua``'s Reservations), and a burst sent
    meanwhile finds fewer slots than the budget's."""
    until = client.hget(f"{tag}:stats", "reserved_until")
    return until is None or int(until) <= server_ms(client)


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def state_of(client: redis.Redis, pattern: str = "*") -> dict[str, Any]:
    """Every key matching ``pattern`` with its full content."""
    out: dict[str, Any] = {}
    for key in sorted(client.keys(pattern)):
        kind = client.type(key).decode()
        if kind == "zset":
            out[key.decode()] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            out[key.decode()] = client.hgetall(key)
        elif kind == "list":
            out[key.decode()] = client.lrange(key, 0, -1)
        elif kind == "set":  # the prefix's registry of limiter names
            out[key.decode()] = client.smembers(key)
        else:
            out[key.decode()] = client.get(key)
    return out
