"""reachlimit.gunicorn: the hooks an app's gunicorn config imports.

In this process, on the environment (every variable the module reads or sets is put under
monkeypatch first): ``prepare`` makes or clears the metrics directory and draws the boot id
once per master PID; ``when_ready`` warns when workers multiply the limits; ``when_ready``
(preloaded) or ``post_worker_init`` warns once when the workers' threads are too few for the
apps set up in the process that loaded them; ``child_exit`` frees a dead worker's places
through ``reachlimit.flask.release_worker`` (a real Redis, a stand-in that records the call,
and one that fails: logged with the URL masked, never raised) and marks it dead for
prometheus_client; ``on_exit`` removes only a directory of its own. Under real gunicorn: a
config of the app's own composes its ``child_exit`` with ours and a SIGKILLed worker's
gauges leave the directory; a SIGHUP keeps the boot id and the directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

import reachlimit.flask
from reachlimit import gunicorn as hooks
from tests.support.gunicorn_server import GunicornServer, serving
from tests.support.processes import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

#: A name prepare() would never make, to tell a directory we gave from one it made.
GIVEN = "given-metrics"


class Log:
    """gunicorn's ``server.log``, as far as the hooks use it: each line as it would read."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def warning(self, message: str, *args: Any) -> None:
        self.lines.append(("warning", message % args))

    def info(self, message: str, *args: Any) -> None:
        self.lines.append(("info", message % args))

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


class Cfg:
    """gunicorn's ``cfg``, as far as the hooks read it."""

    def __init__(self, workers: int, threads: int = 16, preload_app: bool = False) -> None:
        self.workers = workers
        self.threads = threads
        self.preload_app = preload_app


class Server:
    def __init__(self, workers: int = 1, cfg: Cfg | None = None) -> None:
        self.log = Log()
        self.cfg = cfg or Cfg(workers)


class Worker:
    def __init__(self, pid: int, cfg: Cfg | None = None) -> None:
        self.pid = pid
        self.cfg = cfg or Cfg(1)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The test process's environment without any of the module's variables or the Redis
    URL; monkeypatch gives it back as it was, whatever the hooks set."""
    for name in (*hooks.VARIABLES, "REACHLIMIT_REDIS_URL"):
        monkeypatch.setenv(name, "")  # recorded even when absent, so teardown undoes a set
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture
def unimported(env: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """``env``, in a process that has not imported prometheus_client yet (as a master
    reading its config file; another test may have imported it here)."""
    env.delitem(sys.modules, "prometheus_client", raising=False)
    return env


def test_the_names_it_sets_are_never_taken_for_settings() -> None:
    from reachlimit.redis._common import BOOT_ID_VARIABLE

    assert hooks.BOOT_ID_VARIABLE == BOOT_ID_VARIABLE  # what reachlimit.redis reads
    internal = (hooks.MASTER_VARIABLE, hooks.TEMPORARY_VARIABLE)
    assert internal == ("_REACHLIMIT_GUNICORN_MASTER", "_REACHLIMIT_METRICS_TEMPORARY")
    assert not any(name.startswith("REACHLIMIT_") for name in internal)


def test_without_a_directory_prepare_makes_one_once_and_on_exit_removes_it(
    unimported: pytest.MonkeyPatch,
) -> None:
    hooks.prepare()
    made = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    boot = os.environ["REACHLIMIT_BOOT_ID"]
    assert made.is_dir() and made.name.startswith(hooks.TEMPORARY_PREFIX)
    assert os.environ[hooks.TEMPORARY_VARIABLE] == str(made)
    assert os.environ[hooks.MASTER_VARIABLE] == str(os.getpid())
    assert len(boot) == 8 and int(boot, 16) >= 0
    try:
        (made / "counter_1.db").write_bytes(b"a running worker's")
        hooks.prepare()  # the config read again (SIGHUP): the same master keeps everything
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(made)
        assert os.environ["REACHLIMIT_BOOT_ID"] == boot
        assert (made / "counter_1.db").exists()
    finally:
        hooks.on_exit(Server())
    assert not made.exists()


def test_a_given_directory_is_made_emptied_of_old_files_and_kept(
    env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "deep" / GIVEN
    env.setenv("PROMETHEUS_MULTIPROC_DIR", str(missing))
    hooks.prepare()
    assert missing.is_dir()
    existing = tmp_path / GIVEN
    existing.mkdir()
    for name in ("counter_11.db", "gauge_livesum_11.db", "notes.txt"):
        (existing / name).write_text("x")
    env.setenv("PROMETHEUS_MULTIPROC_DIR", str(existing))
    env.setenv(hooks.MASTER_VARIABLE, "1")  # as if another master had prepared before
    hooks.prepare()
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(existing)
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]  # only *.db go
    assert hooks.TEMPORARY_VARIABLE not in os.environ
    hooks.on_exit(Server())
    assert existing.is_dir() and missing.is_dir()  # never removed: they are the operator's


def test_a_master_started_by_another_makes_its_own_directory_and_boot_id(
    env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """gunicorn's USR2 upgrade: the new master inherits its parent's environment. The
    parent's temporary directory is left to the parent (its workers still write there)."""
    parents = tmp_path / "parents"
    parents.mkdir()
    (parents / "counter_7.db").write_text("the old master's worker")
    env.setenv("PROMETHEUS_MULTIPROC_DIR", str(parents))
    env.setenv(hooks.TEMPORARY_VARIABLE, str(parents))
    env.setenv(hooks.MASTER_VARIABLE, str(os.getppid()))
    env.setenv("REACHLIMIT_BOOT_ID", "0ldb00t0")
    hooks.prepare()
    made = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    try:
        assert made != parents and made.name.startswith(hooks.TEMPORARY_PREFIX)
        assert (parents / "counter_7.db").exists()
        assert os.environ["REACHLIMIT_BOOT_ID"] != "0ldb00t0"
    finally:
        hooks.on_exit(Server())
    assert not made.exists() and parents.exists()


