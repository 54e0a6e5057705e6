"""Copies of an app's messages with the engine's text, made once.

The engine rewrites some of the app's messages on every call (a tool result fenced with its
evidence id, a redacted question, an older message at a cheaper level of detail): a plugin
sends a copy of the app's message with the engine's text. The app passes the same message
again on the next call and the engine rewrites it the same way, so :class:`RewriteMemo`
hands back the copy made then, as long as the app has not given the message a new field
value since (a copy shares what the message holds, as any shallow copy does).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

__all__ = ["RewriteMemo"]

_T = TypeVar("_T")


class RewriteMemo:
    """The copies a plugin made of the app's messages, by message and rewrite (the newest
    ``max_entries``). Thread-safe."""

    def __init__(self, max_entries: int = 8192) -> None:
        self._held: dict[tuple[int, Hashable], tuple[Any, tuple[Any, ...], Any]] = {}
        self._lock = threading.Lock()
        self._max = max_entries

    def copy(self, message: Any, rewrite: Hashable, make: Callable[[], _T]) -> _T:
        """``make()``, a copy of ``message`` rewritten as ``rewrite`` says (the engine's
        text, whether media stay, ...), or the one made before for the same message and
        ``rewrite`` while every field of ``message`` still holds the same object. A message
        without an instance ``__dict__`` is copied every time."""
        values = getattr(message, "__dict__", None)
        if values is None:
            return make()
        fields = tuple(values.values())
        key = (id(message), rewrite)
        held = self._held.get(key)
        if (
            held is not None
            and held[0] is message
            and len(held[1]) == len(fields)
            and all(map(operator.is_, fields, held[1]))
        ):
            copied: _T = held[2]
            return copied
        made = make()
        with self._lock:
            if len(self._held) >= self._max:
                self._held.clear()
            self._held[key] = (message, fields, made)
        return made
