"""The ``Store`` protocol and what every store implementation shares.

A store persists session documents. Writes go through :meth:`Store.commit`, which applies one
:class:`SessionChanges` atomically: either every record of it is stored or none is. Appends are
idempotent on their ids (``message_id``, ``tool_call_id``, ``model_usage_id``,
``evidence_id``): a record whose id is already stored is skipped, so a retried write never
duplicates anything. Context blocks and tasks are upserted by id (an updated block keeps its
position); ``summary``, ``run`` and ``meta`` replace the stored value.

Turn records: a :class:`~ce.core.schema.TurnRecord` (what the engine keeps about one
``prepare_turn`` / ``prepare_call``) is stored beside the session document, not in it:
``get_session`` never returns turns; :meth:`Store.list_turns` and :meth:`Store.get_turn` read
them. They are appended by ``commit`` like messages (idempotent on ``turn_id``, in the same
atomic commit as the rest of the change set), ``put_session`` discards those of the document it
replaces, and ``delete_session`` / ``delete_user`` delete them with the session.

Versions: a session that does not exist has version 0. Every commit that stores something
(a new record or turn record, a block or task whose content differs, a summary/run/meta that
differs) increments the version by one; a commit that changes nothing returns the current
version unchanged and creates nothing. ``put_session`` always counts as a change;
``delete_evidence`` increments the version; ``delete_session`` removes the session, so its
version is 0 again. A write with ``expected_version`` raises
:class:`~ce.core.errors.VersionConflictError` when the stored version differs, and then writes
nothing.

Validation: every record is validated again from its JSON form before it is stored, so a
record mutated into an invalid state after construction (models do not validate assignment)
raises :class:`~ce.core.errors.SchemaValidationError` and the commit stores nothing. What a
store keeps is that JSON form: values JSON cannot represent (tuples, datetimes in ``meta``)
come back the way JSON returns them, from every store alike.

Compliance deletes remove data for good and append an :class:`AuditRecord`
that outlives it.

The convenience methods (``append_messages``, ``put_evidence``, ``append_tool_calls``,
…) are all expressed through ``commit`` by :class:`BaseStore`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from ce.core.errors import SchemaValidationError, StoreError, VersionConflictError
from ce.core.primitives import Clock, IdGenerator, SystemClock, UuidV4Generator
from ce.core.schema import (
    SCHEMA_VERSION,
    ContextBlock,
    Evidence,
    Message,
    ModelUsage,
    PutResult,
    SessionDocument,
    Task,
    ToolCall,
    TurnRecord,
)
from ce.core.stores._changes import (
    CheckedChanges,
    OwnedChanges,
    SessionChanges,
    SessionUpdate,
    changes_of,
    check_unique_ids,
    new_epoch,
    revalidated,
    revalidated_changes,
    whole_update,
)
from ce.core.stores._filters import (
    BlockFilter,
    EvidenceFilter,
    filter_blocks,
    filter_evidences,
)

__all__ = [
    "AuditRecord",
    "BaseStore",
    "BlockFilter",
    "EvidenceFilter",
    "OwnedChanges",
    "SessionChanges",
    "SessionSlice",
    "SessionUpdate",
    "SliceStore",
    "Store",
    "changes_of",
    "check_slice_size",
    "filter_blocks",
    "filter_evidences",
    "new_epoch",
    "slice_document",
    "turn_config",
    "whole_update",
]

_M = TypeVar("_M", bound=BaseModel)


@dataclass
class SessionSlice:
    """The newest records of a session as :meth:`SliceStore.read_tail` returns them (see
    :class:`SliceStore` for what it holds). ``older_messages`` / ``older_evidences`` count
    the messages and evidences of the session it does not hold (0 and 0: it holds the whole
    session), ``older_system`` the system messages among those older messages. ``version``
    and ``epoch`` are the session's at the read."""

    changes: SessionChanges
    version: int
    epoch: str
    older_messages: int = 0
    older_evidences: int = 0
    older_system: int = 0
    instruction: Message | None = None
    fact_sources: list[Evidence] = field(default_factory=list)


