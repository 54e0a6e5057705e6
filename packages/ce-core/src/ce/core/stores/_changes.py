"""Change sets: what one :meth:`~ce.core.stores.base.Store.commit` applies, and how a store
checks a change set's records before it keeps their JSON (see the ``Validation`` rule of
:mod:`ce.core.stores.base`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from ce.core.errors import SchemaValidationError
from ce.core.schema import (
    ContextBlock,
    Evidence,
    Message,
    Meta,
    ModelUsage,
    RunState,
    SessionDocument,
    Summary,
    Task,
    ToolCall,
    TurnRecord,
    validate_model,
)

__all__ = [
    "CheckedChanges",
    "OwnedChanges",
    "SessionChanges",
    "SessionUpdate",
    "changes_of",
    "check_unique_ids",
    "new_epoch",
    "revalidated",
    "revalidated_changes",
    "whole_update",
]

_M = TypeVar("_M", bound=BaseModel)


@dataclass
class SessionChanges:
    """Records to add to one session in one atomic commit.

    ``messages``, ``tool_calls``, ``model_usage``, ``evidences`` and ``turns`` are appended
    (skipped when their id is already stored); ``context_blocks`` and ``tasks`` are upserted by
    id; ``summary``, ``run`` and ``meta`` replace the stored value when given. ``turns`` are
    kept beside the document (see the module docstring).

    ``token_counts`` maps the id of a message or an evidence of the change set to token
    counts (JSON, see :data:`~ce.core.tokens.StoredCounts`) that a store keeping them stores
    with that record and gives back with it (:attr:`BaseStore.keeps_token_counts`): counts
    the engine computed while writing, so that a process reading the records later need not
    tokenize their texts again. They are a hint: a reader checks each against the digest of
    the text it counts.
    """

    messages: list[Message] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    model_usage: list[ModelUsage] = field(default_factory=list)
    evidences: list[Evidence] = field(default_factory=list)
    context_blocks: list[ContextBlock] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    summary: Summary | None = None
    run: RunState | None = None
    meta: Meta | None = None
    token_counts: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def is_empty(self) -> bool:
        return not any(getattr(self, f.name) for f in fields(self) if f.name != "token_counts")

    def has_records(self) -> bool:
        """Whether it holds anything of the session document but the run state (turn
        records are kept beside the document)."""
        return bool(
            self.messages
            or self.tool_calls
            or self.model_usage
            or self.evidences
            or self.context_blocks
            or self.tasks
            or self.summary is not None
            or self.meta is not None
        )

    def merge(self, other: SessionChanges) -> SessionChanges:
        """A new change set with ``other`` applied after this one."""
        return SessionChanges(
            messages=[*self.messages, *other.messages],
            tool_calls=[*self.tool_calls, *other.tool_calls],
            model_usage=[*self.model_usage, *other.model_usage],
            evidences=[*self.evidences, *other.evidences],
            context_blocks=[*self.context_blocks, *other.context_blocks],
            tasks=[*self.tasks, *other.tasks],
            turns=[*self.turns, *other.turns],
            summary=other.summary or self.summary,
            run=other.run or self.run,
            meta=other.meta or self.meta,
            token_counts={**self.token_counts, **other.token_counts},
        )

    @classmethod
    def from_patch(cls, patch: dict[str, Any]) -> SessionChanges:
        """Build a change set from a ``patch_session`` dict (keys are this class's fields).

        Raises :class:`SchemaValidationError` for unknown keys or invalid records.
        """
        known = {f.name for f in fields(cls)} - {"token_counts"}
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
            "turns": TurnRecord,
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


@dataclass
class SessionUpdate:
    """What a reader holding a copy of a session at ``(version, epoch)`` needs to catch up,
    as :meth:`Store.read_since` returns it.

    ``complete`` is False when ``changes`` hold only what commits after the reader's version
    added: appended messages, tool calls, usage records and evidences in stored order,
    context blocks and tasks stored or changed since (latest form), and the current
    ``summary``, ``run`` and ``meta`` (None when not set). Applying them to the copy gives the
    stored session. ``complete`` is True when ``changes`` hold the whole session (every record
    in stored order) and the copy must be replaced: the reader had nothing, or the session was
    rewritten since (``put_session``, ``delete_evidence``, deleted and created again), or the
    store does not keep what an incremental read needs. ``changes.turns`` is always empty.

    ``epoch`` names one unbroken history of the session: it changes whenever stored records
    are replaced or removed, so a reader's version only counts within its epoch. Stores that
    do not track epochs report ``""``.
    """

    version: int
    epoch: str
    complete: bool
    changes: SessionChanges


def whole_update(
    doc: SessionDocument, stored: int, stored_epoch: str, version: int, epoch: str
) -> SessionUpdate:
    """The update of a store that reads whole documents: nothing for a reader at the stored
    version and epoch, else the whole session."""
    if 0 < version == stored and epoch == stored_epoch:
        return SessionUpdate(stored, stored_epoch, complete=False, changes=SessionChanges())
    return SessionUpdate(stored, stored_epoch, complete=True, changes=changes_of(doc))


def new_epoch() -> str:
    """A fresh epoch name (see :class:`SessionUpdate`)."""
    return uuid.uuid4().hex


def changes_of(doc: SessionDocument) -> SessionChanges:
    """Every record of ``doc`` as one change set (stored order; no turn records)."""
    session = doc.session
    return SessionChanges(
        messages=list(session.messages),
        tool_calls=list(session.tool_state.tool_calls),
        model_usage=list(session.model_usage),
        evidences=list(doc.evidences.values()),
        context_blocks=list(doc.context_blocks),
        tasks=list(session.task_state.todo_list.tasks),
        summary=session.summary,
        run=session.run,
        meta=doc.meta,
    )


def _validate_at(key: str, index: int, item: Any, model: type[Any]) -> Any:
    try:
        return validate_model(model, item)
    except SchemaValidationError as exc:
        raise SchemaValidationError(
            [(_join(f"{key}.{index}", path), msg) for path, msg in exc.errors]
        ) from None


def _join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if prefix and path else prefix or path


def revalidated(
    model: type[_M], record: object, path: str, bodies: dict[int, str] | None = None
) -> _M:
    """``record`` validated again from its stored JSON form (``exclude_none``), as a new
    instance of ``model``; that JSON goes into ``bodies`` under the new instance's id."""
    record = _of_type(model, record, path)
    try:
        body = record.model_dump_json(exclude_none=True, warnings=False)
        checked = model.model_validate_json(body)
    except PydanticSerializationError as exc:
        raise SchemaValidationError([(path, f"not JSON-serializable: {exc}")]) from None
    except ValidationError as exc:
        raise SchemaValidationError(
            [(_join(path, ".".join(map(str, err["loc"]))), err["msg"]) for err in exc.errors()]
        ) from None
    if bodies is not None:
        bodies[id(checked)] = body
    return checked


def _serialized(
    model: type[_M], record: object, path: str, bodies: dict[int, str] | None = None
) -> _M:
    """``record`` itself, serialized strictly into ``bodies`` (a value of another type than
    its field's raises): for a record made by the schema's validating constructor."""
    record = _of_type(model, record, path)
    try:
        body = record.model_dump_json(exclude_none=True, warnings="error")
    except PydanticSerializationError as exc:
        raise SchemaValidationError([(path, f"not JSON-serializable: {exc}")]) from None
    if bodies is not None:
        bodies[id(record)] = body
    return record


def _of_type(model: type[_M], record: object, path: str) -> _M:
    if not isinstance(record, model):
        raise SchemaValidationError(
            [(path, f"expected {model.__name__}, got {type(record).__name__}")]
        )
    return record


class OwnedChanges(SessionChanges):
    """A change set whose records were all made by the schema's validating constructors (or
    copied from such records with values of their fields' types), as the engine makes them.
    A store that keeps only the records' JSON (:attr:`BaseStore.keeps_json`) serializes them
    strictly, a value of the wrong type raising :class:`SchemaValidationError`, instead of
    validating each one again from its JSON."""

    @classmethod
    def of(cls, changes: SessionChanges) -> OwnedChanges:
        return cls(**{f.name: getattr(changes, f.name) for f in fields(SessionChanges)})


@dataclass
class CheckedChanges(SessionChanges):
    """A change set validated by :meth:`BaseStore.commit`: records of the store's own, with
    the JSON each was validated from (``body_of``), so a store need not serialize it again."""

    bodies: dict[int, str] = field(default_factory=dict, repr=False, compare=False)

    def body_of(self, record: BaseModel) -> str:
        """The stored JSON form of one of this change set's records."""
        body = self.bodies.get(id(record))
        return body if body is not None else record.model_dump_json(exclude_none=True)


def revalidated_changes(changes: SessionChanges, again: bool = True) -> CheckedChanges:
    """``changes`` as a store keeps them: each record validated again from its JSON into a
    new one, or (``again`` false) serialized strictly (see :func:`_serialized`)."""
    bodies: dict[int, str] = {}
    check = revalidated if again else _serialized

    def each(items: list[Any], model: type[_M], key: str) -> list[_M]:
        if not isinstance(items, list):
            raise SchemaValidationError([(key, "must be a list")])
        return [check(model, item, f"{key}.{i}", bodies) for i, item in enumerate(items)]

    def one(value: object, model: type[_M], key: str) -> _M | None:
        return None if value is None else check(model, value, key, bodies)

    return CheckedChanges(
        messages=each(changes.messages, Message, "messages"),
        tool_calls=each(changes.tool_calls, ToolCall, "tool_calls"),
        model_usage=each(changes.model_usage, ModelUsage, "model_usage"),
        evidences=each(changes.evidences, Evidence, "evidences"),
        context_blocks=each(changes.context_blocks, ContextBlock, "context_blocks"),
        tasks=each(changes.tasks, Task, "tasks"),
        turns=each(changes.turns, TurnRecord, "turns"),
        summary=one(changes.summary, Summary, "summary"),
        run=one(changes.run, RunState, "run"),
        meta=one(changes.meta, Meta, "meta"),
        token_counts=changes.token_counts,
        bodies=bodies,
    )


def check_unique_ids(doc: SessionDocument) -> None:
    session = doc.session
    groups: list[tuple[str, str, list[str | None]]] = [
        ("session.messages", "message_id", [m.message_id for m in session.messages]),
        (
            "session.tool_state.tool_calls",
            "tool_call_id",
            [c.tool_call_id for c in session.tool_state.tool_calls],
        ),
        ("session.model_usage", "model_usage_id", [u.model_usage_id for u in session.model_usage]),
        (
            "session.task_state.todo_list.tasks",
            "task_id",
            [t.task_id for t in session.task_state.todo_list.tasks],
        ),
    ]
    errors: list[tuple[str, str]] = []
    for where, id_field, ids in groups:
        seen: set[str | None] = set()
        for i, record_id in enumerate(ids):
            if record_id in seen:
                errors.append((f"{where}.{i}.{id_field}", f"duplicate id {record_id!r}"))
            seen.add(record_id)
    if errors:
        raise SchemaValidationError(errors)
