"""Stand-ins of an app's own warm cache: the duck-typed caches ColdPath (and ResilientCache)
accept besides ``TTLCache``."""

from __future__ import annotations

from typing import Any


class DictCache:
    """A duck-typed cache with ``get`` and ``set`` only (no ``lookup``, ``put`` or
    ``forget``): a plain dict behind them, recording each call in ``calls``."""

    def __init__(self) -> None:
        self.data: dict[Any, Any] = {}
        self.calls: list[tuple[Any, ...]] = []

    def get(self, key: Any) -> Any:
        self.calls.append(("get", key))
        return self.data.get(key)

    def set(self, key: Any, value: Any) -> None:
        self.calls.append(("set", key))
        self.data[key] = value
