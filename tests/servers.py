"""Real servers for the tests: a gunicorn master run as a subprocess, and small HTTP helpers.

design:

    A :class:`GunicornServer` is one ``sys.executable -m gunicorn`` subprocess of the test
    process, on 127.0.0.1 only. What it serves and how is a parameter: the WSGI app spec, a
    config file (``-c``), extra environment, workers, threads, extra command-line options, and
    whether the bind address and the worker count go on the command line or into environment
    variables that a config file reads (``REACH_BIND``, ``REACH_WORKERS``).

    start   pick a free loopback port (bind to port 0, close), spawn, and wait - with one
            bounded deadline - until (1) the master holds the listening socket of that port
            (read from /proc, so a server that somebody else runs on "our" port is never
            mistaken for ours), (2) the readiness path answers 200 and the readiness check
            accepts the reply, and (3) the master has its workers. If gunicorn finds the port
            taken meanwhile ("Connection in use"), stop it and try another port.
    stop    by PID only: the master's workers (and anything under them) are read from
            ``/proc/<pid>/task/*/children`` just before, then SIGTERM to the master, SIGKILL
            after a bounded wait, SIGKILL to any recorded descendant still alive (checked to be
            the same process by its start time, never a recycled PID), and a bounded wait
            until the master and every worker ever seen are gone. A process that is still
            there fails the test.
    logs    stdout and stderr of the master go to ``<log_dir>/<name>.stdout`` / ``.stderr``
            (gunicorn's access log is on stdout when it is ``-``, its error log on stderr).

    :func:`reach_service` is the reach service (``webapp.wsgi:app``) set up that way, as an
    operator starts it: ``-c webapp/gunicorn.conf.py`` and the environment that file reads.

    In-process, :class:`WerkzeugServer` (and the context manager :func:`werkzeug_serving`)
    runs a WSGI app on Werkzeug's threaded server on 127.0.0.1 port 0, ``serve_forever`` in a
    daemon thread; shut down and joined with a timeout, and a thread still alive fails the test.

The helpers below (``Reply``, ``http_request``, ``raw_client``, ``wait_until``, ``free_port``,
``pid_alive``, ``check_refusal``, ``Herd``) are shared by the tests that talk to real servers;
``wait_until`` is also the one polling loop behind the in-process tests' ``wait_until`` of
``tests/conftest.py``. Nothing here sleeps to make a test pass: waits are for a state, with a
deadline that only a failing or hopelessly overloaded run ever reaches.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from werkzeug.serving import BaseWSGIServer

__all__ = [
    "CLIENT_TIMEOUT",
    "DEADLINE",
    "HOST",
    "ROOT",
    "GunicornServer",
    "Herd",
    "Reply",
    "WerkzeugServer",
    "check_refusal",
    "children",
    "free_port",
    "gunicorn_has",
    "http_request",
    "is_webapp_health",
    "pid_alive",
    "raw_client",
    "reach_service",
    "serving",
    "wait_until",
    "werkzeug_serving",
]

#: The repository root: gunicorn runs there, so ``tests.apps`` and ``webapp`` import.
ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
#: Upper bound on anything a test waits for that is certain to happen. Only a failing (or
#: hopelessly overloaded) run ever reaches it; no assertion depends on how close it gets.
DEADLINE = 20.0
#: Socket timeout of every client: longer than any wait a passing test can see.
CLIENT_TIMEOUT = 40.0
#: How long a master has to exit after SIGTERM (and again after SIGKILL), and its workers
#: after that. Longer than any graceful_timeout the tests' servers use (10 s at most).
STOP_TIMEOUT = 15.0
#: gunicorn's error line when the address it binds is taken (it then retries for ~5 s).
PORT_TAKEN = "Connection in use"


# -- small HTTP helpers ---------------------------------------------------------------------


class Reply(NamedTuple):
    """One answer; a tuple too, so ``status, headers, body = reply`` and ``reply[0]`` work."""

    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_request(port: int, method: str, path: str, timeout: float = CLIENT_TIMEOUT) -> Reply:
    """One request on its own connection, closed afterwards."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        body = resp.read()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
    finally:
        conn.close()


