"""LangChain message types <-> the engine's neutral messages (through OpenAI-style dicts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    convert_to_messages,
    convert_to_openai_messages,
)
from langchain_core.utils.function_calling import convert_to_openai_tool

from ce.core.integration import message_from_openai
from ce.core.schema import Message, ModelInvocation

__all__ = ["ai_to_message", "from_openai", "message_text", "to_openai", "tool_schemas"]


def to_openai(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as OpenAI chat message dicts (tool calls and ids kept)."""
    converted = convert_to_openai_messages(list(messages))
    return [dict(m) for m in converted]


def tool_schemas(tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """Bound tools (LangChain tools, pydantic models, functions, or provider-format dicts) as
    OpenAI tool schemas, which the engine counts against the budget; ``None`` without tools."""
    if not tools:
        return None
    schemas: list[dict[str, Any]] = []
    for tool in tools:
        try:
            schemas.append(dict(convert_to_openai_tool(tool)))
        except Exception:  # an exotic provider format: counted as far as it reads
            if isinstance(tool, Mapping):
                schemas.append(dict(tool))
    return schemas or None


def from_openai(messages: Sequence[Mapping[str, Any]]) -> list[BaseMessage]:
    """OpenAI chat message dicts (what the engine assembled) as LangChain messages."""
    return list(convert_to_messages([dict(m) for m in messages]))


def ai_to_message(message: AIMessage, provider: str, model: str) -> Message:
    """The model's reply as the neutral assistant :class:`Message` the engine commits."""
    (converted,) = to_openai([message])
    if converted.get("content") is None:
        converted["content"] = ""
    return message_from_openai(converted).model_copy(
        update={"invocation": ModelInvocation(provider=provider or "unknown", model=model)}
    )


def message_text(message: BaseMessage) -> str:
    """The text of a message (string content, or the text blocks of a list content)."""
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "".join(parts)
