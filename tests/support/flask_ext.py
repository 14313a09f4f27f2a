"""What a test reads from an app with the reachlimit Flask extension: ``ExtensionReads``, the
base of ``App`` (``tests/support/fair_app.py``) and ``Harness`` (``tests/test_flask_ext.py``).
"""

from __future__ import annotations

from typing import Any

from flask import Flask

from reachlimit import ColdLimiter, ColdPath
from reachlimit.flask import ReachLimit


class ExtensionReads:
    """``path`` (the extension's ``ColdPath``), ``limiter`` (its in-process ``ColdLimiter``)
    and ``stats()`` (the extension's figures as a dict) of ``self.app`` and ``self.rl``."""

    app: Flask
    rl: ReachLimit

    @property
    def state(self) -> Any:
        return self.app.extensions["reachlimit"]

    @property
    def path(self) -> ColdPath:
        path = self.state.path
        assert isinstance(path, ColdPath)
        return path

    @property
    def limiter(self) -> ColdLimiter:
        limiter = self.path.limiter
        assert isinstance(limiter, ColdLimiter)
        return limiter

    def stats(self) -> dict[str, Any]:
        with self.app.app_context():
            return self.rl.stats().as_dict()
