"""Write-behind: records an integration hands over without waiting, run in order before the
session is next used."""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ce.core.engine._session import SessionLocks

if TYPE_CHECKING:
    from ce.core.engine._engine import ContextEngine

__all__ = ["DeferredWrites", "draining", "flush_at_exit", "note_pending"]

logger = logging.getLogger("ce.core.engine")

Work = Callable[[], Awaitable[Any]]

_draining: ContextVar[bool] = ContextVar("ce_engine_draining", default=False)

# Engines with deferred records, flushed when the interpreter exits.
_with_pending: weakref.WeakSet[ContextEngine] = weakref.WeakSet()
_pending_lock = threading.Lock()


def draining() -> bool:
    """Whether the current engine call runs deferred records (which must not drain again)."""
    return _draining.get()


class DeferredWrites:
    """Per-session ordered queues of deferred record writes (thread-safe)."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[Work]] = {}
        self._lock = threading.Lock()
        self._running = SessionLocks()  # held by the flow that runs a session's queue
        self._active: set[str] = set()  # sessions whose queue a flow is running
        self._coalescing: set[str] = set()  # those of them run with several writes queued

    def add(self, session_id: str, work: Work) -> None:
        with self._lock:
            self._queues.setdefault(session_id, deque()).append(work)

    def sessions(self) -> list[str]:
        with self._lock:
            return list(self._queues)

    def _pop(self, session_id: str) -> Work | None:
        with self._lock:
            queue = self._queues.get(session_id)
            if not queue:
                self._queues.pop(session_id, None)
                return None
            work = queue.popleft()
            if not queue:
                del self._queues[session_id]
            return work

    def _push_back(self, session_id: str, work: Work) -> None:
        with self._lock:
            self._queues.setdefault(session_id, deque()).appendleft(work)

    def coalescing(self, session_id: str) -> bool:
        """Whether the current flow runs several of ``session_id``'s queued writes, which
        then leave what they write for one commit after them (a task that flow started
        meanwhile counts too). A run of one queued write lets it commit as it goes: its own
        commit is cheaper than a second one after it."""
        if not _draining.get():
            return False
        with self._lock:
            return session_id in self._coalescing

    async def run(self, session_id: str) -> bool:
        """Run the session's queued writes in order, one at a time (each one fails alone:
        logged); whether they ran :meth:`coalescing` (what they wrote waits for a commit).
        While another flow runs them (a flush task on the loop, a hook's thread), wait for it
        to end: a work may be several engine calls, and a call that went on between two of
        them would miss the later ones. A run cancelled in the middle of a write (its event
        loop shutting down) puts that write back at the head of the queue, to run again
        later: the engine's record writes are idempotent."""
        if _draining.get():
            return False
        with self._lock:
            if session_id not in self._queues and session_id not in self._active:
                return False
        coalesced = False
        async with self._running.hold(session_id):
            with self._lock:  # one flow at a time holds the session's run
                self._active.add(session_id)
                if len(self._queues.get(session_id, ())) > 1:
                    self._coalescing.add(session_id)
                    coalesced = True
            token = _draining.set(True)
            try:
                while (work := self._pop(session_id)) is not None:
                    try:
                        await work()
                    except asyncio.CancelledError:
                        self._push_back(session_id, work)
                        raise
                    except Exception:
                        logger.exception("a deferred record of session %r failed", session_id)
            finally:
                _draining.reset(token)
                with self._lock:
                    self._active.discard(session_id)
                    self._coalescing.discard(session_id)
        return coalesced


def note_pending(engine: ContextEngine) -> None:
    with _pending_lock:
        _with_pending.add(engine)


def flush_at_exit() -> None:
    """Run what every engine still has queued (registered with :mod:`atexit`)."""
    with _pending_lock:
        engines = list(_with_pending)
    for engine in engines:
        try:
            engine.sync.flush()
        except Exception:
            logger.exception("flushing deferred records at exit failed")
