"""The row-per-record format that SQLiteStore and PostgresStore share: which tables hold which
records, a record's row (its id and its JSON body), and a session rebuilt from its rows. The
SQL of each database stays in its own module."""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ce.core.errors import StoreError
from ce.core.schema import (
    SCHEMA_VERSION,
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
)
from ce.core.schema._document import evidence_link, may_state_facts
from ce.core.stores._changes import CheckedChanges, SessionChanges

__all__ = [
    "DEFAULT_RUN",
    "DOCUMENT_TABLES",
    "HEAD_COLUMNS",
    "RECORD_TABLES",
    "TAGGED",
    "UPSERTED",
    "changes_from_rows",
    "check_schema_version",
    "counted_rows",
    "dedup_key",
    "document_from_rows",
    "head_updates",
    "record_json",
    "record_rows",
    "row_tags",
]

_M = TypeVar("_M", bound=BaseModel)

RECORD_TABLES = {
    "messages": "message_id",
    "tool_calls": "tool_call_id",
    "model_usage": "model_usage_id",
    "evidences": "evidence_id",
    "context_blocks": "block_id",
    "tasks": "task_id",
    "turns": "turn_id",
}
"""Record table -> the column holding the record's id (unique per session)."""

UPSERTED = frozenset({"context_blocks", "tasks"})
"""Tables whose records are replaced by id; the others are appended (a stored id is kept)."""

DOCUMENT_TABLES = tuple(table for table in RECORD_TABLES if table != "turns")
"""Record tables that are part of the session document (turn records are kept beside it)."""

HEAD_COLUMNS = ("summary", "run_state", "meta")
"""The session row's JSON columns."""

DEFAULT_RUN = RunState().model_dump_json(exclude_none=True)
"""``run_state`` of a session that has never set one."""


def record_json(model: BaseModel) -> str:
    """A record's body as every store keeps it."""
    return model.model_dump_json(exclude_none=True)


def head_updates(changes: SessionChanges, stored: dict[str, str | None]) -> dict[str, str | None]:
    """The session row's JSON columns (``HEAD_COLUMNS``) that ``changes`` set to a value
    other than the ``stored`` one, with their new JSON."""
    body = changes.body_of if isinstance(changes, CheckedChanges) else record_json
    given = zip(HEAD_COLUMNS, (changes.summary, changes.run, changes.meta), strict=True)
    updates: dict[str, str | None] = {}
    for column, value in given:
        if value is not None and (text := body(value)) != stored[column]:
            updates[column] = text
    return updates


def _message_id(message: Message) -> str:
    # BaseStore.commit and put_session give every message an id before it reaches a store.
    assert message.message_id is not None
    return message.message_id


_ids: dict[str, Callable[[Any], str]] = {
    table: operator.attrgetter(RECORD_TABLES[table])
    for table in ("tool_calls", "model_usage", "evidences", "context_blocks", "tasks", "turns")
}
"""Each record table's record id (a message's is :func:`_message_id`)."""


def record_rows(changes: SessionChanges) -> dict[str, list[tuple[str, str]]]:
    """``(record_id, body)`` rows per record table that has any, in the tables' order;
    appended tables keep the first row of an id, upserted ones the last (at the position of
    the first)."""
    body = changes.body_of if isinstance(changes, CheckedChanges) else record_json
    records: tuple[tuple[str, list[Any], Callable[[Any], str]], ...] = (
        ("messages", changes.messages, _message_id),
        ("tool_calls", changes.tool_calls, _ids["tool_calls"]),
        ("model_usage", changes.model_usage, _ids["model_usage"]),
        ("evidences", changes.evidences, _ids["evidences"]),
        ("context_blocks", changes.context_blocks, _ids["context_blocks"]),
        ("tasks", changes.tasks, _ids["tasks"]),
        ("turns", changes.turns, _ids["turns"]),
    )
    unique: dict[str, list[tuple[str, str]]] = {}
    for table, items, record_id in records:
        if not items:
            continue
        by_id: dict[str, str] = {}
        for item in items:
            key = record_id(item)
            if table in UPSERTED or key not in by_id:
                by_id[key] = body(item)
        unique[table] = list(by_id.items())
    return unique


TAGGED = {
    "messages": ("role", "tokens"),
    "evidences": ("facts", "link", "tokens", "dedup"),
}
"""Record tables with columns beside the body: what a partial read looks rows up by (a
message's role: the newest system message before a slice; whether an evidence may state facts,
:func:`~ce.core.schema._document.may_state_facts`, what it belongs to,
:func:`~ce.core.schema._document.evidence_link`, and its deduplication key, :func:`dedup_key`),
and the token counts written with the record (``SessionChanges.token_counts``; NULL when
none)."""


def dedup_key(evidence: Evidence) -> str | None:
    """The key an evidence is deduplicated by (``metadata.dedup_key``, set when it was
    ingested), None when it has none."""
    key = evidence.metadata.get("dedup_key")
    return key if isinstance(key, str) and key else None


