"""Conversion of provider-neutral message parts to and from provider wire formats.

``to_openai_messages`` / ``from_openai_messages`` speak the OpenAI chat-completions message
format; ``to_anthropic_messages`` builds the ``system`` + ``messages`` of an Anthropic Messages
request. Both expect parts shaped as :func:`ce.core.state.render_live_context` produces them:
every assistant part with tool calls directly followed by one tool part per call.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ce.core.schema import MessagePart, Role, ToolCallRequest
from ce.core.state import parse_tool_arguments

__all__ = [
    "ANTHROPIC_PLACEHOLDER_TEXT",
    "AnthropicRequest",
    "GeminiRequest",
    "from_openai_messages",
    "to_anthropic_messages",
    "to_gemini_request",
    "to_openai_messages",
]

ANTHROPIC_PLACEHOLDER_TEXT = "(continuing the conversation)"
"""The user text inserted when an Anthropic conversation would otherwise start with the
assistant."""

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


def _openai_arguments(call: ToolCallRequest) -> str:
    if call.raw_arguments.strip():
        return call.raw_arguments
    if call.arguments:
        return json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":"))
    return "{}"


def to_openai_messages(parts: Sequence[MessagePart]) -> list[dict[str, Any]]:
    """The OpenAI chat messages for ``parts``, one message per part, in order.

    Assistant tool calls become ``{"id", "type": "function", "function": {"name",
    "arguments"}}`` with ``arguments`` the raw argument text (``"{}"`` when it is empty); an
    assistant message with calls and no text has ``content: None``. Tool parts become
    ``{"role": "tool", "tool_call_id", "content"}`` (OpenAI has no error flag: the content
    says it). ``name`` is kept on user and assistant messages. A tool part without a
    ``tool_call_id`` raises :class:`ValueError`.
    """
    out: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        message: dict[str, Any]
        if part.role is Role.TOOL:
            if not part.tool_call_id:
                raise ValueError(f"parts[{index}]: a tool part needs a tool_call_id")
            message = {"role": "tool", "tool_call_id": part.tool_call_id, "content": part.content}
        elif part.role is Role.ASSISTANT and part.tool_calls:
            message = {
                "role": "assistant",
                "content": part.content or None,
                "tool_calls": [
                    {
                        "id": call.tool_call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": _openai_arguments(call)},
                    }
                    for call in part.tool_calls
                ],
            }
        else:
            message = {"role": part.role.value, "content": part.content}
        if part.name and part.role in (Role.USER, Role.ASSISTANT):
            message["name"] = part.name
        out.append(message)
    return out


def _openai_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for item in content:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, Mapping) and item.get("type") in _TEXT_PART_TYPES:
                texts.append(str(item.get("text", "")))
        return "\n".join(texts)
    raise ValueError(f"{where}: content must be a string, a list of parts or null")


def _openai_call(raw_call: Any, where: str) -> ToolCallRequest:
    if not isinstance(raw_call, Mapping) or raw_call.get("type", "function") != "function":
        raise ValueError(f"{where}: only function tool calls are supported")
    function = raw_call.get("function")
    call_id = raw_call.get("id")
    if not isinstance(function, Mapping) or not isinstance(call_id, str) or not call_id:
        raise ValueError(f"{where}: a tool call needs an id and a function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: a tool call function needs a name")
    raw = function.get("arguments")
    if raw is None:
        raw = ""
    elif not isinstance(raw, str):
        raw = json.dumps(raw, ensure_ascii=False, separators=(",", ":"))
    arguments, parse_error = parse_tool_arguments(raw)
    return ToolCallRequest(
        tool_call_id=call_id,
        name=name,
        raw_arguments=raw,
        arguments=arguments,
        parse_error=parse_error,
    )


def from_openai_messages(messages: Iterable[Mapping[str, Any]]) -> list[MessagePart]:
    """Message parts from OpenAI chat messages (the inverse of :func:`to_openai_messages`).

    ``system`` and ``developer`` messages become system parts. Content may be a string, null
    or a list of parts, whose text parts are joined with newlines (other parts are ignored).
    Tool-call arguments are parsed (``parse_error`` when they are not a JSON object); a tool
    message takes its ``name`` from the call it answers. An unknown role or a malformed tool
    call raises :class:`ValueError`.
    """
    names: dict[str, str] = {}
    parts: list[MessagePart] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role")
        content = _openai_text(message.get("content"), where)
        name = message.get("name") if isinstance(message.get("name"), str) else None
        if role in ("system", "developer"):
            parts.append(MessagePart(role=Role.SYSTEM, content=content))
        elif role == "user":
            parts.append(MessagePart(role=Role.USER, content=content, name=name))
        elif role == "assistant":
            calls = [
                _openai_call(call, f"{where}.tool_calls[{i}]")
                for i, call in enumerate(message.get("tool_calls") or ())
            ]
            names.update((call.tool_call_id, call.name) for call in calls)
            parts.append(
                MessagePart(
                    role=Role.ASSISTANT, content=content, tool_calls=calls or None, name=name
                )
            )
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ValueError(f"{where}: a tool message needs a tool_call_id")
            parts.append(
                MessagePart(
                    role=Role.TOOL,
                    content=content,
                    tool_call_id=call_id,
                    name=name or names.get(call_id),
                )
            )
        else:
            raise ValueError(f"{where}: unsupported role {role!r}")
    return parts


@dataclass(frozen=True)
class AnthropicRequest:
    """The ``system`` prompt and ``messages`` of an Anthropic Messages API request."""

    system: str
    messages: list[dict[str, Any]]


def _anthropic_input(call: ToolCallRequest) -> dict[str, Any]:
    if call.arguments is not None:
        return copy.deepcopy(call.arguments)
    parsed, _ = parse_tool_arguments(call.raw_arguments)
    return parsed if parsed is not None else {}


def _anthropic_blocks(part: MessagePart) -> list[dict[str, Any]]:
    if part.role is Role.TOOL:
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": part.tool_call_id}
        if part.content:
            block["content"] = part.content
        if part.is_error:
            block["is_error"] = True
        return [block]
    blocks: list[dict[str, Any]] = []
    if part.content.strip():
        blocks.append({"type": "text", "text": part.content})
    for call in part.tool_calls or ():
        blocks.append(
            {
                "type": "tool_use",
                "id": call.tool_call_id,
                "name": call.name,
                "input": _anthropic_input(call),
            }
        )
    return blocks


def to_anthropic_messages(parts: Sequence[MessagePart]) -> AnthropicRequest:
    """The Anthropic Messages request for ``parts``.

    System parts are joined (blank line between) into ``system``. The other parts become
    strictly alternating ``user``/``assistant`` messages of content blocks: consecutive parts
    of one role merge into one message; assistant tool calls become ``tool_use`` blocks whose
    ``input`` is the parsed arguments (parsed from ``raw_arguments`` when unset; ``{}`` when
    they are not a JSON object); tool parts become
    ``tool_result`` blocks (``tool_use_id``, ``content`` when not empty, ``is_error`` from
    the part) of a user message, so all results of one multi-call turn land in the one user
    message after it, before any user text. Blank texts are left out and messages without
    blocks dropped; a placeholder user text (:data:`ANTHROPIC_PLACEHOLDER_TEXT`) is inserted
    when the first message would be the assistant's. A tool part without a
    ``tool_call_id`` raises :class:`ValueError`.
    """
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        if part.role is Role.SYSTEM:
            if part.content.strip():
                system.append(part.content)
            continue
        if part.role is Role.TOOL and not part.tool_call_id:
            raise ValueError(f"parts[{index}]: a tool part needs a tool_call_id")
        role = "assistant" if part.role is Role.ASSISTANT else "user"
        blocks = _anthropic_blocks(part)
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    for message in messages:
        if message["role"] == "user":
            # Anthropic wants the tool_result blocks of a user message before any text.
            message["content"].sort(key=lambda block: block["type"] != "tool_result")
    if messages and messages[0]["role"] == "assistant":
        placeholder = {"type": "text", "text": ANTHROPIC_PLACEHOLDER_TEXT}
        messages.insert(0, {"role": "user", "content": [placeholder]})
    return AnthropicRequest(system="\n\n".join(system), messages=messages)


@dataclass(frozen=True)
class GeminiRequest:
    """The ``system_instruction`` text and ``contents`` of a Gemini ``generateContent``
    request (``system_instruction`` goes in as ``{"parts": [{"text": ...}]}`` when not
    empty)."""

    system_instruction: str
    contents: list[dict[str, Any]]


def _gemini_parts(part: MessagePart, names: dict[str, str]) -> list[dict[str, Any]]:
    if part.role is Role.TOOL:
        name = part.name or names.get(part.tool_call_id or "", "") or "tool"
        response: dict[str, Any] = {"content": part.content}
        if part.is_error:
            response = {"error": part.content}
        return [{"functionResponse": {"name": name, "response": response}}]
    out: list[dict[str, Any]] = []
    if part.content.strip():
        out.append({"text": part.content})
    for call in part.tool_calls or ():
        names[call.tool_call_id] = call.name
        out.append({"functionCall": {"name": call.name, "args": _anthropic_input(call)}})
    return out


def to_gemini_request(parts: Sequence[MessagePart]) -> GeminiRequest:
    """The Gemini request for ``parts``: system parts joined into ``system_instruction``;
    the rest as strictly alternating ``user`` / ``model`` contents (consecutive parts of one
    role merged), assistant tool calls as ``functionCall`` parts (arguments parsed as for
    Anthropic) and tool results as ``functionResponse`` parts (named after their call; an
    error result as ``{"error": ...}``) of the ``user`` content right after the call, before
    any user text. Blank texts are left out; a placeholder user text
    (:data:`ANTHROPIC_PLACEHOLDER_TEXT`) opens the contents when the model would speak first."""
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for part in parts:
        if part.role is Role.SYSTEM:
            if part.content.strip():
                system.append(part.content)
            continue
        role = "model" if part.role is Role.ASSISTANT else "user"
        pieces = _gemini_parts(part, names)
        if not pieces:
            continue
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(pieces)
        else:
            contents.append({"role": role, "parts": pieces})
    for content in contents:
        if content["role"] == "user":
            content["parts"].sort(key=lambda piece: "functionResponse" not in piece)
    if contents and contents[0]["role"] == "model":
        contents.insert(0, {"role": "user", "parts": [{"text": ANTHROPIC_PLACEHOLDER_TEXT}]})
    return GeminiRequest(system_instruction="\n\n".join(system), contents=contents)
