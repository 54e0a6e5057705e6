"""The buffer of what an AgentState wrote since its changes were last taken."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from pydantic import BaseModel

from ce.core.schema import Evidence, Message, ModelUsage, SessionDocument, ToolCall
from ce.core.stores.base import SessionChanges

__all__ = ["ChangeBuffer"]

_R = TypeVar("_R", bound=BaseModel)


class ChangeBuffer:
    """Appended records in write order, plus the ids of upserted blocks and tasks.

    Upserted records and replaced values are read from the document when the changes are
    taken, so a block written twice appears once, in its latest version.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.messages: list[Message] = []
        self.tool_calls: list[ToolCall] = []
        self.model_usage: list[ModelUsage] = []
        self.evidences: list[Evidence] = []
        self.block_ids: dict[str, None] = {}
        self.task_ids: dict[str, None] = {}
        self.run = False
        self.summary = False

    def is_empty(self) -> bool:
        """True when nothing was written since the changes were last taken."""
        return not (self.run or self.has_records())

    def has_records(self) -> bool:
        """True when records or the summary (anything but the run state) were written since
        the changes were last taken."""
        return bool(
            self.messages
            or self.tool_calls
            or self.model_usage
            or self.evidences
            or self.block_ids
            or self.task_ids
            or self.summary
        )

    def take(self, doc: SessionDocument, *, copies: bool = True) -> SessionChanges:
        """Everything buffered, as one change set (deep copies unless ``copies`` is False:
        then the records are the document's own); then the buffer is empty."""
        session = doc.session
        blocks = {b.block_id: b for b in doc.context_blocks} if self.block_ids else {}
        tasks = {t.task_id: t for t in session.task_state.todo_list.tasks} if self.task_ids else {}

        def each(records: Iterable[_R]) -> list[_R]:
            return [r.model_copy(deep=True) for r in records] if copies else list(records)

        def one(record: _R | None) -> _R | None:
            return record.model_copy(deep=True) if copies and record is not None else record

        changes = SessionChanges(
            messages=each(self.messages),
            tool_calls=each(self.tool_calls),
            model_usage=each(self.model_usage),
            evidences=each(self.evidences),
            context_blocks=each(blocks[i] for i in self.block_ids),
            tasks=each(tasks[i] for i in self.task_ids),
            summary=one(session.summary) if self.summary else None,
            run=one(session.run) if self.run else None,
        )
        self._reset()
        return changes