def row_tags(changes: SessionChanges) -> dict[str, dict[str, tuple[object, ...]]]:
    """The values of the :data:`TAGGED` columns of the records of ``changes``, per table and
    record id (of the first record of an id, the one :func:`record_rows` keeps)."""
    counts = changes.token_counts
    messages: dict[str, tuple[object, ...]] = {}
    for m in changes.messages:
        message_id = _message_id(m)
        messages.setdefault(message_id, (m.role.value, counts.get(message_id)))
    evidences: dict[str, tuple[object, ...]] = {}
    for e in changes.evidences:
        if e.evidence_id not in evidences:
            evidences[e.evidence_id] = (
                int(may_state_facts(e)),
                evidence_link(e),
                counts.get(e.evidence_id),
                dedup_key(e),
            )
    return {"messages": messages, "evidences": evidences}


def check_schema_version(session_id: str, schema_version: str) -> None:
    """Raise :class:`StoreError` for a session written with another schema version."""
    if schema_version != SCHEMA_VERSION:
        raise StoreError(
            f"session {session_id!r} was written with schema version {schema_version!r}; "
            f"this ce-core reads {SCHEMA_VERSION!r}"
        )


def _array(bodies: list[str]) -> str:
    return "[" + ",".join(bodies) + "]"


def document_from_rows(
    session_id: str,
    head: tuple[str, str | None, str, str | None],
    rows: dict[str, list[tuple[str, str]]],
) -> SessionDocument:
    """The document of a session from its row (``schema_version``, ``summary``,
    ``run_state``, ``meta``) and the ``(record_id, body)`` rows of its document tables in
    stored order: one JSON text validated once. Raises :class:`StoreError` when it does not
    validate or was written with another schema version."""
    schema_version, summary, run_state, meta = head
    check_schema_version(session_id, schema_version)
    bodies = {table: [body for _, body in rows[table]] for table in DOCUMENT_TABLES}
    session = [
        f'"session_id":{json.dumps(session_id)}',
        f'"messages":{_array(bodies["messages"])}',
        f'"task_state":{{"todo_list":{{"tasks":{_array(bodies["tasks"])}}}}}',
        f'"tool_state":{{"tool_calls":{_array(bodies["tool_calls"])}}}',
        f'"model_usage":{_array(bodies["model_usage"])}',
        f'"run":{run_state}',
    ]
    if summary is not None:
        session.append(f'"summary":{summary}')
    evidences = ",".join(f"{json.dumps(eid)}:{body}" for eid, body in rows["evidences"])
    document = [
        f'"schema_version":{json.dumps(schema_version)}',
        f'"session":{{{",".join(session)}}}',
        f'"evidences":{{{evidences}}}',
        f'"context_blocks":{_array(bodies["context_blocks"])}',
    ]
    if meta is not None:
        document.append(f'"meta":{meta}')
    try:
        return SessionDocument.model_validate_json("{" + ",".join(document) + "}")
    except ValidationError as exc:
        raise StoreError(f"session {session_id!r} is corrupt: {exc}") from exc


def changes_from_rows(
    session_id: str,
    head: tuple[str | None, str, str | None],
    rows: dict[str, list[tuple[str, str]]],
    token_counts: dict[str, str] | None = None,
) -> SessionChanges:
    """The records of ``(record_id, body)`` rows of the document tables, with the session
    row's current ``summary``, ``run_state`` and ``meta`` and the ``token_counts`` read with
    them, as the changes of a :class:`~ce.core.stores.base.SessionUpdate`. Raises
    :class:`StoreError` when a body does not validate."""
    summary, run_state, meta = head

    def parsed(table: str, model: type[_M]) -> list[_M]:
        return [model.model_validate_json(body) for _, body in rows[table]]

    try:
        return SessionChanges(
            messages=parsed("messages", Message),
            tool_calls=parsed("tool_calls", ToolCall),
            model_usage=parsed("model_usage", ModelUsage),
            evidences=parsed("evidences", Evidence),
            context_blocks=parsed("context_blocks", ContextBlock),
            tasks=parsed("tasks", Task),
            summary=None if summary is None else Summary.model_validate_json(summary),
            run=RunState.model_validate_json(run_state),
            meta=None if meta is None else Meta.model_validate_json(meta),
            token_counts=token_counts or {},
        )
    except ValidationError as exc:
        raise StoreError(f"session {session_id!r} is corrupt: {exc}") from exc


def counted_rows(
    rows: list[tuple[str, str, str | None]], counts: dict[str, str]
) -> list[tuple[str, str]]:
    """``(record_id, body)`` of ``(record_id, body, tokens)`` rows, each row's token counts
    (when it has any) added to ``counts`` under its record id."""
    out = []
    for record_id, body, tokens in rows:
        if tokens is not None:
            counts[record_id] = tokens
        out.append((record_id, body))
    return out
