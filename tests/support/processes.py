"""Processes and ports (Linux ``/proc``): who is alive, whose children, who listens where.

A PID is only ever signalled by the code that started the process, and a PID recorded
earlier is checked to be the same process by its start time, never a recycled one.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support import HOST


def free_port() -> int:
    """A loopback port that was free a moment ago (the caller retries if it is taken since)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` from field 3 (state) on, or None if it is gone.
    The command name (field 2) may hold spaces and parentheses: split after its last ')'."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
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


def same_process_alive(pid: int, started: int | None) -> bool:
    """``pid`` is alive and is still the process that started at ``started``."""
    if not pid_alive(pid):
        return False
    return started is None or start_time(pid) in (None, started)


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


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux send SIGTERM to the child when this process dies, so
    that even a SIGKILLed run (a test's subprocess timeout) leaves no server behind; None
    elsewhere. The C function is looked up here, before the fork; the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1  # <linux/prctl.h>

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM))
        if os.getppid() != parent:  # we died before the prctl took effect
            os._exit(1)

    return preexec
