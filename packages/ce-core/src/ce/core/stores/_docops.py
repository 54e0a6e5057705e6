"""Applying a :class:`SessionChanges` to a whole document and its turn records (MemoryStore and
FileStore).

Functions here never modify their inputs: they return a new document that shares the records
it did not change, so a failure halfway leaves the stored document untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ce.core.schema import (
    SCHEMA_VERSION,
    Meta,
    Session,
    SessionDocument,
    TaskState,
    TodoList,
    ToolState,
    TurnRecord,
)
from ce.core.stores.base import SessionChanges

__all__ = [
    "append_turns",
    "apply_changes",
    "new_document",
    "newest",
    "remove_evidence",
    "user_id_of",
]

_R = TypeVar("_R")


def new_document(session_id: str) -> SessionDocument:
    """The empty document of a session that does not exist yet."""
    return SessionDocument(schema_version=SCHEMA_VERSION, session=Session(session_id=session_id))


def user_id_of(meta: Meta | None) -> str | None:
    """``meta.actor.user_id``, or None when the document names no actor."""
    return meta.actor.user_id if meta is not None and meta.actor is not None else None


def append_new(stored: list[_R], new: list[_R], key: Callable[[_R], str | None]) -> list[_R]:
    """``stored`` plus the records of ``new`` whose key is not stored yet (first one wins).

    Returns ``stored`` itself when nothing is new.
    """
    seen = {key(record) for record in stored}
    added: list[_R] = []
    for record in new:
        record_key = key(record)
        if record_key not in seen:
            seen.add(record_key)
            added.append(record)
    return [*stored, *added] if added else stored


def upsert(stored: list[_R], new: list[_R], key: Callable[[_R], str]) -> list[_R]:
    """``stored`` with records of ``new`` replacing those with the same key in place and the
    others appended (the last of equal keys wins). Returns ``stored`` itself when no record
    differs from the stored one."""
    result = list(stored)
    position = {key(record): i for i, record in enumerate(result)}
    changed = False
    for record in new:
        i = position.get(key(record))
        if i is None:
            position[key(record)] = len(result)
            result.append(record)
            changed = True
        elif result[i] != record:
            result[i] = record
            changed = True
    return result if changed else stored


def apply_changes(doc: SessionDocument, changes: SessionChanges) -> SessionDocument | None:
    """``doc`` with ``changes`` applied, or None when they change nothing."""
    session = doc.session
    messages = append_new(session.messages, changes.messages, lambda m: m.message_id)
    tool_calls = append_new(
        session.tool_state.tool_calls, changes.tool_calls, lambda c: c.tool_call_id
    )
    usage = append_new(session.model_usage, changes.model_usage, lambda u: u.model_usage_id)
    evidences = append_new(list(doc.evidences.values()), changes.evidences, lambda e: e.evidence_id)
    blocks = upsert(doc.context_blocks, changes.context_blocks, lambda b: b.block_id)
    tasks = upsert(session.task_state.todo_list.tasks, changes.tasks, lambda t: t.task_id)
    summary = session.summary if changes.summary is None else changes.summary
    run = session.run if changes.run is None else changes.run
    meta = doc.meta if changes.meta is None else changes.meta
    unchanged = (
        messages is session.messages
        and tool_calls is session.tool_state.tool_calls
        and usage is session.model_usage
        and len(evidences) == len(doc.evidences)
        and blocks is doc.context_blocks
        and tasks is session.task_state.todo_list.tasks
        and summary == session.summary
        and run == session.run
        and meta == doc.meta
    )
    if unchanged:
        return None
    new_session = session.model_copy(
        update={
            "messages": messages,
            "tool_state": ToolState.model_construct(tool_calls=tool_calls),
            "model_usage": usage,
            "task_state": TaskState.model_construct(
                todo_list=TodoList.model_construct(tasks=tasks)
            ),
            "summary": summary,
            "run": run,
        }
    )
    return doc.model_copy(
        update={
            "session": new_session,
            "evidences": {e.evidence_id: e for e in evidences},
            "context_blocks": blocks,
            "meta": meta,
        }
    )


def remove_evidence(doc: SessionDocument, evidence_id: str) -> SessionDocument | None:
    """``doc`` without the evidence ``evidence_id``, or None when it has no such evidence."""
    if evidence_id not in doc.evidences:
        return None
    evidences = {k: v for k, v in doc.evidences.items() if k != evidence_id}
    return doc.model_copy(update={"evidences": evidences})


def append_turns(stored: list[TurnRecord], new: list[TurnRecord]) -> list[TurnRecord]:
    """``stored`` plus the turn records of ``new`` whose ``turn_id`` is not stored yet.

    Returns ``stored`` itself when nothing is new.
    """
    return append_new(stored, new, lambda t: t.turn_id)


def newest(records: list[_R], limit: int | None) -> list[_R]:
    """The last ``limit`` of ``records`` (all of them when ``limit`` is None), in order."""
    return list(records) if limit is None else records[max(len(records) - limit, 0) :]
