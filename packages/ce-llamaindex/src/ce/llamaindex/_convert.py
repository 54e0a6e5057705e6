"""LlamaIndex chat messages <-> the engine's neutral messages (through OpenAI-style dicts).

Tool calls are read from both places LlamaIndex keeps them: ``ToolCallBlock`` content blocks
(llama-index-core >= 0.14.1) and ``additional_kwargs["tool_calls"]`` (OpenAI-style dicts or
the OpenAI SDK's objects, the older form). A tool result names its call in
``additional_kwargs["tool_call_id"]``, as FunctionAgent writes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock

from ce.core.integration import message_from_openai
from ce.core.schema import Message, ModelInvocation

__all__ = [
    "from_openai",
    "message_text",
    "reply_to_message",
    "to_openai",
    "tool_schemas",
]

try:  # llama-index-core >= 0.14.1
    from llama_index.core.base.llms.types import ToolCallBlock
except ImportError:  # pragma: no cover - exercised by the lowest supported version
    ToolCallBlock = None  # type: ignore[assignment,misc]

_ROLES = {
    MessageRole.SYSTEM.value: "system",
    "developer": "developer",
    MessageRole.USER.value: "user",
    MessageRole.ASSISTANT.value: "assistant",
    MessageRole.TOOL.value: "tool",
    MessageRole.FUNCTION.value: "tool",
    MessageRole.CHATBOT.value: "assistant",
    MessageRole.MODEL.value: "assistant",
}


def message_text(message: ChatMessage) -> str:
    """The text of ``message``: its text blocks, joined."""
    return "".join(b.text for b in message.blocks if isinstance(b, TextBlock))


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value or {})


def _call_dict(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    return {
        "id": str(call_id or ""),
        "type": "function",
        "function": {"name": str(name or ""), "arguments": _arguments(arguments)},
    }


def _tool_calls(message: ChatMessage) -> list[dict[str, Any]]:
    """The OpenAI-style tool calls ``message`` makes (blocks first, else additional_kwargs)."""
    calls: list[dict[str, Any]] = []
    if ToolCallBlock is not None:
        calls = [
            _call_dict(b.tool_call_id, b.tool_name, b.tool_kwargs)
            for b in message.blocks
            if isinstance(b, ToolCallBlock)
        ]
    if calls:
        return calls
    for raw in message.additional_kwargs.get("tool_calls") or []:
        data = raw.model_dump() if hasattr(raw, "model_dump") else raw
        if isinstance(data, Mapping):
            function = data.get("function") or {}
            calls.append(
                _call_dict(data.get("id"), function.get("name"), function.get("arguments"))
            )
    return calls


def to_openai(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """LlamaIndex messages as OpenAI chat message dicts (text content; tool calls and tool
    call ids kept). Non-text blocks (images, audio) are not part of the neutral form."""
    converted: list[dict[str, Any]] = []
    for message in messages:
        role = _ROLES.get(str(getattr(message.role, "value", message.role)), "user")
        entry: dict[str, Any] = {"role": role, "content": message_text(message)}
        if role == "assistant":
            calls = _tool_calls(message)
            if calls:
                entry["tool_calls"] = calls
        elif role == "tool":
            call_id = message.additional_kwargs.get("tool_call_id")
            entry["tool_call_id"] = str(call_id or "")
        converted.append(entry)
    return converted


def _with_text(original: ChatMessage, text: str) -> ChatMessage:
    blocks: list[Any] = [b for b in original.blocks if not isinstance(b, TextBlock)]
    if text:
        blocks.insert(0, TextBlock(text=text))
    return original.model_copy(update={"blocks": blocks})


def _build(sent: Mapping[str, Any]) -> ChatMessage:
    role = sent["role"]
    text = sent.get("content") or ""
    if not isinstance(text, str):
        text = "".join(p.get("text", "") for p in text if isinstance(p, Mapping))
    if role == "tool":
        return ChatMessage(
            role=MessageRole.TOOL,
            content=text,
            additional_kwargs={"tool_call_id": sent.get("tool_call_id", "")},
        )
    calls = sent.get("tool_calls") or []
    if role == "assistant" and calls:
        if ToolCallBlock is None:
            return ChatMessage(
                role=MessageRole.ASSISTANT, content=text, additional_kwargs={"tool_calls": calls}
            )
        blocks: list[Any] = [TextBlock(text=text)] if text else []
        for call in calls:
            arguments = call["function"]["arguments"]
            try:
                kwargs: Any = json.loads(arguments)
            except ValueError:
                kwargs = arguments
            blocks.append(
                ToolCallBlock(
                    tool_call_id=call["id"], tool_name=call["function"]["name"], tool_kwargs=kwargs
                )
            )
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)
    return ChatMessage(role=MessageRole(role if role != "developer" else "system"), content=text)


def _key(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two OpenAI message dicts the same message: role, content, tool ids, name
    and calls (no JSON encoding of the whole dict: this runs for every message of every call,
    so plain strings take the short way)."""
    content = message.get("content") or ""  # None and "" alike: no text
    if not isinstance(content, str):
        content = _plain(content)
    calls = message.get("tool_calls")
    return (
        message.get("role"),
        content,
        _plain(message.get("tool_call_id")),
        _plain(message.get("name")),
        tuple(_call_key(call) for call in calls) if calls else (),
    )


