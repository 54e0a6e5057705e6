"""Fail-open: an engine failure never breaks the user's framework call."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from ce.core.events import Event

if TYPE_CHECKING:
    from ce.core.engine import ContextEngine
    from ce.core.integration._plugin import Plugin

__all__ = ["INTEGRATION_FAILED", "guarded", "guarded_sync"]

logger = logging.getLogger("ce.core.integration")

INTEGRATION_FAILED = "integration_failed"
"""The ``reason`` of the ``Degraded`` event a guarded failure emits."""

_T = TypeVar("_T")


def _report(
    plugin: Plugin, session_id: str, what: str, exc: Exception
) -> tuple[ContextEngine, Event] | None:
    """Log the failure; the engine and the Degraded event to emit on it, or None when the
    plugin has no engine any more (a hook still running after ``uninstall()``)."""
    label = plugin.name or type(plugin).__name__
    logger.warning(
        "plugin %r: %s failed; the call goes on without the engine", label, what, exc_info=exc
    )
    try:
        engine = plugin.engine
    except RuntimeError:
        return None
    return engine, Event(
        event_type="Degraded",
        session_id=session_id,
        ts=engine.clock.now_iso(),
        tags={"plugin": label},
        payload={
            "reason": INTEGRATION_FAILED,
            "detail": f"{what}: {type(exc).__name__}: {exc}",
        },
    )


async def guarded(
    plugin: Plugin,
    coro_factory: Callable[[], Awaitable[_T]],
    *,
    session_id: str,
    what: str,
) -> _T | None:
    """Await ``coro_factory()`` (an engine call, or conversion for one) and return its result.

    If it raises an :class:`Exception`, log it, emit a ``Degraded`` event (``reason``
    :data:`INTEGRATION_FAILED`, ``detail`` naming ``what`` and the error) on
    ``plugin.engine.events`` and return ``None``, so the hook lets the framework's own input
    through; with ``plugin.fail_closed`` the exception is re-raised instead. Wrap only engine
    work: the user's own call must run outside, so its exceptions reach the user unchanged.
    """
    try:
        return await coro_factory()
    except Exception as exc:
        if plugin.fail_closed:
            raise
        report = _report(plugin, session_id, what, exc)
    if report is not None:
        engine, event = report
        try:
            await engine.events.emit(event)
        except Exception:
            logger.exception("emitting the Degraded event failed")
    return None


def guarded_sync(
    plugin: Plugin,
    call: Callable[[], _T],
    *,
    session_id: str,
    what: str,
) -> _T | None:
    """The blocking twin of :func:`guarded` for sync hooks: ``call`` is a blocking engine
    call (usually through ``engine.sync``); the ``Degraded`` event is emitted through
    ``engine.sync``, so this works with or without a running event loop."""
    try:
        return call()
    except Exception as exc:
        if plugin.fail_closed:
            raise
        report = _report(plugin, session_id, what, exc)
    if report is not None:
        engine, event = report
        try:
            engine.sync.run(engine.events.emit(event))
        except Exception:
            logger.exception("emitting the Degraded event failed")
    return None