def test_when_ready_warns_when_workers_multiply_the_limits(env: pytest.MonkeyPatch) -> None:
    env.setenv(hooks.MASTER_VARIABLE, str(os.getpid()))  # prepared
    one, three, shared = Server(1), Server(3), Server(3)
    hooks.when_ready(one)
    hooks.when_ready(three)
    env.setenv("REACHLIMIT_REDIS_URL", "redis://127.0.0.1:1/0")
    hooks.when_ready(shared)
    assert one.log.lines == [] and shared.log.lines == []
    [(level, line)] = three.log.lines
    assert level == "warning"
    assert line.startswith("reachlimit: 3 workers without REACHLIMIT_REDIS_URL: ")
    assert "limits multiply: up to 3 x REACHLIMIT_ACTIVE builds of each budget" in line


def test_when_ready_says_when_prepare_was_not_called(env: pytest.MonkeyPatch) -> None:
    server = Server(1)
    hooks.when_ready(server)
    assert "reachlimit.gunicorn.prepare() was not called" in server.log.text()


# -- the threads check -------------------------------------------------------------------------


@pytest.fixture
def set_up(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Flask]]:
    """``set_up(**config)``: a Flask app with a ReachLimit set up in this process; the apps
    of other tests are left out of the extension's record for this one."""
    monkeypatch.setattr(reachlimit.flask, "_set_up", weakref.WeakSet())
    made: list[Flask] = []

    def make(**config: Any) -> Flask:
        app = Flask(f"app{len(made)}")
        app.config.update(config)
        reachlimit.flask.ReachLimit(app)
        made.append(app)
        return app

    yield make
    for app in made:
        reachlimit.flask.ReachLimit().close(app)


def thread_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [line for line in warnings_of(caplog) if "thread(s) per worker" in line]


@pytest.mark.parametrize("preload", [True, False], ids=["preloaded", "loaded-by-the-worker"])
def test_too_few_threads_are_warned_about_once_by_the_process_that_loaded_the_app(
    env: pytest.MonkeyPatch, set_up: Callable[..., Flask], caplog: pytest.LogCaptureFixture,
    preload: bool,
) -> None:
    """Preloaded, the master loaded the app: ``when_ready`` warns, the workers do not
    again; else each worker's ``post_worker_init`` does, and the master (which loaded
    nothing) says nothing."""
    env.setenv(hooks.MASTER_VARIABLE, str(os.getpid()))  # prepared
    set_up(REACHLIMIT_ACTIVE=2, REACHLIMIT_QUEUE=8)  # needs 2 + 8 + 4 = 14
    caplog.set_level("WARNING", logger="reachlimit")
    cfg = Cfg(1, threads=13, preload_app=preload)
    hooks.when_ready(Server(cfg=cfg))
    by_master = thread_warnings(caplog)
    hooks.post_worker_init(Worker(7, cfg))
    said = thread_warnings(caplog)
    assert len(said) == 1 and len(by_master) == (1 if preload else 0), said
    assert said[0].startswith("gunicorn runs 13 thread(s) per worker, fewer than active + "
                              "queue + 4 = 14 (over the app's 1 budget(s)): ")


