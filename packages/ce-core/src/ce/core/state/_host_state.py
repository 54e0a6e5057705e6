"""AgentState writers for what the host sets beside the history: the notebook and context
blocks, tasks, the rolling summary."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ce.core.errors import InvariantViolationError
from ce.core.primitives import Clock
from ce.core.schema import (
    BlockType,
    ClearedHistory,
    ContextBlock,
    MessageIndexRange,
    Priority,
    SessionDocument,
    Summary,
    Task,
    TaskStatus,
    WithdrawnTurns,
)
from ce.core.state._changes import ChangeBuffer
from ce.core.state._widgets import NOTEBOOK_BLOCK_ID

__all__ = ["HostStateWriters"]


class HostStateWriters:
    """Replace-by-id writers; the same content again writes nothing."""

    _doc: SessionDocument
    _changes: ChangeBuffer
    _clock: Clock

    # ----------------------------------------------------------------- widget state

    def update_notebook(self, content: str) -> ContextBlock:
        """Replace the memory notebook content (the ``widget:notebook`` memory block, priority
        high) and return a copy of the block. The same content again writes nothing."""
        block = self._notebook_block()
        if block is not None and block.content == content:
            return block.model_copy(deep=True)
        new = ContextBlock(
            block_id=NOTEBOOK_BLOCK_ID,
            block_type=BlockType.MEMORY,
            priority=Priority.HIGH,
            content=content,
        )
        blocks = self._doc.context_blocks
        if block is None:
            blocks.append(new)
        else:
            blocks[blocks.index(block)] = new
        self._changes.block_ids[NOTEBOOK_BLOCK_ID] = None
        return new.model_copy(deep=True)

    def put_context_block(self, block: ContextBlock) -> ContextBlock:
        """Insert or replace a host-provided context block (an instruction snippet, a plan, a
        block citing evidence through ``refs``) by ``block_id``; the notebook's id is
        reserved for :meth:`update_notebook`."""
        if block.block_id == NOTEBOOK_BLOCK_ID:
            raise InvariantViolationError(f"{NOTEBOOK_BLOCK_ID!r} is written by update_notebook")
        blocks = self._doc.context_blocks
        copied = block.model_copy(deep=True)
        for i, existing in enumerate(blocks):
            if existing.block_id == block.block_id:
                if existing == copied:
                    return copied.model_copy(deep=True)
                blocks[i] = copied
                break
        else:
            blocks.append(copied)
        self._changes.block_ids[copied.block_id] = None
        return copied.model_copy(deep=True)

    def _notebook_block(self) -> ContextBlock | None:
        for block in self._doc.context_blocks:
            if block.block_id == NOTEBOOK_BLOCK_ID:
                return block
        return None

    def upsert_tasks(self, tasks: Sequence[Task]) -> list[Task]:
        """Insert or replace tasks by ``task_id`` (new ones are appended, replaced ones keep
        their position) and return copies of them. Ids must be non-empty and unique."""
        seen: set[str] = set()
        for task in tasks:
            if not task.task_id:
                raise InvariantViolationError("a task needs a non-empty task_id")
            if task.task_id in seen:
                raise InvariantViolationError(f"task {task.task_id!r} appears twice")
            seen.add(task.task_id)
        todo = self._doc.session.task_state.todo_list.tasks
        position = {t.task_id: i for i, t in enumerate(todo)}
        for task in tasks:
            copied = task.model_copy(deep=True)
            if task.task_id in position:
                todo[position[task.task_id]] = copied
            else:
                position[task.task_id] = len(todo)
                todo.append(copied)
            self._changes.task_ids[task.task_id] = None
        return [t.model_copy(deep=True) for t in tasks]

    def set_task_status(
        self,
        task_id: str,
        status: TaskStatus,
        *,
        error: str | None = None,
        result_evidence_ids: Sequence[str] | None = None,
    ) -> Task:
        """Set the status of a known task (and its error / result evidence ids when given);
        an unknown id raises :class:`~ce.core.errors.InvariantViolationError`."""
        for task in self._doc.session.task_state.todo_list.tasks:
            if task.task_id == task_id:
                break
        else:
            raise InvariantViolationError(f"no task {task_id!r}")
        update: dict[str, Any] = {"status": TaskStatus(status)}
        if error is not None:
            update["error"] = error
        if result_evidence_ids is not None:
            update["result_evidence_ids"] = list(result_evidence_ids)
        return self.upsert_tasks([task.model_copy(update=update)])[0]

    # ----------------------------------------------------------------- summary

    def set_summary(
        self,
        content: str,
        *,
        from_index: int,
        to_index: int,
        evidence_ids: Sequence[str] | None = None,
    ) -> Summary:
        """Replace the rolling summary, which stands for ``messages[from_index:to_index+1]``
        when rendering (the messages themselves stay; those before ``from_index`` are the
        ones the app removed from its history, see :meth:`cut_history`). The range must lie
        within the history and the content must not be blank."""
        if not content.strip():
            raise InvariantViolationError("a summary must not be blank")
        count = len(self._doc.session.messages)
        if not 0 <= from_index <= to_index < count:
            raise InvariantViolationError(
                f"summary range {from_index}..{to_index} is not within the {count} messages"
            )
        current = self._doc.session.summary
        summary = Summary(
            content=content,
            updated_at=self._clock.now_iso(),
            message_index_range=MessageIndexRange(from_index=from_index, to_index=to_index),
            evidence_ids=list(evidence_ids or []),
            cleared=current.cleared if current is not None else None,
            withdrawn=list(current.withdrawn) if current is not None else [],
        )
        self._doc.session.summary = summary
        self._changes.summary = True
        return summary.model_copy(deep=True)

    def cut_history(
        self, to_index: int, *, held_from: int = 0, cleared: ClearedHistory | None = None
    ) -> Summary | None:
        """Record that the app removed ``messages[:to_index+1]`` from its own history: they
        are no longer sent (they stay stored), and nothing renders in their place (a
        :class:`Summary` with ``source="app"``). A cut never moves backwards: one that does
        not reach past the messages removed before changes nothing (``None``). A rolling
        summary of the engine that reaches further keeps standing for its messages after
        the cut; one that does not is replaced (the app carries what it keeps of them).
        ``cleared``: the cut is the app's clear of its whole history (see
        :class:`ClearedHistory`); a cut without it keeps the session's latest clear.

        ``held_from``: how many of the session's messages come before those the state holds
        (a state of the session's newest messages only); ``to_index`` counts from the
        session's first message and must lie within those held."""
        count = len(self._doc.session.messages)
        if not held_from <= to_index < held_from + count:
            raise InvariantViolationError(
                f"cut at message {to_index} is not within messages {held_from}.."
                f"{held_from + count - 1}"
            )
        current = self._doc.session.summary
        if current is not None and to_index < current.removed_by_app:
            return None
        if cleared is None and current is not None:
            cleared = current.cleared
        now = self._clock.now_iso()
        if (
            current is not None
            and current.source == "engine"
            and to_index < current.message_index_range.to_index
        ):
            covered = current.message_index_range.to_index
            summary = current.model_copy(
                update={
                    "updated_at": now,
                    "message_index_range": MessageIndexRange(
                        from_index=to_index + 1, to_index=covered
                    ),
                    "cleared": cleared,
                }
            )
        else:
            summary = Summary(
                content="",
                updated_at=now,
                message_index_range=MessageIndexRange(from_index=0, to_index=to_index),
                source="app",
                cleared=cleared,
                withdrawn=list(current.withdrawn) if current is not None else [],
            )
        self._doc.session.summary = summary
        self._changes.summary = True
        return summary.model_copy(deep=True)

    def withdraw_turns(
        self,
        from_index: int,
        *,
        held_from: int = 0,
        kept_evidences: Callable[[int], list[str]] | None = None,
    ) -> Summary:
        """Record that the app took back the session's messages from ``from_index`` on (it
        went back to an earlier point of its conversation): they are no longer sent (they
        stay stored) and what the app passes is no longer matched against them
        (:class:`WithdrawnTurns`; one span with the earlier ones it overlaps or touches).
        ``held_from`` as for :meth:`cut_history`; ``from_index`` must lie within the messages
        held. ``kept_evidences``: given the first message of the span (earlier spans joined),
        the ids of the evidences that came with its turns and stay sent."""
        count = len(self._doc.session.messages)
        end = held_from + count
        if not held_from <= from_index < end:
            raise InvariantViolationError(
                f"turns from message {from_index} are not within messages {held_from}..{end - 1}"
            )
        current = self._doc.session.summary
        # spans stay sorted and apart: the new one (up to the newest message) takes in every
        # earlier one it reaches or touches (an answer asked for again and again is one span)
        earlier = list(current.withdrawn) if current is not None else []
        while earlier and earlier[-1].to_index >= from_index:
            from_index = min(from_index, earlier.pop().from_index)
        kept = kept_evidences(from_index) if kept_evidences is not None else []
        span = WithdrawnTurns(from_index=from_index, to_index=end, kept_evidences=kept)
        if current is None:
            summary = Summary(
                content="",
                updated_at=self._clock.now_iso(),
                message_index_range=MessageIndexRange(from_index=0, to_index=-1),
                source="app",
                withdrawn=[span],
            )
        else:
            summary = current.model_copy(update={"withdrawn": [*earlier, span]})
        self._doc.session.summary = summary
        self._changes.summary = True
        return summary.model_copy(deep=True)
