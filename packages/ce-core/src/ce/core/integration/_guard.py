"""Fail-open: an engine failure never breaks the user's framework call."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from ce.core.events import Event

if TYPE_CHECKING:
    from ce.core.engine import ContextEngine
    from ce.core.integration._plugin import Plugin

__all__ = [
    "INTEGRATION_FAILED",
    "REDACTION_FAILED",
    "emit_failure",
    "emit_failure_sync",
    "fail_open",
    "fail_open_sync",
    "guarded",
    "guarded_sync",
    "redacted_or_reported",
    "redacted_or_reported_sync",
]

logger = logging.getLogger("ce.core.integration")

INTEGRATION_FAILED = "integration_failed"
"""The ``reason`` of the ``Degraded`` event a guarded failure emits."""
REDACTION_FAILED = "redaction_failed"
"""The ``reason`` of the ``Degraded`` event emitted when the framework's own input, let
through on an engine failure, could not be redacted either (it went through unredacted)."""

_T = TypeVar("_T")


def _report(
    plugin: Plugin, session_id: str, what: str, exc: Exception, reason: str = ""
) -> tuple[ContextEngine, Event] | None:
    """Count and log the failure; the engine and the Degraded event (``reason``, default
    :data:`INTEGRATION_FAILED`) to emit on it, or None when the plugin has no engine any more
    (a hook still running after ``uninstall()``)."""
    reason = reason or INTEGRATION_FAILED
    label = plugin.name or type(plugin).__name__
    plugin.failures[reason] += 1
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
            "reason": reason,
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
        await emit_failure(plugin, session_id, what, exc)
    return None


async def emit_failure(
    plugin: Plugin, session_id: str, what: str, exc: Exception, reason: str = ""
) -> None:
    """Count, log (WARNING) and emit as a ``Degraded`` event (``reason``, default
    :data:`INTEGRATION_FAILED`) a failure a hook goes on after."""
    report = _report(plugin, session_id, what, exc, reason)
    if report is not None:
        engine, event = report
        try:
            await engine.events.emit(event)
        except Exception:
            logger.exception("emitting the Degraded event failed")


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
        emit_failure_sync(plugin, session_id, what, exc)
    return None


def emit_failure_sync(
    plugin: Plugin, session_id: str, what: str, exc: Exception, reason: str = ""
) -> None:
    """The blocking twin of :func:`emit_failure`."""
    report = _report(plugin, session_id, what, exc, reason)
    if report is not None:
        engine, event = report
        try:
            engine.sync.run(engine.events.emit(event))
        except Exception:
            logger.exception("emitting the Degraded event failed")


def redacted_or_reported_sync(
    plugin: Plugin, session_id: str, redact: Callable[[], _T]
) -> _T | None:
    """After the engine (or a hook's own step) failed: the framework's own input through
    ``redact()``. ``None`` when redaction failed too: the input goes as it is, and that is
    counted in ``plugin.failures["redaction_failed"]`` and reported as a WARNING and a
    ``Degraded`` event (:data:`REDACTION_FAILED`); with ``plugin.fail_closed`` it is raised."""
    try:
        return redact()
    except Exception as exc:
        if plugin.fail_closed:
            raise
        emit_failure_sync(plugin, session_id, "redaction", exc, REDACTION_FAILED)
        return None


async def redacted_or_reported(
    plugin: Plugin, session_id: str, redact: Callable[[], _T]
) -> _T | None:
    """The coroutine twin of :func:`redacted_or_reported_sync`."""
    try:
        return redact()
    except Exception as exc:
        if plugin.fail_closed:
            raise
        await emit_failure(plugin, session_id, "redaction", exc, REDACTION_FAILED)
        return None


def fail_open_sync(
    plugin: Plugin, session_id: str, what: str, exc: Exception, redact: Callable[[], _T]
) -> _T | None:
    """A hook's own step failed with ``exc`` (converting the framework's messages): raised
    with ``plugin.fail_closed``, else reported like :func:`guarded_sync` does and the
    framework's input returned through ``redact()`` (see :func:`redacted_or_reported_sync`)."""
    if plugin.fail_closed:
        raise exc
    emit_failure_sync(plugin, session_id, what, exc)
    return redacted_or_reported_sync(plugin, session_id, redact)


async def fail_open(
    plugin: Plugin, session_id: str, what: str, exc: Exception, redact: Callable[[], _T]
) -> _T | None:
    """The coroutine twin of :func:`fail_open_sync`."""
    if plugin.fail_closed:
        raise exc
    await emit_failure(plugin, session_id, what, exc)
    return await redacted_or_reported(plugin, session_id, redact)
