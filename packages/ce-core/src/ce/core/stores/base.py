"""The ``Store`` protocol (seed 004 §6.1) and what every store implementation shares.

A store persists session documents. Writes go through :meth:`Store.commit`, which applies one
:class:`SessionChanges` atomically: either every record of it is stored or none is. Appends are
idempotent on their ids (``message_id``, ``tool_call_id``, ``model_usage_id``,
``evidence_id``): a record whose id is already stored is skipped, so a retried write never
duplicates anything. Every commit that stores something increments the session version by one;
a commit with ``expected_version`` raises :class:`~ce.core.errors.VersionConflictError` when the
stored version differs (a session that does not exist yet has version 0).

The seed's convenience methods (``append_messages``, ``put_evidence``, ``append_tool_calls``,
…) are all expressed through ``commit`` by :class:`BaseStore`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

from ce.core.errors import SchemaValidationError
from ce.core.primitives import IdGenerator, UuidV4Generator, parse_iso
from ce.core.schema import (
    BlockType,
    ContextBlock,
    Evidence,
    EvidenceType,
    Message,
    Meta,
    ModelUsage,
    Priority,
    PutResult,
    RunState,
    SessionDocument,
    SourceKind,
    Summary,
    Task,
    ToolCall,
    validate_model,
)

__all__ = [
    "AuditRecord",
    "BaseStore",
    "BlockFilter",
    "EvidenceFilter",
    "SessionChanges",
    "Store",
    "filter_blocks",
    "filter_evidences",
]

_PRIORITY_RANK = {Priority.MUST: 0, Priority.HIGH: 1, Priority.MEDIUM: 2, Priority.LOW: 3}


@dataclass
class EvidenceFilter:
    """Which evidences :meth:`Store.list_evidences` returns (all criteria must hold)."""

    types: list[EvidenceType] | None = None
    source_kinds: list[SourceKind] | None = None
    since: str | None = None
    until: str | None = None
    tags: dict[str, str] | None = None
    limit: int | None = None


@dataclass
class BlockFilter:
    """Which context blocks :meth:`Store.list_context_blocks` returns."""

    block_types: list[BlockType] | None = None
    priorities: list[Priority] | None = None
    min_priority: Priority | None = None
    limit: int | None = None


@dataclass
class SessionChanges:
    """Records to add to one session in one atomic commit.

    ``messages``, ``tool_calls``, ``model_usage`` and ``evidences`` are appended (skipped when
    their id is already stored); ``context_blocks`` and ``tasks`` are upserted by id;
    ``summary``, ``run`` and ``meta`` replace the stored value when given.
    """

    messages: list[Message] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    model_usage: list[ModelUsage] = field(default_factory=list)
    evidences: list[Evidence] = field(default_factory=list)
    context_blocks: list[ContextBlock] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    summary: Summary | None = None
    run: RunState | None = None
    meta: Meta | None = None

    def is_empty(self) -> bool:
        return not any(getattr(self, f.name) for f in fields(self))

    def merge(self, other: SessionChanges) -> SessionChanges:
        """A new change set with ``other`` applied after this one."""
        return SessionChanges(
            messages=[*self.messages, *other.messages],
            tool_calls=[*self.tool_calls, *other.tool_calls],
            model_usage=[*self.model_usage, *other.model_usage],
            evidences=[*self.evidences, *other.evidences],
            context_blocks=[*self.context_blocks, *other.context_blocks],
            tasks=[*self.tasks, *other.tasks],
            summary=other.summary or self.summary,
            run=other.run or self.run,
            meta=other.meta or self.meta,
        )

    @classmethod
    def from_patch(cls, patch: dict[str, Any]) -> SessionChanges:
        """Build a change set from a ``patch_session`` dict (keys are this class's fields).

        Raises :class:`SchemaValidationError` for unknown keys or invalid records.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(patch) - known)
        if unknown:
            raise SchemaValidationError([(key, "unknown patch key") for key in unknown])
        list_models: dict[str, type[Any]] = {
            "messages": Message,
            "tool_calls": ToolCall,
            "model_usage": ModelUsage,
            "evidences": Evidence,
            "context_blocks": ContextBlock,
            "tasks": Task,
        }
        single_models: dict[str, type[Any]] = {"summary": Summary, "run": RunState, "meta": Meta}
        kwargs: dict[str, Any] = {}
        for key, value in patch.items():
            if key in list_models:
                if not isinstance(value, list):
                    raise SchemaValidationError([(key, "must be a list")])
                kwargs[key] = [
                    item
                    if isinstance(item, list_models[key])
                    else _validate_at(key, i, item, list_models[key])
                    for i, item in enumerate(value)
                ]
            elif value is not None:
                model = single_models[key]
                kwargs[key] = value if isinstance(value, model) else validate_model(model, value)
        return cls(**kwargs)


