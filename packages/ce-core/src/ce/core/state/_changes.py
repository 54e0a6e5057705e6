"""The buffer of what an AgentState wrote since its changes were last taken."""

from __future__ import annotations

from ce.core.schema import Evidence, Message, ModelUsage, SessionDocument, ToolCall
from ce.core.stores.base import SessionChanges

__all__ = ["ChangeBuffer"]


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

    def take(self, doc: SessionDocument) -> SessionChanges:
        """Deep copies of everything buffered, as one change set; then the buffer is empty."""
        session = doc.session
        blocks = {b.block_id: b for b in doc.context_blocks}
        tasks = {t.task_id: t for t in session.task_state.todo_list.tasks}
        changes = SessionChanges(
            messages=[m.model_copy(deep=True) for m in self.messages],
            tool_calls=[t.model_copy(deep=True) for t in self.tool_calls],
            model_usage=[u.model_copy(deep=True) for u in self.model_usage],
            evidences=[e.model_copy(deep=True) for e in self.evidences],
            context_blocks=[blocks[i].model_copy(deep=True) for i in self.block_ids],
            tasks=[tasks[i].model_copy(deep=True) for i in self.task_ids],
            summary=session.summary.model_copy(deep=True)
            if self.summary and session.summary
            else None,
            run=session.run.model_copy(deep=True) if self.run else None,
        )
        self._reset()
        return changes
