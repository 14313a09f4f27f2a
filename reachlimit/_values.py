"""The one rule for the Flask extension's cached values, written once: bytes, str or a
JSON-able value, encoded and decoded the same way in process and in Redis.

design:

    encode(value) -> tagged bytes        b"b" + bytes (bytes, bytearray, memoryview), or
                                         b"j" + compact UTF-8 JSON (anything else; NaN and
                                         infinities refused); TypeError for what JSON cannot
                                         hold. The shared cache's "auto" codec
                                         (``reachlimit.redis``) stores exactly these bytes.
    decode(tagged bytes) -> value        the value back; ValueError for bytes it did not write
    normalised(value, key, where)        decode(encode(value)), without the bytes where they
                                         are not needed: what the extension stores and answers,
                                         in process or on Redis, from the very first answer
    run_ruled(build, key, where)         normalised(build(), key, where): cold() hands the
                                         path partial(run_ruled, build, key, where); the cached
                                         decorator's build applies the rule itself instead

So a tuple comes back as a list, a dict with int keys with str keys, bytearray as bytes,
everywhere and at once, exactly as a value read back from Redis would. ``None`` and
``NOT_FOUND`` pass through untouched: the cold path answers them and never caches them.
Anything else (a Flask ``Response``, a set, an object) is a ``TypeError`` naming the key:
raised inside the build that returned it, so the value is never cached and the build's
followers share the error. The library's own ``TTLCache`` still takes any object; this rule
is the extension's. Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from typing import Any

from ._path import NOT_FOUND

__all__ = ["encode", "decode", "normalised", "run_ruled", "BYTES_TAG", "JSON_TAG"]

BYTES_TAG = b"b"
JSON_TAG = b"j"
_BYTES_LIKE = (bytes, bytearray, memoryview)


def _json_text(value: Any) -> str:
    """Compact JSON of ``value``; TypeError (never ValueError) for what JSON cannot hold."""
    try:
        # json tests both flags for truth only: None there is False.
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"JSON cannot hold this {type(value).__name__}: {exc}") from None


def encode(value: Any) -> bytes:
    """``value`` as tagged bytes (see the module's design note)."""
    if isinstance(value, _BYTES_LIKE):
        return BYTES_TAG + bytes(value)
    return JSON_TAG + _json_text(value).encode("utf-8", "surrogatepass")  # "UTF-8" is utf-8


def decode(data: bytes) -> Any:
    """The value of tagged bytes written by :func:`encode`; ValueError for anything else."""
    tag = data[:1]
    if tag == BYTES_TAG:
        return data[1:]
    if tag != JSON_TAG:
        raise ValueError("no bytes or JSON tag")  # pragma: no mutate (a message's words)
    try:
        return json.loads(data[1:].decode("utf-8", "surrogatepass"))  # "UTF-8" is utf-8
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeError too
        raise ValueError(f"bad JSON: {type(exc).__name__}") from None  # pragma: no mutate (words)


def normalised(value: Any, key: Hashable, where: str = "") -> Any:  # pragma: no mutate (words)
    """``value`` as it comes back from the shared cache: ``decode(encode(value))``, with the
    shortcuts that change nothing (bytes stay bytes, a str stays a str). ``TypeError``
    naming ``key`` (and ``where``, e.g. the view) for a value outside the rule."""
    kind = type(value)
    # A shortcut: bytes or a str left to the general way below come back the same.
    if kind is bytes or kind is str or value is None or value is NOT_FOUND:
        return value
    if isinstance(value, _BYTES_LIKE):
        return bytes(value)
    try:
        text = _json_text(value)
    except TypeError as exc:
        by = f" by {where}" if where else ""  # pragma: no mutate (a message's words)
        raise TypeError(
            f"the value built{by} for key {key!r} is a {kind.__name__}, which the cache "
            f"cannot hold: a cached value must be bytes, str or JSON-able ({exc})"
        ) from None
    return json.loads(text)


def run_ruled(build: Callable[[], Any], key: Hashable, where: str) -> Any:
    """``build()``'s value through :func:`normalised`: what ``cold()`` hands the path is
    ``partial(run_ruled, build, key, where)``, so the TypeError is raised where the build
    returned (inside the build: nothing is cached, its followers share the error). Made on
    every ``cold()``, warm hits included, a ``partial`` is the cheapest callable to make
    there: no Python frame, no closure cells."""
    return normalised(build(), key, where)
