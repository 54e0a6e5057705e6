"""Per-session working state of the engine: the AgentState, its indexes, and a lock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from itertools import islice
from typing import Any

from ce.core.pipeline import SessionIndex
from ce.core.schema import Evidence, Message, SessionDocument
from ce.core.state import AgentState
from ce.core.stores.base import SessionUpdate
from ce.core.tokens import TokenEstimator

__all__ = ["SessionEntry", "SessionLocks", "message_key"]


def message_key(message: Message, content: str | None = None) -> tuple[Any, ...]:
    """What identifies a message when the framework gives it no id: role, text as stored
    (``content`` when given), tool ids."""
    calls = tuple(c.tool_call_id for c in message.tool_calls or ())
    text = message.content if content is None else content
    return (message.role, text, message.tool_call_id, calls)


class SessionEntry:
    """The engine's cached view of one session at a known store version.

    ``state`` is the only writer; ``indexes`` (one per model hint) are fed every record the
    state holds, in order, so deriving blocks for a turn costs only what is new.
    """

    def __init__(
        self,
        session_id: str,
        state: AgentState,
        version: int,
        estimator_for: Callable[[str | None], TokenEstimator],
        epoch: str = "",
    ) -> None:
        self.session_id = session_id
        self.state = state
        self.version = version
        self.epoch = epoch
        self._estimator_for = estimator_for
        self.indexes: dict[str | None, SessionIndex] = {}
        self.dedup: dict[str, str] = {}
        self.key_counts: dict[tuple[Any, ...], int] = {}
        self.message_ids: set[str] = set()
        self.chunks: dict[int, str] = {}
        doc = state.live_view()
        for message in doc.session.messages:
            self._count_key(message)
        self._note_evidences(doc.evidences.values())

    def _note_evidences(self, evidences: Iterable[Evidence]) -> None:
        for evidence in evidences:
            key = evidence.metadata.get("dedup_key")
            if isinstance(key, str):
                self.dedup.setdefault(key, evidence.evidence_id)

    def catch_up(self, update: SessionUpdate) -> None:
        """Absorb an incremental :class:`~ce.core.stores.base.SessionUpdate` of this entry's
        version and epoch (what other writers stored since); the indexes take the new records
        on their next use."""
        changes = update.changes
        self.state.absorb(changes)
        for message in changes.messages:
            self._count_key(message)
        self._note_evidences(changes.evidences)
        self.version = update.version

    @property
    def doc(self) -> SessionDocument:
        return self.state.live_view()

    def _count_key(self, message: Message) -> None:
        if message.message_id:
            self.message_ids.add(message.message_id)
        key = message_key(message)
        self.key_counts[key] = self.key_counts.get(key, 0) + 1

    def note_written(self, stored: Message) -> None:
        """Remember a message just written (in its stored, redacted form), so a framework
        that passes it again is not recorded twice."""
        self._count_key(stored)

    def index(self, model_hint: str | None) -> SessionIndex:
        """The index for ``model_hint``, brought up to date with the state."""
        index = self.indexes.get(model_hint)
        if index is None:
            index = SessionIndex(self._estimator_for(model_hint), model_hint)
            self.indexes[model_hint] = index
        doc = self.state.live_view()
        session = doc.session
        messages = session.messages
        for message in messages[index.message_count :]:
            index.add_message(message)
        for record in session.tool_state.tool_calls[index.record_count :]:
            index.add_tool_record(record)
        new = len(doc.evidences) - index.evidence_count
        if new > 0:
            # dicts keep insertion order: the newest evidences are at the end
            for evidence in reversed(list(islice(reversed(doc.evidences.values()), new))):
                index.add_evidence(evidence)
        return index


class SessionLocks:
    """One lock per session that works across threads and event loops: calls for one session
    are serialized, different sessions run concurrently."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        with self._guard:
            lock = self._locks.setdefault(session_id, threading.Lock())
        if not lock.acquire(blocking=False):
            waiting = asyncio.ensure_future(asyncio.to_thread(lock.acquire))
            try:
                await asyncio.shield(waiting)
            except asyncio.CancelledError:
                # the thread still takes the lock: hand it back as soon as it does
                waiting.add_done_callback(lambda _: lock.release())
                raise
        try:
            yield
        finally:
            lock.release()
