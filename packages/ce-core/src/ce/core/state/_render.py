"""render_live_context: the provider-neutral projection of a session's history."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ce.core.schema import (
    ContentPart,
    LevelOfDetail,
    Message,
    MessagePart,
    Role,
    SessionDocument,
    ToolCallStatus,
)
from ce.core.schema._document import without_media
from ce.core.state._agent_state import AgentState
from ce.core.state._checks import latest_system_instruction
from ce.core.state._widgets import StateView, Widget, build_live_screen, default_widgets

__all__ = [
    "SUMMARY_SECTION",
    "RenderOptions",
    "render_live_context",
    "render_live_screen",
]

SUMMARY_SECTION = "[Summary of earlier conversation]"
"""Title of the user note that stands for the messages a rolling summary covers."""


@dataclass(frozen=True)
class RenderOptions:
    """How :func:`render_live_context` projects the history.

    ``summary_window``: how many model inputs / tool-result turns after the newest one render
    at Summary level (older ones render at Gist). ``widgets``: the LiveScreen contributors, in
    order (empty: no LiveScreen).
    """

    summary_window: int = 4
    widgets: tuple[Widget, ...] = field(default_factory=default_widgets)

    def __post_init__(self) -> None:
        if self.summary_window < 0:
            raise ValueError("summary_window must be >= 0")


def _document(source: SessionDocument | AgentState) -> SessionDocument:
    # Read-only access to the state's own document: rendering never writes, so no copy.
    return source._doc if isinstance(source, AgentState) else source


def render_live_screen(
    source: SessionDocument | AgentState, widgets: Sequence[Widget] | None = None
) -> str | None:
    """The LiveScreen of a state: ``# [Live Screen]`` and each widget's fragment in order
    (default: notebook, then task list), or None when every widget is empty."""
    chosen = default_widgets() if widgets is None else widgets
    return build_live_screen(StateView(_document(source)), chosen)


def _level(ordinal: int, window: int) -> LevelOfDetail:
    if ordinal == 0:
        return LevelOfDetail.LIVE
    return LevelOfDetail.SUMMARY if ordinal <= window else LevelOfDetail.GIST


def _with_section(content: str, title: str, body: str) -> str:
    section = f"{title}\n{body}"
    return f"{content}\n\n{section}" if content else section


class _Pairing:
    """Which tool message answers which declared call, and the tool groups of a history.

    A call belongs to the first assistant message that declares its id; its result is the
    first tool message with that id after the declaration. Other tool messages are orphans
    and never render. A group is an assistant message with the tool messages answering it.
    """

    def __init__(self, messages: Sequence[Message]) -> None:
        self.owner: dict[str, int] = {}
        self.result: dict[str, int] = {}
        self.members: dict[int, list[int]] = {}
        for index, message in enumerate(messages):
            if message.role is Role.ASSISTANT:
                for call in message.tool_calls or ():
                    self.owner.setdefault(call.tool_call_id, index)
            elif message.role is Role.TOOL:
                call_id = message.tool_call_id or ""
                if call_id in self.owner and call_id not in self.result:
                    self.result[call_id] = index
                    self.members.setdefault(self.owner[call_id], [self.owner[call_id]])
                    self.members[self.owner[call_id]].append(index)

    def group_of(self, index: int, message: Message) -> list[int]:
        """The indices of the group ``message`` belongs to (just itself outside a group)."""
        if message.role is Role.TOOL:
            call_id = message.tool_call_id or ""
            if self.result.get(call_id) == index:
                return self.members[self.owner[call_id]]
        return self.members.get(index, [index])


def render_live_context(
    source: SessionDocument | AgentState, options: RenderOptions | None = None
) -> list[MessagePart]:
    """Project a session into the messages a model receives, provider-neutral.

    A pure function: the same document and options give identical output; nothing is cached
    or written, and the parts are copies. The output is

    1. the latest system instruction, once, first (earlier ones and other system messages do
       not render);
    2. the history, oldest first, where each assistant message is followed directly by the
       results of its calls, in call order. A call without a result is left out of its
       message (and an assistant message left with no text and no calls is dropped); a tool
       message that answers no call declared before it is dropped — so no call ever appears
       without its result nor a result without its call;
    3. Level of Detail by position: counting model inputs and tool-result turns (the results
       of one assistant message) from the newest backwards, the newest renders Live, the next
       ``summary_window`` render Summary, older ones Gist; assistant messages always render
       Live, and a message without ``lod`` sections renders its content at every level; a
       message's images, files and audio (``parts``) render at Live level only, below it its
       text says they were left out (``[image omitted]``);
    4. ``session.summary``, when present, replaces the messages in its ``message_index_range``
       with one user message ``"[Summary of earlier conversation]\\n<content>"`` placed where
       the range starts; an app's cut (``source="app"``) leaves out every message up to its
       end and renders nothing in their place; a tool group (assistant message + its
       results) is left out only when all of it is, else it renders whole;
    5. the LiveScreen (:func:`render_live_screen` over ``options.widgets``), when not empty,
       appended after a blank line to the last user or tool part (not rendered
       when there is none). Tool parts carry ``is_error`` when their recorded ``ToolCall``
       status is not ``success``.
    """
    opts = options or RenderOptions()
    doc = _document(source)
    messages = doc.session.messages
    pairing = _Pairing(messages)

    hidden: set[int] = set()
    summary = doc.session.summary
    first = last = -1
    if summary is not None:
        first = max(summary.message_index_range.from_index, 0)
        last = min(summary.message_index_range.to_index, len(messages) - 1)
        low = first
        if summary.source == "app":  # the app removed them: nothing renders in their place
            low, first = 0, last + 1
        for index in range(low, last + 1):
            group = pairing.group_of(index, messages[index])
            if all(low <= member <= last for member in group):
                hidden.add(index)

    levels: dict[int, LevelOfDetail] = {}
    ordinal = 0
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if index in hidden:
            continue
        if message.role is Role.USER:
            key = index
        elif message.role is Role.TOOL and pairing.result.get(message.tool_call_id or "") == index:
            key = pairing.owner[message.tool_call_id or ""]
        else:
            continue
        if key not in levels:
            levels[key] = _level(ordinal, opts.summary_window)
            ordinal += 1

    statuses: dict[str, ToolCallStatus] = {}
    for record in doc.session.tool_state.tool_calls:
        statuses.setdefault(record.tool_call_id, record.status)

    parts: list[MessagePart] = []
    instruction = latest_system_instruction(messages)
    if instruction is not None:
        parts.append(MessagePart(role=Role.SYSTEM, content=instruction.content))
    for index, message in enumerate(messages):
        if summary is not None and index == first and first <= last:
            parts.append(
                MessagePart(
                    role=Role.USER, content=_with_section("", SUMMARY_SECTION, summary.content)
                )
            )
        if index in hidden:
            continue
        if message.role is Role.USER:
            text, media = _at_level(message, levels[index])
            parts.append(MessagePart(role=Role.USER, content=text, parts=media))
        elif message.role is Role.ASSISTANT:
            parts.extend(_assistant_turn(index, message, messages, pairing, levels, statuses))

    screen = build_live_screen(StateView(doc), opts.widgets)
    if screen is not None:
        for position in range(len(parts) - 1, -1, -1):
            part = parts[position]
            if part.role in (Role.USER, Role.TOOL):
                content = f"{part.content}\n\n{screen}" if part.content else screen
                parts[position] = part.model_copy(update={"content": content})
                break
    return parts


def _at_level(message: Message, level: LevelOfDetail) -> tuple[str, list[ContentPart] | None]:
    """The text and parts of ``message`` at ``level``: its images, files and audio at Live
    level (copies of the parts, sharing their data), else a note in the text that they were
    left out."""
    text, media = message.text_at(level), message.parts
    if media and level is not LevelOfDetail.LIVE:
        return without_media(text, media), None
    return text, [part.model_copy() for part in media] if media else None


def _assistant_turn(
    index: int,
    message: Message,
    messages: Sequence[Message],
    pairing: _Pairing,
    levels: dict[int, LevelOfDetail],
    statuses: dict[str, ToolCallStatus],
) -> list[MessagePart]:
    calls = [
        call
        for call in message.tool_calls or ()
        if call.tool_call_id in pairing.result and pairing.owner[call.tool_call_id] == index
    ]
    if not calls and not message.content.strip():
        return []
    turn = [
        MessagePart(
            role=Role.ASSISTANT,
            content=message.content,
            tool_calls=[call.model_copy(deep=True) for call in calls] or None,
        )
    ]
    level = levels.get(index, LevelOfDetail.LIVE)
    for call in calls:
        result = messages[pairing.result[call.tool_call_id]]
        text, media = _at_level(result, level)
        turn.append(
            MessagePart(
                role=Role.TOOL,
                content=text,
                tool_call_id=call.tool_call_id,
                name=result.name or call.name,
                is_error=statuses.get(call.tool_call_id, ToolCallStatus.SUCCESS)
                is not ToolCallStatus.SUCCESS,
                parts=media,
            )
        )
    return turn
