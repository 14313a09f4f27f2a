"""The benchmark scripts (``benchmarks/``) run as subprocesses by their smoke tests
(``tests/test_benchmarks.py``, and the Redis ones in ``tests/test_redis_processes.py``):
``run_script`` runs one with this Python from the repository root, ``run_json`` runs one with
``--quick --json`` and returns its report, after checking it finished and described its machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.support import ROOT

BENCHMARKS = ROOT / "benchmarks"


def run_script(name: str, *args: str, timeout: float = 100) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


def run_json(name: str, *args: str, timeout: float = 100) -> dict[str, Any]:
    """The report of ``name --quick --json *args``; the script must exit 0 and name the
    machine it ran on."""
    proc = run_script(name, "--quick", "--json", *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    assert {"platform", "cpu", "cores", "python"} <= set(report["machine"])
    return report
