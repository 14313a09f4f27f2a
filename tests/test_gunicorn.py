"""Saturation and the client-gone path under a real gunicorn ``-k gthread`` on 127.0.0.1.

design:

    Each server is a subprocess of this test process (``sys.executable -m gunicorn``), one
    worker, on a loopback port found free (bind to port 0, close, retry if gunicorn then finds
    it taken), waited for through ``/health`` with a bounded deadline, and stopped by its PID
    at teardown: SIGTERM, SIGKILL after a timeout, a bounded wait, then a check that the master
    and its worker are really gone. Servers are module-scoped so the file runs in seconds.
    The generic part of that harness is ``GunicornServer`` (``tests/support/gunicorn_server.py``);
    this file adds what is particular to the slow app.

    The app is ``tests/apps/slow_app.py``: every cold build waits on a gate the test opens
    (``POST /debug/release``), so "the builds are still held" is a fact read back from the
    server (``/debug/builds``: ``in_flight``, ``total``, ``gate_open``), not a duration hoped
    for. ``REACHLIMIT_WAIT`` is 30 s on these servers: while a test runs, no queued request can
    leave the queue by timing out, so every exit is a promotion (the test opened the gate) or a
    cancellation (the client left).

    Claims are proved by ordering, never by elapsed time: "refusals come back promptly" is
    "every refusal has come back while both builds are still held"; "warm hits stay fast" is
    "the warm hit came back while the gate was still closed". The one duration measured, the
    delay from a client's close to its queue place coming back, is printed, not asserted.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import urllib3
from urllib3.util.retry import Retry

from tests.support import HOST, ROOT
from tests.support.clients import (
    CLIENT_TIMEOUT,
    Herd,
    check_refusal,
    close_one_by_one,
    http_request,
    raw_client,
)
from tests.support.gunicorn_server import GunicornServer, serving
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gunicorn

APP = "tests.apps.slow_app:create_app()"

#: Threads of the main server: active + queue + 4 = 14 are needed; 16 is what webapp runs.
THREADS = 16
#: Threads of the herd server: a 30-request herd holds 30 threads while its build is held,
#: and the test still needs spare threads to read /health meanwhile.
HERD_THREADS = 40
#: The warning reachlimit.gunicorn's hooks log when gunicorn gives a worker too few threads.
THREAD_WARNING = "thread(s) per worker, fewer than active + queue"
#: A config with only those hooks.
THREADS_CONFIG = ROOT / "tests" / "apps" / "threads_gunicorn.conf.py"


# -- the server -----------------------------------------------------------------------------


class Gunicorn(GunicornServer):
    """One gunicorn master (and its one gthread worker) serving the slow app."""

    def __init__(
        self, log_dir: Path, threads: int, name: str, extra: tuple[str, ...],
        config: Path | None = None,
    ) -> None:
        super().__init__(
            APP,
            log_dir,
            name,
            config=config,
            env={
                # No queued request may time out while a test holds the gate (see the design).
                "REACHLIMIT_WAIT": "30",
                "SLOW_GATE_TIMEOUT": "45",
            },
            workers=1,
            threads=threads,
            args=extra,
            ready_path="/health",
            token_env="SLOW_APP_TOKEN",
            identity_path="/debug/builds",
        )

    # -- talking to it ------------------------------------------------------------------------

    def path(self, prefix: str) -> str:
        return f"/report/{prefix}-{uuid.uuid4().hex[:10]}"

    def health(self) -> dict[str, Any]:
        reply = self.get("/health")
        assert reply.status == 200, reply
        figures: dict[str, Any] = reply.json()["reach"]
        return figures

    def builds(self) -> dict[str, Any]:
        reply = http_request(self.port, "GET", "/debug/builds", timeout=5)
        assert reply.status == 200, reply
        figures: dict[str, Any] = reply.json()
        return figures

    def followers(self, path: str) -> int:
        key = path.rsplit("/", 1)[1]
        count: int = self.get(f"/debug/followers/{key}").json()["followers"]
        return count

    def hold(self) -> None:
        assert http_request(self.port, "POST", "/debug/hold").status == 200

    def release(self) -> None:
        assert http_request(self.port, "POST", "/debug/release").status == 200

    def wait_idle(self) -> None:
        def idle() -> bool:
            h = self.health()
            return bool(h["active"] == h["queued"] == 0 and self.builds()["in_flight"] == 0)

        wait_until("the server to be idle", idle)


@contextlib.contextmanager
def running(
    tmp_path_factory: pytest.TempPathFactory, threads: int, name: str, extra: tuple[str, ...] = (),
    config: Path | None = None,
) -> Iterator[Gunicorn]:
    server = Gunicorn(tmp_path_factory.mktemp(name), threads, name, extra, config)
    with serving(server):
        yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gunicorn]:
    with running(tmp_path_factory, THREADS, "main") as srv:
        yield srv


@pytest.fixture(scope="module")
def herd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gunicorn]:
    with running(tmp_path_factory, HERD_THREADS, "herd") as srv:
        yield srv


# -- clients --------------------------------------------------------------------------------


@dataclass
class Held:
    """A test's hold on a server's build gate, and everything the test started meanwhile."""

    server: Gunicorn
    herds: list[Herd] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    sockets: list[socket.socket] = field(default_factory=list)

    def herd(self, paths: list[str]) -> Herd:
        herd = Herd(self.server.port, paths)
        self.herds.append(herd)
        return herd

    def raw_client(self, path: str) -> socket.socket:
        sock = raw_client(self.server.port, path)
        self.sockets.append(sock)
        return sock


@contextlib.contextmanager
def held_gate(server: Gunicorn) -> Iterator[Held]:
    """Close the build gate on an idle server. On the way out, whatever happened: open it,
    close the raw sockets, join every client thread, and wait for the server to be idle."""
    server.wait_idle()
    server.hold()
    held = Held(server)
    try:
        yield held
    finally:
        server.release()
        for sock in held.sockets:
            sock.close()
        for herd in held.herds:
            herd.join()
        for t in held.threads:
            t.join(CLIENT_TIMEOUT + 5)
            assert not t.is_alive()
        server.wait_idle()


def saturate(held: Held, prefix: str) -> Herd:
    """Two held builds and eight queued leaders: every slot and queue place is taken."""
    herd = held.herd([held.server.path(f"{prefix}{i}") for i in range(10)])
    wait_until(
        "2 active and 8 queued",
        lambda: (lambda h: h["active"] == 2 and h["queued"] == 8)(held.server.health()),
    )
    return herd


# -- saturation: a burst, a herd, warm hits, clients that leave or retry --------------------


def test_forty_distinct_cold_keys_get_only_200s_and_429s(server: Gunicorn) -> None:
    with held_gate(server) as held:
        before, built_before = server.health(), server.builds()["total"]
        herd = held.herd([server.path(f"cold{i}") for i in range(40)])

        # Two builds take the slots and stay held, eight leaders queue (for up to 30 s):
        # the other thirty must all be answered while the gate is still closed.
        early = herd.wait_done(30)
        figures, during = server.builds(), server.health()
        assert not figures["gate_open"]
        assert figures["in_flight"] == 2
        assert figures["total"] - built_before == 2  # no build has finished, none other began
        assert [r.status for r in early] == [429] * 30
        for reply in early:
            check_refusal(reply)
        assert during["active"] == 2
        assert during["queued"] == 8
        assert during["rejected_full"] - before["rejected_full"] == len(early) == 30
        assert during["rejected_timeout"] == before["rejected_timeout"]

        held.server.release()
        replies = herd.results()

    statuses = Counter(r.status for r in replies)
    assert statuses == {200: 10, 429: 30}  # never a 5xx
    for path, reply in zip(herd.paths, replies, strict=True):
        if reply.status == 200:
            assert reply.json()["key"] == path.rsplit("/", 1)[1]
        else:
            check_refusal(reply)
    after, figures = server.health(), server.builds()
    assert figures["total"] - built_before == 10
    assert figures["max_in_flight"] == 2  # never more than two builds at once ...
    assert after["peak_active"] == 2  # ... as the limiter saw it too
    assert after["acquired"] - before["acquired"] == 10
    assert after["rejected_full"] - before["rejected_full"] == 30
    assert figures["gate_timeouts"] == 0


def test_same_key_herd_runs_one_build(herd_server: Gunicorn) -> None:
    server = herd_server
    with held_gate(server) as held:
        before, built_before = server.health(), server.builds()["total"]
        path = server.path("herd")
        herd = held.herd([path] * 30)

        # All thirty are inside the cold path while its one build is held: one leader,
        # twenty-nine followers attached to it, none of them in the limiter's queue.
        wait_until("29 followers", lambda: server.followers(path) == 29)
        during, figures = server.health(), server.builds()
        assert during["misses"] - before["misses"] == 30
        assert figures["in_flight"] == 1
        assert figures["total"] - built_before == 1
        assert during["active"] == 1
        assert during["queued"] == 0

        server.release()
        replies = herd.results()

    assert [r.status for r in replies] == [200] * 30
    assert len({r.body for r in replies}) == 1
    after = server.health()
    assert server.builds()["total"] - built_before == 1
    assert after["builds"] - before["builds"] == 1
    assert after["coalesced"] - before["coalesced"] == 29


def test_warm_hit_served_while_cold_work_is_saturated(server: Gunicorn) -> None:
    with held_gate(server) as held:
        warm_path = server.path("warm")
        server.release()
        warm = server.get(warm_path)
        assert warm.status == 200
        server.hold()

        before, built_before = server.health(), server.builds()["total"]
        herd = saturate(held, "busy")
        hit = server.get(warm_path)
        refused = server.get(server.path("late"))
        # Both came back while both builds were still held and the gate still closed.
        figures = server.builds()
        assert not figures["gate_open"]
        assert figures["in_flight"] == 2
        assert figures["total"] - built_before == 2
        assert hit.status == 200
        assert hit.body == warm.body
        check_refusal(refused)
        during = server.health()
        assert during["hits"] - before["hits"] == 1
        assert during["rejected_full"] - before["rejected_full"] == 1

        server.release()
        assert [r.status for r in herd.results()] == [200] * 10


def test_clients_that_leave_the_queue_free_their_places(server: Gunicorn) -> None:
    with held_gate(server) as held:
        built_before = server.builds()["total"]
        kept = held.herd([server.path(f"kept{i}") for i in range(7)])  # 2 build, 5 queue
        wait_until(
            "2 active and 5 queued",
            lambda: (lambda h: h["active"] == 2 and h["queued"] == 5)(server.health()),
        )
        gone_paths = [server.path(f"gone{i}") for i in range(3)]
        sockets = [held.raw_client(p) for p in gone_paths]
        wait_until("8 queued", lambda: server.health()["queued"] == 8)
        before = server.health()

        # The gate is closed and a wait lasts 30 s: the only way out of the queue now is
        # a cancellation. Close the clients one by one and see each place come back.
        def place_back(n: int) -> bool:
            h = server.health()
            return bool(h["cancelled"] - before["cancelled"] == n and h["queued"] == 8 - n)

        delays = close_one_by_one(sockets, place_back)
        print(
            "gunicorn: client close -> queue place back (incl. one /health poll): "
            + ", ".join(f"{d * 1000:.1f} ms" for d in delays)
        )

        after = server.health()
        assert after["queued"] == 5  # back to its value before the three came
        assert after["cancelled"] - before["cancelled"] == 3
        assert after["rejected_timeout"] == before["rejected_timeout"]
        assert after["active"] == 2
        assert server.builds()["total"] - built_before == 2  # a cancelled leader never builds

        # Each of them is in gunicorn's access log with status 499.
        def logged_499() -> bool:
            log = server.stdout()
            return all(f'"GET {p} HTTP/1.1" 499 ' in log for p in gone_paths)

        wait_until("three 499 lines in the access log", logged_499)

        server.release()
        assert [r.status for r in kept.results()] == [200] * 7


def test_a_leader_that_leaves_hands_over_to_its_followers(server: Gunicorn) -> None:
    with held_gate(server) as held:
        busy = held.herd([server.path(f"busy{i}") for i in range(2)])  # both slots held
        wait_until("2 active", lambda: server.health()["active"] == 2)
        before, built_before = server.health(), server.builds()["total"]
        path = server.path("shared")
        leader = held.raw_client(path)
        wait_until("the leader queued", lambda: server.health()["queued"] == 1)
        followers = held.herd([path] * 3)
        wait_until("3 followers", lambda: server.followers(path) == 3)
        deserter = held.raw_client(path)
        wait_until("4 followers", lambda: server.followers(path) == 4)

        def logged_499(times: int) -> bool:
            return server.stdout().count(f'"GET {path} HTTP/1.1" 499 ') == times

        # A follower that leaves gives up only its own wait (answered 499).
        deserter.close()
        wait_until("the deserter's 499", lambda: logged_499(1))
        assert server.health()["queued"] == 1
        assert server.health()["cancelled"] == before["cancelled"]

        # The leader leaves: its place comes back and one follower leads in its stead.
        leader.close()

        def handed_over() -> bool:
            h = server.health()
            return (
                h["cancelled"] - before["cancelled"] == 1
                and h["queued"] == 1
                and server.followers(path) == 2
            )

        wait_until("a follower to lead", handed_over)
        assert server.builds()["total"] - built_before == 0

        wait_until("the leader's 499 too", lambda: logged_499(2))

        server.release()
        replies = followers.results()
        assert [r.status for r in busy.results()] == [200, 200]

    assert [r.status for r in replies] == [200] * 3
    assert len({r.body for r in replies}) == 1
    assert server.builds()["total"] - built_before == 1  # one build for the shared key


def test_retrying_client_gets_through_a_saturated_server(server: Gunicorn) -> None:
    with held_gate(server) as held:
        herd = saturate(held, "busy")
        before = server.health()
        path = server.path("patient")
        outcome: dict[str, Any] = {}

        def fetch() -> None:
            retries = Retry(
                total=10,
                status_forcelist=[429],
                respect_retry_after_header=True,
                allowed_methods=None,
                backoff_factor=0,
            )
            pool = urllib3.PoolManager(retries=retries, timeout=CLIENT_TIMEOUT)
            try:
                outcome["reply"] = pool.request("GET", f"http://{HOST}:{server.port}{path}")
            except BaseException as exc:  # failed on below
                outcome["error"] = exc
            finally:
                pool.clear()

        client = threading.Thread(target=fetch, daemon=True)
        held.threads.append(client)
        client.start()
        # Its first try is refused (the queue is full) before anything is released.
        wait_until(
            "the first try to be refused",
            lambda: server.health()["rejected_full"] - before["rejected_full"] >= 1,
        )
        server.release()
        client.join(CLIENT_TIMEOUT)
        assert not client.is_alive()
        assert [r.status for r in herd.results()] == [200] * 10

    assert "error" not in outcome, outcome.get("error")
    reply = outcome["reply"]
    assert reply.status == 200
    assert json.loads(reply.data)["key"] == path.rsplit("/", 1)[1]
    history = reply.retries.history
    assert len(history) >= 1
    assert history[0].status == 429


# -- thread sizing --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("threads", "preload", "hooks", "warns"),
    [(4, False, True, True), (13, False, True, True), (14, False, True, False),
     (4, True, True, True), (4, False, False, False)],
    ids=["4", "13", "14", "4-preload", "4-without-the-hooks"],
)
def test_thread_sizing_warning(
    tmp_path_factory: pytest.TempPathFactory, threads: int, preload: bool, hooks: bool,
    warns: bool,
) -> None:
    """Logged once, by the process that loaded the app (the preloading master, or the
    worker), through the hooks of the config; without them nothing reads the setting."""
    extra = ("--preload",) if preload else ()
    config = THREADS_CONFIG if hooks else None
    name = f"threads{threads}{'-preload' if preload else ''}{'' if hooks else '-bare'}"
    with running(tmp_path_factory, threads, name, extra, config) as srv:
        stderr = srv.stderr()  # the app was loaded before /health answered
    if warns:
        assert stderr.count(THREAD_WARNING) == 1, stderr
        assert (
            f"gunicorn runs {threads} thread(s) per worker, fewer than "
            "active + queue + 4 = 14" in stderr
        ), stderr
        assert "--threads 14" in stderr
    else:
        assert THREAD_WARNING not in stderr, stderr


def test_no_thread_sizing_warning_with_16_threads(server: Gunicorn) -> None:
    assert server.threads == 16
    assert THREAD_WARNING not in server.stderr()