@runtime_checkable
class SliceStore(Protocol):
    """A store that reads the newest part of a session.

    A reader that has not seen a session (a new process, a scaled-out worker) needs only what
    one turn can keep: the newest messages, the newest evidence and the records that go with
    them, the current summary, blocks and tasks. :meth:`read_tail` reads that in one snapshot;
    a reader that finds it needs more reads a longer tail.

    What a tail of ``messages`` / ``evidences`` holds (every store that reads tails keeps
    these rules; the contract suite checks them):

    * messages: the newest ``messages`` messages (or more), in stored order;
    * evidences, in stored order: the newest ``evidences`` (or more: a run that ends at the
      newest), every evidence that goes with a message of the slice
      (:func:`~ce.core.schema._document.evidence_link`: the result or a retrieved document of
      a tool call one of them declares, or a summary of one of them), and every evidence the
      context blocks refer to;
    * tool calls: the records of the tool calls its messages declare, in stored order;
    * the current summary, run state, meta, context blocks and tasks; no usage records and no
      turn records (a reader of a tail does not need them);
    * ``older_messages`` / ``older_evidences``: how many messages and evidences of the
      session it does not hold (all of them stored before its messages, before its run of
      newest evidences), and ``older_system``: how many of those older messages are system
      messages (a caller that matches a framework's whole message list against the session
      counts the others);
    * ``instruction``: the newest system message stored before its messages (None when there
      is none), and ``fact_sources``: every evidence stored before its run of newest evidences
      that may state facts (:func:`~ce.core.schema._document.may_state_facts`), so conflicts
      are still found across the whole session.
    """

    async def read_tail(
        self, session_id: str, *, messages: int, evidences: int
    ) -> SessionSlice | None:
        """The newest records of the session; None when it does not exist."""
        ...

    async def read_messages(self, session_id: str, message_ids: Sequence[str]) -> list[Message]:
        """The session's stored messages whose ``message_id`` is one of ``message_ids``, in
        stored order, each read through its key (ids the session does not hold are left
        out): a reader of a tail asks whether an id it has not read is taken."""
        ...

    async def read_evidences(self, session_id: str, dedup_keys: Sequence[str]) -> list[Evidence]:
        """The session's stored evidences whose deduplication key (``metadata.dedup_key``)
        is one of ``dedup_keys``, in stored order, found through an index: a reader of a tail
        asks whether content it ingests was stored before."""
        ...


def slice_document(doc: SessionDocument, version: int, epoch: str) -> SessionSlice:
    """The tail of ``doc`` for a store that keeps no rows per record (a whole document in
    memory or in a file): the whole session, which keeps the tail rules for any size."""
    changes = changes_of(doc)
    changes.model_usage = []  # a tail holds no usage records
    return SessionSlice(changes, version, epoch)


@dataclass(frozen=True)
class AuditRecord:
    """One compliance action a store carried out (kept after the data is gone)."""

    at: str
    action: str
    session_id: str
    target: str = ""


@runtime_checkable
class Store(Protocol):
    """Persistence of session documents with optimistic versions."""

    async def get_session(self, session_id: str) -> SessionDocument | None: ...
    async def get_version(self, session_id: str) -> int: ...
    async def read_since(
        self, session_id: str, version: int = 0, epoch: str = ""
    ) -> SessionUpdate | None:
        """What changed after ``version`` of ``epoch`` (see :class:`SessionUpdate`); None when
        the session does not exist. ``read_since(sid)`` reads the whole session."""

    async def put_session(
        self, session_id: str, doc: SessionDocument, expected_version: int | None = None
    ) -> PutResult: ...
    async def commit(
        self, session_id: str, changes: SessionChanges, expected_version: int | None = None
    ) -> PutResult: ...
    async def append_messages(self, session_id: str, messages: list[Message]) -> PutResult: ...
    async def patch_session(
        self, session_id: str, patch: dict[str, Any], expected_version: int | None = None
    ) -> PutResult: ...
    async def put_evidence(self, session_id: str, evidence: Evidence) -> str: ...
    async def get_evidence(self, session_id: str, evidence_id: str) -> Evidence | None: ...
    async def list_evidences(
        self, session_id: str, filter: EvidenceFilter | None = None
    ) -> list[Evidence]: ...
    async def put_context_blocks(
        self, session_id: str, blocks: list[ContextBlock]
    ) -> PutResult: ...
    async def list_context_blocks(
        self, session_id: str, filter: BlockFilter | None = None
    ) -> list[ContextBlock]: ...
    async def append_tool_calls(
        self, session_id: str, tool_calls: list[ToolCall], expected_version: int | None = None
    ) -> PutResult: ...
    async def append_model_usage(
        self, session_id: str, usages: list[ModelUsage], expected_version: int | None = None
    ) -> PutResult: ...
    async def upsert_tasks(
        self, session_id: str, tasks: list[Task], expected_version: int | None = None
    ) -> PutResult: ...
    async def list_turns(self, session_id: str, limit: int | None = None) -> list[TurnRecord]:
        """The session's turn records, oldest first; with ``limit``, only the newest ``limit``
        of them (still oldest first). Raises :class:`ValueError` for a negative ``limit``."""

    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord | None:
        """The turn record ``turn_id`` of the session, or None when it is not stored."""

    async def list_sessions(self, user_id: str | None = None) -> list[str]:
        """Stored session ids, sorted; only those whose ``meta.actor.user_id`` is ``user_id``
        when it is given."""

    async def delete_session(self, session_id: str) -> bool:
        """Remove the session and every record of it; audited. False when it did not exist."""

    async def delete_evidence(self, session_id: str, evidence_id: str) -> bool:
        """Remove one evidence (its content is gone from storage); audited, bumps the version.
        False when it did not exist."""

    async def delete_user(self, user_id: str) -> list[str]:
        """Delete every session whose ``meta.actor.user_id`` is ``user_id``; the ids deleted."""

    async def audit_log(self, session_id: str | None = None) -> list[AuditRecord]:
        """The compliance actions carried out, oldest first (only ``session_id``'s if given)."""

    async def close(self) -> None: ...