def test_enough_threads_or_no_number_say_nothing_and_each_app_is_checked(
    env: pytest.MonkeyPatch, set_up: Callable[..., Flask], caplog: pytest.LogCaptureFixture,
) -> None:
    set_up(REACHLIMIT_ACTIVE=2, REACHLIMIT_QUEUE=8)
    caplog.set_level("WARNING", logger="reachlimit")
    hooks.post_worker_init(Worker(7, Cfg(1, threads=14)))
    hooks.post_worker_init(Worker(7, Cfg(1, threads="13")))  # type: ignore[arg-type]
    assert thread_warnings(caplog) == []
    set_up(REACHLIMIT_ACTIVE=1, REACHLIMIT_QUEUE=20)  # a second app here needs 25
    hooks.post_worker_init(Worker(7, Cfg(1, threads=14)))
    [line] = thread_warnings(caplog)
    assert "fewer than active + queue + 4 = 25" in line


class ReleaseCalls:
    """A stand-in for reachlimit.flask.release_worker: records its calls, answers ``answer``
    (or raises it)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[Any, int]] = []

    def __call__(self, config: Any, pid: int) -> Any:
        self.calls.append((config, pid))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def test_child_exit_frees_through_release_worker_and_logs_what_it_freed(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv("REACHLIMIT_REDIS_URL", "redis://127.0.0.1:1/0")
    release = ReleaseCalls((2, 1))
    env.setattr(reachlimit.flask, "release_worker", release)
    server = Server()
    hooks.child_exit(server, Worker(4242))
    assert release.calls == [(os.environ, 4242)]
    assert server.log.lines == [
        ("info", "reachlimit: freed 2 build slot(s) and 1 queue place(s) of worker 4242")
    ]
    release.answer = (0, 0)
    quiet = Server()
    hooks.child_exit(quiet, Worker(4243))
    assert [pid for _, pid in release.calls] == [4242, 4243] and quiet.log.lines == []


def test_child_exit_without_a_redis_url_asks_nothing(env: pytest.MonkeyPatch) -> None:
    release = ReleaseCalls((1, 1))
    env.setattr(reachlimit.flask, "release_worker", release)
    server = Server()
    hooks.child_exit(server, Worker(4242))
    assert release.calls == [] and server.log.lines == []


def test_a_failure_is_logged_with_the_url_masked_and_never_raised(
    env: pytest.MonkeyPatch,
) -> None:
    secret = "hook-secret"
    env.setenv("REACHLIMIT_REDIS_URL", f"redis://u:{secret}@127.0.0.1:1/0")
    release = ReleaseCalls(ConnectionError(f"cannot reach u:{secret}@127.0.0.1:1"))
    env.setattr(reachlimit.flask, "release_worker", release)
    server = Server()
    hooks.child_exit(server, Worker(4242))  # must not raise
    [(level, line)] = server.log.lines
    assert level == "warning" and secret not in line
    assert line.startswith(
        "reachlimit: could not free the shared places of worker 4242 on "
        "redis://u:***@127.0.0.1:1/0 (ConnectionError: cannot reach u:***@127.0.0.1:1)"
    ), line


def test_an_unreachable_redis_is_logged_by_the_real_release_worker(
    env: pytest.MonkeyPatch,
) -> None:
    secret = "real-secret"
    env.setenv("REACHLIMIT_REDIS_URL", f"redis://u:{secret}@127.0.0.1:{free_port()}/0")
    server = Server()
    hooks.child_exit(server, Worker(4242))
    [(level, line)] = server.log.lines
    assert level == "warning" and "could not free the shared places of worker 4242" in line
    assert "u:***@127.0.0.1" in line and secret not in line


@pytest.fixture
def prepared(env: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A metrics directory given to prepare(), as an operator gives one."""
    directory = tmp_path / GIVEN
    env.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    hooks.prepare()
    return directory


