"""What every benchmark script reports the same way: the machine, and percentiles.

The scripts run standalone (``python benchmarks/NAME.py``), so this folder is on ``sys.path``
and they import this module as ``_common``.
"""

from __future__ import annotations

import math
import os
import platform
import sys
from typing import Any


def machine() -> dict[str, Any]:
    """Where the figures came from."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "switch_interval_ms": sys.getswitchinterval() * 1000,
        # Other processes share the cores: the load at the start says how noisy the run was.
        "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def pct(xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile (``p`` in 0-100); None for no samples."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def ms(x: float | None) -> float | None:
    return None if x is None else x * 1000
