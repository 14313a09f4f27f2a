"""A gunicorn master run as a subprocess, on 127.0.0.1 only, for the tests and the HTTP
benchmark alike.

design:

    A :class:`GunicornServer` is one ``sys.executable -m gunicorn`` subprocess of the calling
    process. What it serves and how is a parameter: the WSGI app spec, a config file (``-c``),
    extra environment, workers, threads, extra command-line options, the folder it runs in,
    and whether the bind address and the worker count go on the command line or into
    environment variables that a config file reads (``REACH_BIND``, ``REACH_WORKERS``).

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
            there is an ``AssertionError``.
    logs    stdout and stderr of the master go to ``<log_dir>/<name>.stdout`` / ``.stderr``
            (gunicorn's access log is on stdout when it is ``-``, its error log on stderr).

    :func:`reach_service` is the reach service (``webapp.wsgi:app``) set up that way, as an
    operator starts it: ``-c webapp/gunicorn.conf.py`` and the environment that file reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tests.support import HOST, ROOT
from tests.support.clients import CLIENT_TIMEOUT, Reply, http_request
from tests.support.processes import (
    children,
    descendants,
    die_with_parent,
    free_port,
    holds_listener,
    pid_alive,
    same_process_alive,
    start_time,
)
from tests.support.waiting import DEADLINE, wait_until

#: How long a master has to exit after SIGTERM (and again after SIGKILL), and its workers
#: after that. Longer than any graceful_timeout the tests' servers use (10 s at most).
STOP_TIMEOUT = 15.0
#: gunicorn's error line when the address it binds is taken (it then retries for ~5 s).
PORT_TAKEN = "Connection in use"


def gunicorn_has(setting: str) -> bool:
    """True when the installed gunicorn knows the setting ``setting``."""
    from gunicorn.config import KNOWN_SETTINGS

    return any(s.name == setting for s in KNOWN_SETTINGS)


#: Environment a test server never inherits from the test run: the settings of the apps it
#: serves, and gunicorn's own command-line override variable.
STRIPPED_ENV = ("REACH_", "REACHLIMIT_", "GUNICORN_CMD_ARGS")


@dataclasses.dataclass(eq=False, repr=False)
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
    ``chdir`` is where gunicorn runs (the repository root unless told otherwise); with
    ``die_with_parent`` Linux stops the master should the process that started it die.
    With ``token_env``, the app gets a fresh token in that environment variable and must show
    it, with its ``pid``, in the JSON of ``identity_path`` (the readiness reply when None)
    before the server counts as ready: an answer without it is somebody else's server on
    "our" port. The PID is kept as ``worker_pid``.
    """

    app: str
    log_dir: Path
    name: str = "gunicorn"
    _: dataclasses.KW_ONLY
    env: Mapping[str, str] | None = None
    workers: int = 1
    threads: int | None = None
    worker_class: str | None = "gthread"
    config: str | os.PathLike[str] | None = None
    args: Sequence[str] = ()
    bind_env: str | None = None
    workers_env: str | None = None
    access_log: bool = True
    graceful_timeout: float | None = 5
    ready_path: str = "/health"
    ready_check: Callable[[GunicornServer, Reply], bool] | None = None
    ready_timeout: float = DEADLINE
    stripped_env: Sequence[str] = STRIPPED_ENV
    chdir: Path = ROOT
    die_with_parent: bool = False
    token_env: str | None = None
    identity_path: str | None = None

    def __post_init__(self) -> None:
        self.env = dict(self.env or {})
        self.args = list(self.args)
        self.stripped_env = tuple(self.stripped_env)
        #: This server's own token (see ``token_env``), and its worker's PID once it answered.
        self.token = uuid.uuid4().hex
        self.worker_pid: int | None = None
        self.stdout_path = self.log_dir / f"{self.name}.stdout"  # the access log, when it is "-"
        self.stderr_path = self.log_dir / f"{self.name}.stderr"  # gunicorn's and the app's log
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
        cmd += ["--chdir", str(self.chdir)]
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
        if self.token_env is not None:
            env[self.token_env] = self.token
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
                cwd=self.chdir,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                # Only a prctl runs in the child (see processes.die_with_parent).
                preexec_fn=die_with_parent() if self.die_with_parent else None,
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
                    if self.token_env is not None and not self._shows_our_token(reply):
                        return False
                    if self.ready_check is not None and not self.ready_check(self, reply):
                        return False
                    if len(self.worker_pids()) >= self.workers:
                        return True
            time.sleep(0.05)
        raise AssertionError(f"gunicorn not ready after {self.ready_timeout} s:\n{self.stderr()}")

    def _shows_our_token(self, reply: Reply) -> bool:
        if self.identity_path is not None:
            reply = http_request(self.port, "GET", self.identity_path, timeout=5)
        figures = reply.json() if reply.status == 200 else {}
        if figures.get("token") != self.token:
            return False  # somebody else's server answered on "our" port
        self.worker_pid = figures["pid"]
        return True

    def worker_pids(self) -> list[int]:
        """The master's live child processes now (gunicorn's workers); each is remembered,
        so :meth:`stop` checks it is gone even if the master replaced it meanwhile."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        pids = children(self.proc.pid)
        for pid in pids:
            self.seen.setdefault(pid, start_time(pid))
        return pids

    def stop(self) -> None:
        """SIGTERM to the master by its PID, SIGKILL if it lingers; then check that it and
        every worker it had are gone."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            for pid in descendants(proc.pid):
                self.seen.setdefault(pid, start_time(pid))
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
            if same_process_alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid, started in self.seen.items():

            def gone(pid: int = pid, started: int | None = started) -> bool:
                return not same_process_alive(pid, started)

            wait_until(f"worker {pid} to exit", gone, timeout=STOP_TIMEOUT)

    def processes_gone(self) -> bool:
        """True when the master and every worker seen are gone (after :meth:`stop`)."""
        if self.proc is None:
            return True
        if self.proc.poll() is None or pid_alive(self.proc.pid):
            return False
        return not any(same_process_alive(p, s) for p, s in self.seen.items())

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


ServerT = TypeVar("ServerT", bound="GunicornServer")


@contextlib.contextmanager
def serving(server: ServerT, check_log: bool = True) -> Iterator[ServerT]:
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