def raw_client(port: int, path: str, timeout: float = CLIENT_TIMEOUT) -> socket.socket:
    """A bare socket that has sent a whole GET for ``path`` and reads nothing."""
    sock = socket.create_connection((HOST, port), timeout=timeout)
    request = f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n\r\n"
    sock.sendall(request.encode("ascii"))
    return sock


def wait_until(
    what: object, probe: Callable[[], Any], timeout: float = DEADLINE, interval: float = 0.005
) -> Any:
    """Call ``probe`` until it returns something true (and return that); fail with
    ``AssertionError`` after ``timeout`` seconds. ``what`` names the state in the failure."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    """A loopback port that was free a moment ago (the caller retries if it is taken since)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def check_refusal(reply: Reply) -> None:
    """The refusal of spec §4: 429, Retry-After: 2, JSON {"error": str, "retryAfter": 2}."""
    assert reply.status == 429, reply
    assert reply.headers["retry-after"] == "2"
    assert reply.headers["content-type"].split(";")[0].strip() == "application/json"
    assert "no-store" in reply.headers.get("cache-control", "")
    body = reply.json()
    assert set(body) == {"error", "retryAfter"}
    assert isinstance(body["error"], str) and body["error"]
    assert body["retryAfter"] == 2


# -- in-process servers (Werkzeug) ----------------------------------------------------------


