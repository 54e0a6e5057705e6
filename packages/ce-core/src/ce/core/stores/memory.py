"""``MemoryStore``: sessions kept in process memory (tests, ephemeral runs)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ce.core.errors import StoreError
from ce.core.primitives import Clock, IdGenerator
from ce.core.schema import ContextBlock, Evidence, PutResult, SessionDocument, TurnRecord
from ce.core.stores._docops import (
    append_turns,
    apply_changes,
    new_document,
    newest,
    remove_evidence,
    user_id_of,
)
from ce.core.stores.base import (
    AuditRecord,
    BaseStore,
    BlockFilter,
    EvidenceFilter,
    SessionChanges,
    SessionUpdate,
    filter_blocks,
    filter_evidences,
    new_epoch,
    whole_update,
)

__all__ = ["MemoryStore"]


@dataclass(frozen=True)
class _Entry:
    version: int
    doc: SessionDocument
    turns: list[TurnRecord]
    epoch: str


class MemoryStore(BaseStore):
    """Keeps every session in a dict guarded by a :class:`threading.Lock`.

    Safe to share between threads and event loops. Whatever it returns is a copy, and what it
    stores was copied from the caller's objects, so no caller can change stored state except
    through the store. Nothing survives the process.
    """

    def __init__(
        self, *, id_generator: IdGenerator | None = None, clock: Clock | None = None
    ) -> None:
        super().__init__(id_generator=id_generator, clock=clock)
        self._lock = threading.Lock()
        self._sessions: dict[str, _Entry] = {}
        self._audit: list[AuditRecord] = []
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("MemoryStore is closed")

    def _entry(self, session_id: str) -> _Entry | None:
        self._check_open()
        return self._sessions.get(session_id)

    async def _commit(
        self, session_id: str, changes: SessionChanges, expected_version: int | None
    ) -> PutResult:
        with self._lock:
            entry = self._entry(session_id)
            current = entry.version if entry else 0
            self._check_version(session_id, expected_version, current)
            doc = entry.doc if entry else new_document(session_id)
            stored_turns = entry.turns if entry else []
            changed = apply_changes(doc, changes)
            turns = append_turns(stored_turns, changes.turns)
            if changed is None and turns is stored_turns:
                return PutResult(success=True, version=current, epoch=entry and entry.epoch)
            epoch = entry.epoch if entry else new_epoch()
            self._sessions[session_id] = _Entry(
                current + 1, doc if changed is None else changed, turns, epoch
            )
            return PutResult(success=True, version=current + 1, epoch=epoch)

    async def _put_session(
        self, session_id: str, doc: SessionDocument, expected_version: int | None
    ) -> PutResult:
        with self._lock:
            entry = self._entry(session_id)
            current = entry.version if entry else 0
            self._check_version(session_id, expected_version, current)
            epoch = new_epoch()
            self._sessions[session_id] = _Entry(current + 1, doc, [], epoch)
            return PutResult(success=True, version=current + 1, epoch=epoch)

    async def get_session(self, session_id: str) -> SessionDocument | None:
        with self._lock:
            entry = self._entry(session_id)
        if entry is None:
            return None
        # Stored documents are never modified in place, so copying outside the lock is safe.
        return SessionDocument.model_validate_json(entry.doc.model_dump_json(exclude_none=True))

    async def read_since(
        self, session_id: str, version: int = 0, epoch: str = ""
    ) -> SessionUpdate | None:
        """Nothing for a reader at the stored version and epoch, else the whole session."""
        with self._lock:
            entry = self._entry(session_id)
        if entry is None:
            return None
        doc = SessionDocument.model_validate_json(entry.doc.model_dump_json(exclude_none=True))
        return whole_update(doc, entry.version, entry.epoch, version, epoch)

    async def get_version(self, session_id: str) -> int:
        with self._lock:
            entry = self._entry(session_id)
        return entry.version if entry else 0

    async def get_evidence(self, session_id: str, evidence_id: str) -> Evidence | None:
        with self._lock:
            entry = self._entry(session_id)
        evidence = entry.doc.evidences.get(evidence_id) if entry else None
        return evidence.model_copy(deep=True) if evidence else None

    async def list_evidences(
        self, session_id: str, filter: EvidenceFilter | None = None
    ) -> list[Evidence]:
        with self._lock:
            entry = self._entry(session_id)
        evidences = list(entry.doc.evidences.values()) if entry else []
        return [e.model_copy(deep=True) for e in filter_evidences(evidences, filter)]

    async def list_context_blocks(
        self, session_id: str, filter: BlockFilter | None = None
    ) -> list[ContextBlock]:
        with self._lock:
            entry = self._entry(session_id)
        blocks = entry.doc.context_blocks if entry else []
        return [b.model_copy(deep=True) for b in filter_blocks(blocks, filter)]

    async def _list_turns(self, session_id: str, limit: int | None) -> list[TurnRecord]:
        with self._lock:
            entry = self._entry(session_id)
        # Stored turn lists are never modified in place (commits build new ones).
        turns = entry.turns if entry else []
        return [t.model_copy(deep=True) for t in newest(turns, limit)]

    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord | None:
        with self._lock:
            entry = self._entry(session_id)
        turn = next((t for t in entry.turns if t.turn_id == turn_id), None) if entry else None
        return turn.model_copy(deep=True) if turn else None

    async def list_sessions(self, user_id: str | None = None) -> list[str]:
        with self._lock:
            self._check_open()
            return sorted(
                session_id
                for session_id, entry in self._sessions.items()
                if user_id is None or user_id_of(entry.doc.meta) == user_id
            )

    async def delete_session(self, session_id: str) -> bool:
        with self._lock:
            if self._entry(session_id) is None:
                return False
            del self._sessions[session_id]
            self._audit.append(self._audit_record("delete_session", session_id))
            return True

    async def delete_evidence(self, session_id: str, evidence_id: str) -> bool:
        with self._lock:
            entry = self._entry(session_id)
            changed = remove_evidence(entry.doc, evidence_id) if entry else None
            if entry is None or changed is None:
                return False
            self._sessions[session_id] = _Entry(
                entry.version + 1, changed, entry.turns, new_epoch()
            )
            self._audit.append(self._audit_record("delete_evidence", session_id, evidence_id))
            return True

    async def audit_log(self, session_id: str | None = None) -> list[AuditRecord]:
        with self._lock:
            self._check_open()
            return [r for r in self._audit if session_id is None or r.session_id == session_id]

    async def close(self) -> None:
        """Drop every session; later calls raise :class:`StoreError`."""
        with self._lock:
            self._closed = True
            self._sessions.clear()
