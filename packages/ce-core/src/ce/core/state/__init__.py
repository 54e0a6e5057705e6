"""AgentState: the per-session aggregate, its streaming-delta accumulator, widgets and the
provider-neutral projection of the history (``render_live_context``)."""

from ce.core.state._agent_state import AgentState
from ce.core.state._checks import MAX_META_VALUE_BYTES, META_KEY_PATTERN, validate_meta
from ce.core.state._deltas import DeltaAccumulator, DeltaKind, MessageDelta
from ce.core.state._records import ModelOutput, TokenUsage, ToolResult
from ce.core.state._render import (
    SUMMARY_SECTION,
    RenderOptions,
    render_live_context,
    render_live_screen,
)
from ce.core.state._runs import RUN_TRANSITIONS, can_transition
from ce.core.state._tool_calls import parse_tool_arguments
from ce.core.state._usage import TaskUsage, usage_by_task
from ce.core.state._widgets import (
    LIVE_SCREEN_HEADING,
    NOTEBOOK_BLOCK_ID,
    RECENT_FINISHED_TASKS,
    MemoryNotebookWidget,
    StateView,
    TaskListWidget,
    Widget,
    default_widgets,
)

__all__ = [
    "LIVE_SCREEN_HEADING",
    "MAX_META_VALUE_BYTES",
    "META_KEY_PATTERN",
    "NOTEBOOK_BLOCK_ID",
    "RECENT_FINISHED_TASKS",
    "RUN_TRANSITIONS",
    "SUMMARY_SECTION",
    "AgentState",
    "DeltaAccumulator",
    "DeltaKind",
    "MemoryNotebookWidget",
    "MessageDelta",
    "ModelOutput",
    "RenderOptions",
    "StateView",
    "TaskListWidget",
    "TaskUsage",
    "TokenUsage",
    "ToolResult",
    "Widget",
    "can_transition",
    "default_widgets",
    "parse_tool_arguments",
    "render_live_context",
    "render_live_screen",
    "usage_by_task",
    "validate_meta",
]