def test_child_exit_drops_the_dead_workers_live_gauges_and_keeps_its_counters(
    prepared: Path,
) -> None:
    """The file names are prometheus_client's multiprocess ones (<kind>_<pid>.db)."""
    directory = prepared
    files = ["counter_4242.db", "histogram_4242.db", "gauge_livesum_4242.db",
             "gauge_liveall_4242.db", "gauge_livesum_4343.db"]
    for name in files:
        (directory / name).write_bytes(b"")
    hooks.child_exit(Server(), Worker(4242))
    assert sorted(p.name for p in directory.iterdir()) == [
        "counter_4242.db", "gauge_livesum_4343.db", "histogram_4242.db"
    ]


def test_a_failure_to_mark_a_worker_dead_is_logged_instead_of_raised(prepared: Path) -> None:
    (prepared / "gauge_livesum_4242.db").mkdir()  # os.remove cannot remove it
    server = Server()
    hooks.child_exit(server, Worker(4242))  # must not raise
    [(level, line)] = server.log.lines
    assert level == "warning"
    assert line.startswith("reachlimit: could not mark worker 4242 dead in the metrics "), line


def test_the_module_imports_only_the_standard_library() -> None:
    """Nor do the threads hooks import Flask where no app uses the extension."""
    code = (
        "import sys, types, reachlimit.gunicorn as hooks\n"
        "cfg = types.SimpleNamespace(threads=1, preload_app=False)\n"
        "hooks.post_worker_init(types.SimpleNamespace(cfg=cfg))\n"
        "bad = [m for m in ('flask', 'redis', 'prometheus_client', 'gunicorn', "
        "'reachlimit.flask', 'reachlimit.redis') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# -- under real gunicorn ---------------------------------------------------------------------

#: An app's own gunicorn config: our hooks, its own child_exit composed with ours.
OWN_CONFIG = '''\
from reachlimit import gunicorn as reachlimit_hooks
from reachlimit.gunicorn import on_exit, when_ready  # noqa: F401

reachlimit_hooks.prepare()
worker_class = "gthread"
threads = 16


def child_exit(server, worker):
    reachlimit_hooks.child_exit(server, worker)
    server.log.info("own child_exit for worker %d", worker.pid)
'''

APP = "tests.apps.hooks_app:create_app()"


def own_server(tmp_path: Path, workers: int = 1) -> GunicornServer:
    config = tmp_path / "own.conf.py"
    config.write_text(OWN_CONFIG)
    return GunicornServer(
        APP, tmp_path, "own", config=config, workers=workers, worker_class=None,
        threads=None, token_env="HOOKS_APP_TOKEN", identity_path="/who",
    )


def who(server: GunicornServer) -> dict[str, Any]:
    body: dict[str, Any] = server.get_json("/who")
    return body


@pytest.mark.gunicorn
def test_an_own_child_exit_composes_with_ours_under_real_gunicorn(tmp_path: Path) -> None:
    """A SIGKILLed worker: the app's own hook runs after ours, and ours dropped the dead
    worker's live gauge file (written by prometheus_client in the worker) while its counter
    file stays."""
    server = own_server(tmp_path)
    with serving(server):
        first = who(server)
        directory = Path(first["metrics_dir"])
        pid = first["pid"]
        assert directory.name.startswith(hooks.TEMPORARY_PREFIX)
        assert {f"gauge_livesum_{pid}.db", f"counter_{pid}.db"} <= set(os.listdir(directory))
        os.kill(pid, signal.SIGKILL)
        wait_until("the app's own child_exit",
                   lambda: f"own child_exit for worker {pid}" in server.stderr())
        names = set(os.listdir(directory))
        assert f"gauge_livesum_{pid}.db" not in names and f"counter_{pid}.db" in names
        wait_until("a new worker", lambda: any(p != pid for p in server.worker_pids()))
        second = who(server)
        assert second["pid"] != pid
        assert (second["boot_id"], second["metrics_dir"]) == (first["boot_id"], str(directory))
    assert not directory.exists()  # on_exit removed the directory it made


@pytest.mark.gunicorn
def test_a_reload_keeps_the_boot_id_and_the_directory(tmp_path: Path) -> None:
    server = own_server(tmp_path)
    with serving(server):
        before = who(server)
        old = before["pid"]
        os.kill(server.pid, signal.SIGHUP)  # gunicorn reads the config again, new workers

        def replaced() -> bool:
            pids = server.worker_pids()
            return bool(pids) and old not in pids

        wait_until("the old worker replaced", replaced)
        wait_until("the new worker answering", lambda: who(server)["pid"] != old)
        after = who(server)
        assert (after["boot_id"], after["metrics_dir"]) == (
            before["boot_id"], before["metrics_dir"]
        )
        assert Path(after["metrics_dir"], f"counter_{old}.db").exists()  # not wiped


# -- what the hooks say, and when (in this process) -------------------------------------------


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The reachlimit logger's warnings, each as it reads."""
    return [r.getMessage() for r in caplog.records
            if r.name == "reachlimit" and r.levelname == "WARNING"]


@pytest.mark.parametrize(
    ("imported", "given", "warned"),
    [(True, False, True), (True, True, False), (False, False, False)],
    ids=["imported-first", "directory-given", "not-imported"],
)
def test_prepare_warns_only_when_prometheus_client_came_first_without_a_directory(
    env: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    imported: bool, given: bool, warned: bool,
) -> None:
    """prometheus_client reads PROMETHEUS_MULTIPROC_DIR once, at its import: imported
    before prepare() made a directory, this process counts alone (warned, naming the
    variable, which stays unset so that reachlimit.prometheus, reading it, counts alone
    too); with the operator's directory already set when it was imported, it is right."""
    if imported:
        import prometheus_client

        env.setitem(sys.modules, "prometheus_client", prometheus_client)
    else:
        env.delitem(sys.modules, "prometheus_client", raising=False)
    if given:
        env.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / GIVEN))
    caplog.set_level("WARNING", logger="reachlimit")
    try:
        hooks.prepare()
        assert ("PROMETHEUS_MULTIPROC_DIR" in os.environ) is not warned
    finally:
        hooks.on_exit(Server())
    said = warnings_of(caplog)
    if warned:
        [line] = said
        assert "PROMETHEUS_MULTIPROC_DIR" in line and "prometheus_client" in line
    else:
        assert said == []


