"""Widgets: components that render a fragment of the LiveScreen from the state."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from ce.core.schema import ContextBlock, Message, SessionDocument, Task, TaskStatus
from ce.core.state._checks import latest_system_instruction

__all__ = [
    "LIVE_SCREEN_HEADING",
    "NOTEBOOK_BLOCK_ID",
    "RECENT_FINISHED_TASKS",
    "MemoryNotebookWidget",
    "StateView",
    "TaskListWidget",
    "Widget",
    "build_live_screen",
    "default_widgets",
]

NOTEBOOK_BLOCK_ID = "widget:notebook"
"""The id of the memory context block that holds the notebook content."""

LIVE_SCREEN_HEADING = "# [Live Screen]"


class StateView:
    """A read-only view of a session document, handed to widgets.

    Every accessor returns copies, so a widget cannot change the state through it.
    """

    __slots__ = ("_doc",)

    def __init__(self, doc: SessionDocument) -> None:
        self._doc = doc

    @property
    def session_id(self) -> str:
        return self._doc.session.session_id

    @property
    def system_instruction(self) -> str | None:
        message = latest_system_instruction(self._doc.session.messages)
        return message.content if message else None

    @property
    def notebook(self) -> str:
        """The memory notebook content ('' when never written)."""
        block = self._block(NOTEBOOK_BLOCK_ID)
        return block.content if block else ""

    @property
    def tasks(self) -> tuple[Task, ...]:
        return tuple(t.model_copy(deep=True) for t in self._doc.session.task_state.todo_list.tasks)

    @property
    def task_statuses(self) -> tuple[TaskStatus, ...]:
        """The status of every task, in the order of :attr:`tasks`, without copying the tasks
        (cheap on a long list: pick what to show, then ask :meth:`tasks_at`)."""
        return tuple(t.status for t in self._doc.session.task_state.todo_list.tasks)

    def tasks_at(self, positions: Iterable[int]) -> tuple[Task, ...]:
        """Copies of the tasks at ``positions`` (indexes into :attr:`tasks`)."""
        tasks = self._doc.session.task_state.todo_list.tasks
        return tuple(tasks[i].model_copy(deep=True) for i in positions)

    @property
    def messages(self) -> tuple[Message, ...]:
        return tuple(m.model_copy(deep=True) for m in self._doc.session.messages)

    def context_block(self, block_id: str) -> ContextBlock | None:
        block = self._block(block_id)
        return block.model_copy(deep=True) if block else None

    def _block(self, block_id: str) -> ContextBlock | None:
        for block in self._doc.context_blocks:
            if block.block_id == block_id:
                return block
        return None


@runtime_checkable
class Widget(Protocol):
    """A LiveScreen contributor.

    ``render_live_screen`` is a pure function of the view: it returns a Markdown fragment, or
    None (or blank) when the widget has nothing to show. ``name`` is stable.
    """

    @property
    def name(self) -> str: ...

    def render_live_screen(self, view: StateView) -> str | None: ...


class MemoryNotebookWidget:
    """The memory notebook: free text the agent keeps in view.

    Its content lives in the memory context block :data:`NOTEBOOK_BLOCK_ID` (written by
    :meth:`AgentState.update_notebook`), so it survives a store round trip.
    """

    name = "memory_notebook"

    def render_live_screen(self, view: StateView) -> str | None:
        content = view.notebook.strip()
        return f"## Memory Notebook\n\n{content}" if content else None


_FINISHED = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)

RECENT_FINISHED_TASKS = 5
"""How many finished tasks the task list shows by default (the newest ones)."""


class TaskListWidget:
    """The session's task list (``session.task_state.todo_list``) as a Markdown checklist.

    Completed tasks are checked; other statuses than pending are named after the task,
    with the error of a failed task. Every open task (pending, in progress) is listed, and
    of the finished ones (completed, failed, cancelled) the newest ``recent_finished``: a
    session that runs task after task (a crew kicked off again and again) would otherwise
    send the model a list that grows with every run. The earlier finished tasks are counted
    in one line instead, first.
    """

    name = "task_list"

    def __init__(self, recent_finished: int = RECENT_FINISHED_TASKS) -> None:
        if recent_finished < 0:
            raise ValueError("recent_finished must be >= 0")
        self.recent_finished = recent_finished

    def render_live_screen(self, view: StateView) -> str | None:
        statuses = view.task_statuses
        if not statuses:
            return None
        finished = [i for i, status in enumerate(statuses) if status in _FINISHED]
        hidden = finished[: max(len(finished) - self.recent_finished, 0)]
        lines = []
        if hidden:
            counts = Counter(statuses[i] for i in hidden)
            kinds = ", ".join(
                f"{counts[status]} {status.value}" for status in _FINISHED if counts[status]
            )
            lines.append(f"- ({len(hidden)} earlier finished tasks not listed: {kinds})")
        skipped = set(hidden)
        shown = view.tasks_at(i for i in range(len(statuses)) if i not in skipped)
        lines.extend(_task_line(task) for task in shown)
        return "## Tasks\n\n" + "\n".join(lines)


def _task_line(task: Task) -> str:
    box = "[x]" if task.status is TaskStatus.COMPLETED else "[ ]"
    line = f"- {box} {task.name} (`{task.task_id}`)"
    if task.status in (TaskStatus.PENDING, TaskStatus.COMPLETED):
        return line
    status = task.status.value.replace("_", " ")
    if task.status is TaskStatus.FAILED and task.error:
        return f"{line} — {status}: {task.error}"
    return f"{line} — {status}"


def default_widgets() -> tuple[Widget, ...]:
    """The widgets of every AgentState, in LiveScreen order: notebook, then task list."""
    return (MemoryNotebookWidget(), TaskListWidget())


def build_live_screen(view: StateView, widgets: Sequence[Widget]) -> str | None:
    """``# [Live Screen]`` followed by each widget's fragment in order; None if all are empty."""
    fragments = []
    for widget in widgets:
        fragment = widget.render_live_screen(view)
        if fragment and fragment.strip():
            fragments.append(fragment.strip())
    if not fragments:
        return None
    return LIVE_SCREEN_HEADING + "\n\n" + "\n\n".join(fragments)