class WerkzeugServer:
    """``app`` on Werkzeug's threaded server in this process, on HOST port 0, served by a
    daemon thread from the start. :meth:`close` shuts it down and joins the thread."""

    def __init__(
        self, app: Any, *, poll_interval: float = 0.5, name: str = "werkzeug-server"
    ) -> None:
        from werkzeug.serving import make_server

        self.server: BaseWSGIServer = make_server(HOST, 0, app, threaded=True)
        self.port: int = self.server.server_port
        self.url = f"http://{HOST}:{self.port}"
        self.thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": poll_interval},
            name=name,
            daemon=True,
        )
        self.thread.start()

    def close(self, timeout: float = DEADLINE) -> None:
        """Shut the server down and join its thread within ``timeout`` s (alive: a failure)."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the server thread {self.thread.name!r} did not stop"


@contextlib.contextmanager
def werkzeug_serving(
    app: Any, *, poll_interval: float = 0.5, join_timeout: float = DEADLINE
) -> Iterator[WerkzeugServer]:
    """A :class:`WerkzeugServer` for the block; closed (and its thread joined) on the way out."""
    server = WerkzeugServer(app, poll_interval=poll_interval)
    try:
        yield server
    finally:
        server.close(join_timeout)


# -- processes (Linux /proc) ------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` from field 3 (state) on, or None if it is gone.
    The command name (field 2) may hold spaces and parentheses: split after its last ')'."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot; field 22): with the PID, it names one
    process for good, so a recycled PID is never taken for the process we saw."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat_fields(pid)
    if fields is None:
        return True  # no /proc to tell a zombie from a live process: assume live
    return fields[0] != "Z"


def _same_process_alive(pid: int, started: int | None) -> bool:
    """``pid`` is alive and is still the process that started at ``started``."""
    if not pid_alive(pid):
        return False
    return started is None or _start_time(pid) in (None, started)


def children(pid: int) -> list[int]:
    """The live child processes of ``pid``, from ``/proc/<pid>/task/<tid>/children`` (every
    thread of it: a child belongs to the thread that forked it). Without that file (a kernel
    without CONFIG_PROC_CHILDREN) the parent field of every ``/proc/<n>/stat`` is read."""
    found: set[int] = set()
    tasks = Path(f"/proc/{pid}/task")
    try:
        task_dirs = list(tasks.iterdir())
    except OSError:
        return []
    have_children_files = False
    for task in task_dirs:
        try:
            text = (task / "children").read_text()
        except OSError:  # no such file, or the thread ended meanwhile
            continue
        have_children_files = True
        found.update(int(c) for c in text.split())
    if not have_children_files:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                fields = _stat_fields(int(entry.name))
                if fields is not None and int(fields[1]) == pid:
                    found.add(int(entry.name))
    return sorted(c for c in found if pid_alive(c))


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (children, their children, ...), parents first."""
    out: list[int] = []
    frontier = [pid]
    while frontier:
        following: list[int] = []
        for p in frontier:
            for c in children(p):
                if c not in out:
                    out.append(c)
                    following.append(c)
        frontier = following
    return out


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on TCP ``port`` (IPv4 and IPv6), from /proc/net/tcp{,6}."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def holds_listener(pid: int, port: int) -> bool:
    """True when process ``pid`` holds a socket listening on TCP ``port``."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not wanted:
        return False
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in wanted:
                return True
        except OSError:
            continue  # closed meanwhile
    return False


# -- gunicorn -------------------------------------------------------------------------------


def gunicorn_has(setting: str) -> bool:
    """True when the installed gunicorn knows the setting ``setting``."""
    from gunicorn.config import KNOWN_SETTINGS

    return any(s.name == setting for s in KNOWN_SETTINGS)


#: Environment a test server never inherits from the test run: the settings of the apps it
#: serves, and gunicorn's own command-line override variable.
STRIPPED_ENV = ("REACH_", "REACHLIMIT_", "GUNICORN_CMD_ARGS")


class GunicornServer:
    """One gunicorn master and its worker(s), run as a subprocess for the tests.

    ``app`` is the WSGI app spec (``"webapp.wsgi:app"``, ``"pkg.mod:create_app()"``).
    ``config`` is passed as ``-c``; ``args`` are more command-line options, placed after the
    harness's own so they win. ``workers`` is how many worker processes the server must have
    before it counts as ready; it goes on the command line as ``--workers`` unless
    ``workers_env`` names an environment variable to put it in instead (one a config file
    reads). ``bind_env`` does the same for ``HOST:port``. ``threads`` and ``worker_class``
    are passed only when not None. ``ready_path`` must answer 200 and ``ready_check(server,
    reply)`` return true before :meth:`start` returns (return False for "this is not the
    server I started", which counts as a failed start); ``ready_timeout`` bounds that wait.
    """

    def __init__(
        self,
        app: str,
        log_dir: Path,
        name: str = "gunicorn",
        *,
        env: Mapping[str, str] | None = None,
        workers: int = 1,
        threads: int | None = None,
        worker_class: str | None = "gthread",
        config: str | os.PathLike[str] | None = None,
        args: Sequence[str] = (),
        bind_env: str | None = None,
        workers_env: str | None = None,
        access_log: bool = True,
        graceful_timeout: float | None = 5,
        ready_path: str = "/health",
        ready_check: Callable[[GunicornServer, Reply], bool] | None = None,
        ready_timeout: float = DEADLINE,
        stripped_env: Sequence[str] = STRIPPED_ENV,
    ) -> None:
        self.app = app
        self.name = name
        self.env = dict(env or {})
        self.workers = workers
        self.threads = threads
        self.worker_class = worker_class
        self.config = config
        self.args = list(args)
        self.bind_env = bind_env
        self.workers_env = workers_env
        self.access_log = access_log
        self.graceful_timeout = graceful_timeout
        self.ready_path = ready_path
        self.ready_check = ready_check
        self.ready_timeout = ready_timeout
        self.stripped_env = tuple(stripped_env)
        self.stdout_path = log_dir / f"{name}.stdout"  # the access log, when it is "-"
        self.stderr_path = log_dir / f"{name}.stderr"  # gunicorn's and the app's log
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        #: Every worker (or other descendant) PID seen, with its start time.
        self.seen: dict[int, int | None] = {}

    # -- life cycle -------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "gunicorn"]
        if self.config is not None:
            cmd += ["-c", str(self.config)]
        if self.worker_class is not None:
            cmd += ["-k", self.worker_class]
        if self.workers_env is None:
            cmd += ["--workers", str(self.workers)]
        if self.threads is not None:
            cmd += ["--threads", str(self.threads)]
        if self.bind_env is None:
            cmd += ["--bind", f"{HOST}:{self.port}"]
        if self.access_log:
            cmd += ["--access-logfile", "-"]
        if self.graceful_timeout is not None:
            cmd += ["--graceful-timeout", f"{self.graceful_timeout:g}"]
        cmd += ["--chdir", str(ROOT)]
        if gunicorn_has("control_socket_disable"):
            # gunicorn >= 25.1 opens a control socket at one fixed path per user by default;
            # several test servers at once (or a developer's own gunicorn) would collide.
            cmd.append("--no-control-socket")
        cmd += self.args
        cmd.append(self.app)
        return cmd

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(self.stripped_env)}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        if self.bind_env is not None:
            env[self.bind_env] = f"{HOST}:{self.port}"
        if self.workers_env is not None:
            env[self.workers_env] = str(self.workers)
        return env

    def start(self, attempts: int = 3) -> None:
        for _ in range(attempts):
            self.port = free_port()
            self._spawn()
            if self._wait_ready():
                return
            stderr = self.stderr()
            self.stop()
            if PORT_TAKEN not in stderr:
                raise RuntimeError(f"gunicorn did not come up on port {self.port}:\n{stderr}")
        raise RuntimeError(f"gunicorn found its port taken {attempts} times in a row")

    def _spawn(self) -> None:
        self.seen.clear()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=ROOT,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )

    def _wait_ready(self) -> bool:
        """True once this server is ready; False when it found its port taken (or something
        that is not ours answered); AssertionError when it is not ready after ready_timeout."""
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None or PORT_TAKEN in self.stderr():
                return False
            if holds_listener(self.proc.pid, self.port):
                try:
                    reply = http_request(self.port, "GET", self.ready_path, timeout=2)
                except (OSError, http.client.HTTPException):
                    reply = None
                if reply is not None and reply.status == 200:
                    if self.ready_check is not None and not self.ready_check(self, reply):
                        return False
                    if len(self.worker_pids()) >= self.workers:
                        return True
            time.sleep(0.05)
        raise AssertionError(f"gunicorn not ready after {self.ready_timeout} s:\n{self.stderr()}")

    def worker_pids(self) -> list[int]:
        """The master's live child processes now (gunicorn's workers); each is remembered,
        so :meth:`stop` checks it is gone even if the master replaced it meanwhile."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        pids = children(self.proc.pid)
        for pid in pids:
            self.seen.setdefault(pid, _start_time(pid))
        return pids

    def stop(self) -> None:
        """SIGTERM to the master by its PID, SIGKILL if it lingers; then check that it and
        every worker it had are gone."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            for pid in descendants(proc.pid):
                self.seen.setdefault(pid, _start_time(pid))
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=STOP_TIMEOUT)
        assert proc.returncode is not None
        assert not pid_alive(proc.pid)
        # A master killed by SIGKILL leaves its workers behind (they notice and exit, but
        # only after a while); kill those that are still the processes we saw.
        for pid, started in self.seen.items():
            if _same_process_alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid, started in self.seen.items():

            def gone(pid: int = pid, started: int | None = started) -> bool:
                return not _same_process_alive(pid, started)

            wait_until(f"worker {pid} to exit", gone, timeout=STOP_TIMEOUT)

    def processes_gone(self) -> bool:
        """True when the master and every worker seen are gone (after :meth:`stop`)."""
        if self.proc is None:
            return True
        if self.proc.poll() is None or pid_alive(self.proc.pid):
            return False
        return not any(_same_process_alive(p, s) for p, s in self.seen.items())

    # -- talking to it ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def request(self, method: str, path: str, timeout: float = CLIENT_TIMEOUT) -> Reply:
        return http_request(self.port, method, path, timeout=timeout)

    def get(self, path: str) -> Reply:
        return http_request(self.port, "GET", path)

    def get_json(self, path: str) -> Any:
        reply = self.get(path)
        assert reply.status == 200, reply
        return reply.json()

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@contextlib.contextmanager
def serving(server: GunicornServer, check_log: bool = True) -> Iterator[GunicornServer]:
    """Start ``server``; stop it (and check it is gone) on the way out, whatever happened;
    then, unless ``check_log`` is false, fail if its log holds a traceback."""
    try:
        server.start()
        yield server
    finally:
        server.stop()
    if check_log:
        assert "Traceback" not in server.stderr(), server.stderr()


# -- the reach service (webapp) -------------------------------------------------------------

#: The reach service's WSGI app and the gunicorn config file operators start it with.
WEBAPP_APP = "webapp.wsgi:app"
WEBAPP_CONFIG = ROOT / "webapp" / "gunicorn.conf.py"


def is_webapp_health(server: GunicornServer, reply: Reply) -> bool:
    """A ``ready_check``: the reply is the reach service's ``/api/health``."""
    body = reply.json()
    return bool(body.get("status") == "ok" and "reach" in body)