def _validate_at(key: str, index: int, item: Any, model: type[Any]) -> Any:
    try:
        return validate_model(model, item)
    except SchemaValidationError as exc:
        raise SchemaValidationError(
            [
                (f"{key}.{index}.{path}" if path else f"{key}.{index}", msg)
                for path, msg in exc.errors
            ]
        ) from None


@dataclass(frozen=True)
class AuditRecord:
    """One compliance action a store carried out (kept after the data is gone)."""

    at: str
    action: str
    session_id: str
    target: str = ""


@runtime_checkable
class Store(Protocol):
    """Persistence of session documents with optimistic versions (seed 004 §6.1)."""

    async def get_session(self, session_id: str) -> SessionDocument | None: ...
    async def get_version(self, session_id: str) -> int: ...
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
    async def list_sessions(self, user_id: str | None = None) -> list[str]: ...
    async def delete_session(self, session_id: str) -> bool: ...
    async def delete_evidence(self, session_id: str, evidence_id: str) -> bool: ...
    async def audit_log(self, session_id: str | None = None) -> list[AuditRecord]: ...
    async def close(self) -> None: ...


class BaseStore(abc.ABC):
    """Implements the seed's convenience methods on top of :meth:`commit`.

    Subclasses implement ``_commit`` plus the read and delete methods. ``commit`` fills in a
    ``message_id`` for messages that have none, so every stored message has a stable id.
    """

    def __init__(self, *, id_generator: IdGenerator | None = None) -> None:
        self._ids: IdGenerator = id_generator or UuidV4Generator()

    async def commit(
        self, session_id: str, changes: SessionChanges, expected_version: int | None = None
    ) -> PutResult:
        """Apply ``changes`` atomically; see the module docstring for the rules."""
        if not session_id:
            raise SchemaValidationError([("session_id", "must be a non-empty string")])
        if any(m.message_id is None for m in changes.messages):
            changes.messages = [
                m if m.message_id else m.model_copy(update={"message_id": self._ids.generate()})
                for m in changes.messages
            ]
        return await self._commit(session_id, changes, expected_version)

    @abc.abstractmethod
    async def _commit(
        self, session_id: str, changes: SessionChanges, expected_version: int | None
    ) -> PutResult: ...

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
    async def close(self) -> None: ...


def filter_evidences(evidences: list[Evidence], flt: EvidenceFilter | None) -> list[Evidence]:
    """Apply ``flt`` to evidences given in insertion order."""
    if flt is None:
        return list(evidences)
    since = parse_iso(flt.since) if flt.since else None
    until = parse_iso(flt.until) if flt.until else None
    out: list[Evidence] = []
    for ev in evidences:
        if flt.types is not None and ev.type not in flt.types:
            continue
        if flt.source_kinds is not None and ev.source.kind not in flt.source_kinds:
            continue
        if since or until:
            if not ev.created_at:
                continue
            created = parse_iso(ev.created_at)
            if since and created < since:
                continue
            if until and created > until:
                continue
        if flt.tags and any(str(ev.metadata.get(k)) != v for k, v in flt.tags.items()):
            continue
        out.append(ev)
        if flt.limit is not None and len(out) >= flt.limit:
            break
    return out


def filter_blocks(blocks: list[ContextBlock], flt: BlockFilter | None) -> list[ContextBlock]:
    """Apply ``flt`` to blocks given in stored order."""
    if flt is None:
        return list(blocks)
    out: list[ContextBlock] = []
    for block in blocks:
        if flt.block_types is not None and block.block_type not in flt.block_types:
            continue
        if flt.priorities is not None and block.priority not in flt.priorities:
            continue
        if (
            flt.min_priority is not None
            and _PRIORITY_RANK[block.priority] > _PRIORITY_RANK[flt.min_priority]
        ):
            continue
        out.append(block)
        if flt.limit is not None and len(out) >= flt.limit:
            break
    return out
