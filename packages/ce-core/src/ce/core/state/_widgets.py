"""Widgets: components that render a fragment of the LiveScreen from the state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ce.core.schema import ContextBlock, Message, SessionDocument, Task, TaskStatus
from ce.core.state._checks import latest_system_instruction

__all__ = [
    "LIVE_SCREEN_HEADING",
    "NOTEBOOK_BLOCK_ID",
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


class TaskListWidget:
    """The session's task list (``session.task_state.todo_list``) as a Markdown checklist.

    Completed tasks are checked; other statuses than pending are named after the task,
    with the error of a failed task.
    """

    name = "task_list"

    def render_live_screen(self, view: StateView) -> str | None:
        tasks = view.tasks
        if not tasks:
            return None
        return "## Tasks\n\n" + "\n".join(_task_line(task) for task in tasks)


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