def _call_key(call: Mapping[str, Any]) -> tuple[str | None, ...]:
    function = _function(call)
    return (
        _plain(call.get("id")),
        _plain(function.get("name")),
        _plain(function.get("arguments")),
    )


def _plain(value: Any) -> str | None:
    """A string or None as it is; anything else (content parts, parsed arguments) as JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _function(call: Mapping[str, Any]) -> Mapping[str, Any]:
    function = call.get("function")
    return function if isinstance(function, Mapping) else {}


def _slot(message: Mapping[str, Any]) -> tuple[str, ...] | None:
    """What identifies ``message`` apart from its text: a tool result's call id, the call ids
    of an assistant message making calls (``None`` for other messages)."""
    if message.get("role") == "tool" and message.get("tool_call_id"):
        return ("tool", str(message["tool_call_id"]))
    calls = message.get("tool_calls")
    if message.get("role") == "assistant" and calls:
        return ("assistant", *(str(c.get("id")) for c in calls))
    return None


def from_openai(
    sent: Sequence[Mapping[str, Any]],
    originals: Sequence[ChatMessage],
    original_dicts: Sequence[Mapping[str, Any]],
    redact: Callable[[str], str] | None = None,
) -> list[ChatMessage]:
    """The LlamaIndex messages for what the engine assembled. A message the engine left as
    it was is the app's very object (its images, provider fields and tool-call form kept);
    one whose text the engine changed (a redacted call, a fenced tool result, a message whose
    text is the app's passed through ``redact``, the newest user message) is a copy of the
    app's message with the new text, its other blocks (images, audio) kept; the rest (the
    engine's system message, history from earlier runs) are new messages."""
    same: dict[tuple[Any, ...], list[int]] = {}
    slots: dict[tuple[str, ...], list[int]] = {}
    for index, original in enumerate(original_dicts):
        same.setdefault(_key(original), []).append(index)
        original_slot = _slot(original)
        if original_slot is not None:
            slots.setdefault(original_slot, []).append(index)
    used: set[int] = set()
    # the newest user message is always in the engine's input (it may be redacted): the last
    # user message sent stands for the app's last one
    newest = _last_user(original_dicts)
    newest_sent = _last_user(sent)
    redacted: dict[tuple[Any, ...], list[int]] | None = None

    def redacted_keys() -> dict[tuple[Any, ...], list[int]]:
        """The keys, text redacted as the engine stores it, of the app's messages that carry
        more than text (images, audio: what a rebuilt message would lose); built once, when
        a message matched nothing else (redaction is not free: text-only messages skip it)."""
        nonlocal redacted
        if redacted is None:
            redacted = {}
            for index, original in enumerate(original_dicts):
                content = original.get("content")
                if (
                    redact is not None
                    and index not in used
                    and isinstance(content, str)
                    and _has_media(originals[index])
                ):
                    key = _key({**original, "content": redact(content)})
                    redacted.setdefault(key, []).append(index)
        return redacted

    def take(candidates: list[int] | None) -> int | None:
        for index in candidates or ():
            if index not in used:
                used.add(index)
                return index
        return None

    result: list[ChatMessage] = []
    for position, message in enumerate(sent):
        kept = take(same.get(_key(message)))
        if kept is not None:
            result.append(originals[kept])
            continue
        slot = _slot(message)
        changed = take(slots.get(slot)) if slot is not None else None
        if changed is None and redact is not None and message.get("role") != "system":
            changed = take(redacted_keys().get(_key(message)))
        if changed is None and position == newest_sent and newest is not None:
            changed = take([newest])
        if changed is not None:
            result.append(_with_text(originals[changed], _content(message)))
            continue
        result.append(_build(message))
    return result


def _has_media(message: ChatMessage) -> bool:
    """Whether ``message`` has blocks other than text and tool calls."""
    plain = (TextBlock,) if ToolCallBlock is None else (TextBlock, ToolCallBlock)
    return any(not isinstance(block, plain) for block in message.blocks)


def _last_user(messages: Sequence[Mapping[str, Any]]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    return None


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def tool_schemas(tools: Any) -> list[dict[str, Any]] | None:
    """The tools a chat call sends (OpenAI tool dicts, or LlamaIndex tools) as OpenAI tool
    schemas, which the engine counts against the budget; ``None`` without tools."""
    if not isinstance(tools, (list, tuple)) or not tools:
        return None
    schemas: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, Mapping):
            schemas.append(dict(tool))
            continue
        metadata = getattr(tool, "metadata", None)
        to_openai_tool = getattr(metadata, "to_openai_tool", None)
        if callable(to_openai_tool):
            schemas.append(dict(to_openai_tool(skip_length_check=True)))
    return schemas or None


def reply_to_message(message: ChatMessage, provider: str, model: str) -> Message:
    """The model's reply as the neutral assistant :class:`Message` the engine commits."""
    (converted,) = to_openai([message])
    return message_from_openai(converted).model_copy(
        update={"invocation": ModelInvocation(provider=provider or "unknown", model=model)}
    )
