"""The tool calls a model asked for, waiting for the runs that carry no call id."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any

__all__ = ["AskedToolCalls", "arguments_key"]


def arguments_key(arguments: Any) -> str | None:
    """Tool call arguments (JSON text or its parsed value) as one canonical text, so a model's
    tool call and a framework's tool event compare equal whichever form each holds; None when
    they do not parse."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    try:
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return None


class AskedToolCalls:
    """The tool calls model replies asked for that no tool run has taken yet, per key (a
    session, a run and session, ...), for frameworks whose tool runs carry no call id (or
    tools an app calls itself): a run takes the id of the earliest waiting call of its tool
    with the same arguments (see :func:`arguments_key`); with ``fallback``, else the earliest
    waiting call of its tool (runs of one reply may end in any order). Thread-safe."""

    def __init__(self) -> None:
        self._waiting: dict[Hashable, list[tuple[str, str, str | None]]] = {}
        self._lock = threading.Lock()

    def note(
        self, key: Hashable, calls: Iterable[tuple[str, str, Any]], *, replace: bool = False
    ) -> None:
        """Note ``(call id, tool, arguments)`` of calls asked for under ``key``; with
        ``replace``, instead of the calls waiting there (a new reply supersedes them)."""
        noted = [(call_id, tool, arguments_key(args)) for call_id, tool, args in calls]
        with self._lock:
            if replace:
                self._waiting.pop(key, None)
            if noted:
                self._waiting.setdefault(key, []).extend(noted)

    def take(self, key: Hashable, tool: str, arguments: Any, *, fallback: bool) -> str | None:
        """The id of the waiting call under ``key`` that a run of ``tool`` with ``arguments``
        answers (forgotten now), or None."""
        wanted = arguments_key(arguments)
        with self._lock:
            waiting = self._waiting.get(key)
            if not waiting:
                return None
            same = [i for i, (_, name, _) in enumerate(waiting) if name == tool]
            index = next(
                (i for i in same if wanted is not None and waiting[i][2] == wanted),
                same[0] if same and fallback else None,
            )
            if index is None:
                return None
            call_id = waiting.pop(index)[0]
            if not waiting:
                del self._waiting[key]
        return call_id

    def drop(self, stale: Callable[[Hashable], bool]) -> None:
        """Forget the calls waiting under every key ``stale`` is true of (their runs ended)."""
        with self._lock:
            for key in [k for k in self._waiting if stale(k)]:
                del self._waiting[key]

    def clear(self) -> None:
        """Forget every waiting call."""
        with self._lock:
            self._waiting.clear()
