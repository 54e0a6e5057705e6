"""Structured events: what the engine did, for logs, metrics and audits.

Handlers may be plain functions or coroutine functions. A handler that raises is logged and
skipped: observability never breaks a turn.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ce.core._drive import settle

__all__ = [
    "EVENT_TYPES",
    "Event",
    "EventBus",
    "EventHandler",
    "InMemoryEventBus",
]

logger = logging.getLogger("ce.core.events")

EVENT_TYPES: tuple[str, ...] = (
    "SessionLoaded",
    "MessageAppended",
    "SummaryGenerated",
    "ToolCalled",
    "ToolCallCompleted",
    "EvidenceIngested",
    "BlocksDerived",
    "ConflictDetected",
    "PruneCompleted",
    "Assembled",
    "AssistantChunkReceived",
    "AssistantMessageFinalized",
    "Persisted",
    "Error",
    "Degraded",
)
"""The event names the engine emits."""


@dataclass(frozen=True)
class Event:
    """One thing that happened. ``payload`` holds the details: for ``Degraded`` and
    ``Error``, ``reason`` and ``detail`` (and ``prepare: True`` when it belongs to a prepared call,
    whose report lists it too); for ``Assembled``, the last event of a
    ``prepare_turn`` / ``prepare_call``, ``parts``, ``total_tokens``, ``budget``, ``kind``
    (``"turn"`` or ``"call"``), ``model_hint``, ``started_ns`` (``time.time_ns()`` when the
    call began) and ``report`` (its :class:`~ce.core.schema.Report`, read-only)."""

    event_type: str
    session_id: str
    turn_id: str | None = None
    task_id: str | None = None
    tool_call_id: str | None = None
    model_usage_id: str | None = None
    ts: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)


EventHandler = Callable[[Event], "Awaitable[None] | None"]


@runtime_checkable
class EventBus(Protocol):
    async def emit(self, event: Event) -> None: ...
    def on(self, event_type: str, handler: EventHandler) -> None: ...
    def off(self, event_type: str, handler: EventHandler) -> None: ...
    def on_all(self, handler: EventHandler) -> None: ...


class InMemoryEventBus:
    """Dispatches each event to the handlers of its type, then to the catch-all handlers, in
    registration order. Registration is thread-safe; ``on`` with an unknown event type raises
    ``ValueError`` so a typo does not silently subscribe to nothing."""

    def __init__(self) -> None:
        self._handlers: dict[str, list[EventHandler]] = {}
        self._all: list[EventHandler] = []
        self._lock = threading.Lock()

    def on(self, event_type: str, handler: EventHandler) -> None:
        if event_type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {event_type!r}; known: {', '.join(EVENT_TYPES)}")
        with self._lock:
            self._handlers.setdefault(event_type, []).append(handler)

    def off(self, event_type: str, handler: EventHandler) -> None:
        """Remove ``handler`` from ``event_type`` (or from the catch-alls with ``"*"``)."""
        with self._lock:
            handlers = self._all if event_type == "*" else self._handlers.get(event_type, [])
            if handler in handlers:
                handlers.remove(handler)

    def on_all(self, handler: EventHandler) -> None:
        with self._lock:
            self._all.append(handler)

    def has_handlers(self) -> bool:
        return bool(self._all) or any(self._handlers.values())

    async def emit(self, event: Event) -> None:
        with self._lock:
            handlers = [*self._handlers.get(event.event_type, ()), *self._all]
        for handler in handlers:
            try:
                result = handler(event)
                if inspect.isawaitable(result):
                    await settle(result)
            except Exception:
                logger.exception("event handler %r failed on %s", handler, event.event_type)