class BaseStore(abc.ABC):
    """Implements the convenience methods on top of :meth:`commit`.

    Subclasses implement ``_commit`` and ``_put_session`` (which receive records already
    validated, owned by the store and never shared with the caller) plus the read and delete
    methods. ``commit`` and ``put_session`` fill in a ``message_id`` for messages that have
    none, so every stored message has a stable id. ``clock`` timestamps audit records.
    """

    keeps_json: ClassVar[bool] = False
    """Whether the store keeps only the JSON of the records it commits, never the objects:
    it need not validate an :class:`OwnedChanges` again to own its records."""

    keeps_token_counts: ClassVar[bool] = False
    """Whether the store keeps a change set's ``token_counts`` with their records and gives
    them back with those records from ``read_since`` and ``read_tail``."""

    def __init__(
        self, *, id_generator: IdGenerator | None = None, clock: Clock | None = None
    ) -> None:
        self._ids: IdGenerator = id_generator or UuidV4Generator()
        self._clock: Clock = clock or SystemClock()

    async def commit(
        self, session_id: str, changes: SessionChanges, expected_version: int | None = None
    ) -> PutResult:
        """Apply ``changes`` atomically; see the module docstring for the rules.

        Generated message ids are written back into ``changes.messages``. Raises
        :class:`SchemaValidationError` for an empty ``session_id`` or an invalid record.
        """
        return await self._commit(session_id, self._checked(session_id, changes), expected_version)

    def _checked(self, session_id: str, changes: SessionChanges) -> CheckedChanges:
        """``changes`` as :meth:`commit` stores them: ids filled in, validated again into
        records of the store's own, or serialized strictly where the store keeps only JSON
        and the records are the engine's own (:class:`OwnedChanges`); raises
        :class:`SchemaValidationError`."""
        _check_session_id(session_id)
        if any(m.message_id is None for m in changes.messages):
            changes.messages = [
                m if m.message_id else m.model_copy(update={"message_id": self._ids.generate()})
                for m in changes.messages
            ]
        return revalidated_changes(
            changes, again=not (self.keeps_json and isinstance(changes, OwnedChanges))
        )

    @abc.abstractmethod
    async def _commit(
        self, session_id: str, changes: SessionChanges, expected_version: int | None
    ) -> PutResult: ...

    async def put_session(
        self, session_id: str, doc: SessionDocument, expected_version: int | None = None
    ) -> PutResult:
        """Replace the whole stored document of ``session_id`` by ``doc`` (used by import).

        The turn records of the replaced document are discarded (commit the new document's
        turns afterwards). Always increments the version. Raises
        :class:`SchemaValidationError` when ``doc.session.session_id`` differs from
        ``session_id``, when ``doc.schema_version`` is not the current one (load older
        documents with ``load_document``, which migrates them), when record ids repeat, or
        when the document is invalid.
        """
        _check_session_id(session_id)
        if doc.session.session_id != session_id:
            raise SchemaValidationError(
                [("session.session_id", f"{doc.session.session_id!r} is not {session_id!r}")]
            )
        if doc.schema_version != SCHEMA_VERSION:
            raise SchemaValidationError(
                [("schema_version", f"must be {SCHEMA_VERSION!r}, got {doc.schema_version!r}")]
            )
        if any(m.message_id is None for m in doc.session.messages):
            messages = [
                m if m.message_id else m.model_copy(update={"message_id": self._ids.generate()})
                for m in doc.session.messages
            ]
            doc = doc.model_copy(
                update={"session": doc.session.model_copy(update={"messages": messages})}
            )
        checked = revalidated(SessionDocument, doc, "")
        check_unique_ids(checked)
        return await self._put_session(session_id, checked, expected_version)

    @abc.abstractmethod
    async def _put_session(
        self, session_id: str, doc: SessionDocument, expected_version: int | None
    ) -> PutResult: ...

    async def delete_user(self, user_id: str) -> list[str]:
        """Delete every session whose ``meta.actor.user_id`` is ``user_id``.

        Returns the deleted session ids, sorted; each deletion is audited like
        :meth:`delete_session`. A session that gains this user after the call started may
        survive it. Raises :class:`SchemaValidationError` for an empty ``user_id`` (which
        would match every session without an identified user).
        """
        if not user_id:
            raise SchemaValidationError([("user_id", "must be a non-empty string")])
        deleted = []
        for session_id in await self.list_sessions(user_id=user_id):
            if await self.delete_session(session_id):
                deleted.append(session_id)
        return deleted

    @staticmethod
    def _check_version(session_id: str, expected: int | None, actual: int) -> None:
        """Raise :class:`VersionConflictError` unless ``expected`` is None or ``actual``."""
        if expected is not None and expected != actual:
            raise VersionConflictError(session_id, expected, actual)

    def _audit_record(self, action: str, session_id: str, target: str = "") -> AuditRecord:
        return AuditRecord(
            at=self._clock.now_iso(), action=action, session_id=session_id, target=target
        )

    async def append_messages(self, session_id: str, messages: list[Message]) -> PutResult:
        return await self.commit(session_id, SessionChanges(messages=list(messages)))

    async def patch_session(
        self, session_id: str, patch: dict[str, Any], expected_version: int | None = None
    ) -> PutResult:
        return await self.commit(session_id, SessionChanges.from_patch(patch), expected_version)

    async def put_evidence(self, session_id: str, evidence: Evidence) -> str:
        await self.commit(session_id, SessionChanges(evidences=[evidence]))
        return evidence.evidence_id

    async def put_context_blocks(self, session_id: str, blocks: list[ContextBlock]) -> PutResult:
        return await self.commit(session_id, SessionChanges(context_blocks=list(blocks)))

    async def append_tool_calls(
        self, session_id: str, tool_calls: list[ToolCall], expected_version: int | None = None
    ) -> PutResult:
        return await self.commit(
            session_id, SessionChanges(tool_calls=list(tool_calls)), expected_version
        )

    async def append_model_usage(
        self, session_id: str, usages: list[ModelUsage], expected_version: int | None = None
    ) -> PutResult:
        return await self.commit(
            session_id, SessionChanges(model_usage=list(usages)), expected_version
        )

    async def upsert_tasks(
        self, session_id: str, tasks: list[Task], expected_version: int | None = None
    ) -> PutResult:
        return await self.commit(session_id, SessionChanges(tasks=list(tasks)), expected_version)

    async def __aenter__(self) -> BaseStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @abc.abstractmethod
    async def get_session(self, session_id: str) -> SessionDocument | None:
        """The stored document, or None when the session does not exist."""

    @abc.abstractmethod
    async def get_version(self, session_id: str) -> int:
        """The stored version (0 when the session does not exist)."""

    async def read_since(
        self, session_id: str, version: int = 0, epoch: str = ""
    ) -> SessionUpdate | None:
        """What changed after ``version`` of ``epoch`` (see :class:`SessionUpdate`); None when
        the session does not exist.

        This default keeps no epochs (``""``): a reader at the stored version gets an empty
        update, any other reader the whole session. Stores that can read only the records
        written after a version override it.
        """
        stored = await self.get_version(session_id)
        if stored == 0:
            return None
        if 0 < version == stored and epoch == "":
            return SessionUpdate(version=stored, epoch="", complete=False, changes=SessionChanges())
        doc = await self.get_session(session_id)
        if doc is None:
            return None
        # a commit may land between the two reads: the version is then older than the
        # document, and the reader's next commit gets a version conflict and reads again
        return whole_update(doc, stored, "", version, epoch)

    async def read_tail(
        self, session_id: str, *, messages: int, evidences: int
    ) -> SessionSlice | None:
        """The newest records of the session (see :class:`SliceStore`); None when it does
        not exist.

        This default reads the whole document: its tail is the whole session. Stores that
        keep a row per record override it to read only the newest ones.
        """
        check_slice_size(messages, evidences)
        stored = await self.get_version(session_id)
        doc = await self.get_session(session_id) if stored else None
        return None if doc is None else slice_document(doc, stored, "")

    async def read_messages(self, session_id: str, message_ids: Sequence[str]) -> list[Message]:
        """The session's stored messages with one of ``message_ids`` (see
        :class:`SliceStore`). This default reads the whole document; stores that keep a row
        per record override it to read only those."""
        wanted = set(message_ids)
        doc = await self.get_session(session_id) if wanted else None
        if doc is None:
            return []
        return [m for m in doc.session.messages if m.message_id in wanted]

    async def read_evidences(self, session_id: str, dedup_keys: Sequence[str]) -> list[Evidence]:
        """The session's stored evidences with one of ``dedup_keys`` (see
        :class:`SliceStore`). This default reads the whole document; stores that keep a row
        per record override it to read only those."""
        wanted = set(dedup_keys)
        doc = await self.get_session(session_id) if wanted else None
        if doc is None:
            return []
        return [e for e in doc.evidences.values() if e.metadata.get("dedup_key") in wanted]

    @abc.abstractmethod
    async def get_evidence(self, session_id: str, evidence_id: str) -> Evidence | None: ...

    @abc.abstractmethod
    async def list_evidences(
        self, session_id: str, filter: EvidenceFilter | None = None
    ) -> list[Evidence]:
        """The session's evidences in insertion order, filtered by :func:`filter_evidences`."""

    @abc.abstractmethod
    async def list_context_blocks(
        self, session_id: str, filter: BlockFilter | None = None
    ) -> list[ContextBlock]:
        """The session's blocks in stored order, filtered by :func:`filter_blocks`."""

    async def list_turns(self, session_id: str, limit: int | None = None) -> list[TurnRecord]:
        """The session's turn records, oldest first; with ``limit``, only the newest ``limit``
        of them (still oldest first). Raises :class:`ValueError` for a negative ``limit``."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        return await self._list_turns(session_id, limit)

    @abc.abstractmethod
    async def _list_turns(self, session_id: str, limit: int | None) -> list[TurnRecord]:
        """``list_turns`` with ``limit`` already checked."""

    @abc.abstractmethod
    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord | None:
        """The turn record ``turn_id`` of the session, or None when it is not stored."""

    @abc.abstractmethod
    async def list_sessions(self, user_id: str | None = None) -> list[str]: ...

    @abc.abstractmethod
    async def delete_session(self, session_id: str) -> bool: ...

    @abc.abstractmethod
    async def delete_evidence(self, session_id: str, evidence_id: str) -> bool: ...

    @abc.abstractmethod
    async def audit_log(self, session_id: str | None = None) -> list[AuditRecord]: ...

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the store's resources; the store cannot be used afterwards."""


def _check_session_id(session_id: str) -> None:
    if not isinstance(session_id, str) or not session_id:
        raise SchemaValidationError([("session_id", "must be a non-empty string")])


async def turn_config(store: Store, session_id: str, record: TurnRecord) -> dict[str, Any]:
    """The config snapshot ``record`` was prepared under: its own ``config``, or that of the
    session's turn record holding the snapshot its ``config_id`` names. Raises
    :class:`~ce.core.errors.StoreError` when no stored turn holds it."""
    if record.config or record.config_id is None:
        return record.config
    for turn in await store.list_turns(session_id):
        if turn.config_id == record.config_id and turn.config:
            return turn.config
    raise StoreError(
        f"session {session_id!r}: no turn record holds config snapshot {record.config_id!r}"
    )


def check_slice_size(messages: int, evidences: int) -> None:
    """Raise :class:`ValueError` for a slice size a store cannot read."""
    if messages < 1 or evidences < 0:
        raise ValueError("a slice reads at least 1 message and at least 0 evidences")