def test_two_workers_without_redis_are_warned_about_naming_the_figures(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv(hooks.MASTER_VARIABLE, str(os.getpid()))  # prepared
    server = Server(2)
    hooks.when_ready(server)
    [(level, line)] = server.log.lines
    assert level == "warning" and line.startswith("reachlimit: 2 workers without ")
    # the variable that fixes it, named where it is missing and where it is to be set
    assert line.count("REACHLIMIT_REDIS_URL") == 2
    assert "2 x REACHLIMIT_ACTIVE" in line and "2 x REACHLIMIT_QUEUE" in line


def test_on_exit_removes_only_its_own_directory_while_it_is_the_metrics_one(
    env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made, other = tmp_path / "made", tmp_path / "other"
    made.mkdir()
    other.mkdir()
    env.setenv(hooks.TEMPORARY_VARIABLE, str(made))
    env.setenv("PROMETHEUS_MULTIPROC_DIR", str(other))  # no longer the one it made
    hooks.on_exit(Server())
    assert made.is_dir() and other.is_dir()


def test_on_exit_never_raises_when_its_directory_is_gone_already(
    unimported: pytest.MonkeyPatch,
) -> None:
    hooks.prepare()
    made = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    made.rmdir()  # removed under the master (a tmp cleaner, say)
    hooks.on_exit(Server())  # must not raise
    assert not made.exists()


def test_a_failure_to_mark_a_worker_dead_names_the_error(prepared: Path) -> None:
    (prepared / "gauge_livesum_4242.db").mkdir()  # os.remove cannot remove a directory
    server = Server()
    hooks.child_exit(server, Worker(4242))
    [(_, line)] = server.log.lines
    assert "4242" in line
    assert "(IsADirectoryError: " in line and "gauge_livesum_4242.db" in line, line