def reach_service(
    log_dir: Path,
    db: Path,
    name: str = "webapp",
    *,
    workers: int = 1,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> GunicornServer:
    """The reach service as an operator starts it: ``gunicorn -c webapp/gunicorn.conf.py
    webapp.wsgi:app`` on database ``db``, with the bind address and the worker count in the
    environment the config file reads (``REACH_BIND``, ``REACH_WORKERS``) and threads, worker
    class, logs and graceful timeout the config file's. ``env`` adds to the environment;
    ``options`` (keyword arguments of :class:`GunicornServer`) override any of this."""
    settings: dict[str, Any] = {
        "config": WEBAPP_CONFIG,
        "env": {"REACH_DB": str(db), **(env or {})},
        "workers": workers,
        "workers_env": "REACH_WORKERS",
        "bind_env": "REACH_BIND",
        "threads": None,  # the config file's
        "worker_class": None,  # the config file's
        "access_log": False,  # the config file's ("-": stdout)
        "graceful_timeout": None,  # the config file's
        "ready_path": "/api/health",
        "ready_check": is_webapp_health,
    }
    settings.update(options)
    return GunicornServer(WEBAPP_APP, log_dir, name, **settings)


# -- clients --------------------------------------------------------------------------------


class Herd:
    """Clients released together by a Barrier, each on its own connection, one per path.

    ``order`` lists the indexes of the replies in the order they came back."""

    def __init__(self, port: int, paths: list[str]) -> None:
        self.paths = paths
        self.replies: list[Reply | BaseException | None] = [None] * len(paths)
        self.order: list[int] = []  # guarded by _cond
        self._cond = threading.Condition()
        self._done = 0  # guarded by _cond
        self._barrier = threading.Barrier(len(paths))
        self._threads = [
            threading.Thread(target=self._run, args=(port, i, p), daemon=True)
            for i, p in enumerate(paths)
        ]
        for t in self._threads:
            t.start()

    def _run(self, port: int, i: int, path: str) -> None:
        reply: Reply | BaseException
        try:
            self._barrier.wait(timeout=DEADLINE)
            reply = http_request(port, "GET", path)
        except BaseException as exc:  # recorded, and failed on in results()
            reply = exc
        with self._cond:
            self.replies[i] = reply
            self.order.append(i)
            self._done += 1
            self._cond.notify_all()

    def wait_done(self, n: int) -> list[Reply]:
        """Wait until ``n`` replies are in; return the ones in so far."""
        with self._cond:
            assert self._cond.wait_for(lambda: self._done >= n, DEADLINE), (
                f"only {self._done} of {n} replies after {DEADLINE} s"
            )
            finished = [r for r in self.replies if r is not None]
        for r in finished:
            assert isinstance(r, Reply), r
        return finished  # type: ignore[return-value]

    def join(self) -> None:
        deadline = time.monotonic() + CLIENT_TIMEOUT + 5
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
            assert not t.is_alive(), "a client thread did not finish"

    def results(self) -> list[Reply]:
        self.join()
        for r in self.replies:
            assert isinstance(r, Reply), r
        return self.replies  # type: ignore[return-value]
