"""The documents' examples, read for the tests that run them (``tests/test_readme_quickstart.py``
runs the README's in-process, ``tests/test_wheel.py`` runs its quick start from the wheel)."""

from __future__ import annotations

import re

from tests.support import ROOT

README = ROOT / "README.md"


def code_block(text: str, heading: str) -> str:
    """The first ```python block after the line ``heading`` (a whole heading line)."""
    match = re.search(rf"^{re.escape(heading)}\n(.*?)^```python\n(.*?)^```$", text,
                      re.MULTILINE | re.DOTALL)
    assert match, f"no ```python block under {heading!r}"
    return match.group(2)


def quick_start() -> str:
    """The code of the README's Quick start."""
    return code_block(README.read_text(encoding="utf-8"), "## Quick start")
