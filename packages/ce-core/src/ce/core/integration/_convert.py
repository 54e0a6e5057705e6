"""Assembled input and neutral messages <-> OpenAI-style chat message dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ce.core.formats import from_openai_messages, to_openai_messages
from ce.core.schema import AssembledInput, Author, Message, MessagePart, Role

__all__ = [
    "assembled_to_openai",
    "message_from_openai",
    "message_from_part",
    "openai_to_messages",
]


def assembled_to_openai(assembled: AssembledInput) -> list[dict[str, Any]]:
    """The OpenAI chat messages the model receives for ``assembled`` (see
    :func:`ce.core.formats.to_openai_messages`)."""
    return to_openai_messages(assembled.parts)


def message_from_part(part: MessagePart, author: Author | None = None) -> Message:
    """The :class:`Message` for one neutral part. An assistant message gets no
    ``invocation``: the engine fills it from the runtime config's provider and model hints
    when it records the message."""
    return Message(
        role=part.role,
        content=part.content,
        author=author,
        tool_calls=part.tool_calls if part.role is Role.ASSISTANT else None,
        tool_call_id=part.tool_call_id if part.role is Role.TOOL else None,
        name=part.name,
    )


def openai_to_messages(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Pending messages for ``engine.prepare_call`` from OpenAI chat message dicts: system
    (and developer), user, assistant with ``tool_calls``, tool with ``tool_call_id``;
    content as a string, null or a list of text parts. Malformed input raises
    :class:`ValueError` (see :func:`ce.core.formats.from_openai_messages`)."""
    return [message_from_part(part) for part in from_openai_messages(messages)]


def message_from_openai(message: Mapping[str, Any], author: Author | None = None) -> Message:
    """One OpenAI chat message dict as a :class:`Message` written by ``author`` (for
    multi-agent frameworks, the agent that wrote it)."""
    (part,) = from_openai_messages([message])
    return message_from_part(part, author)
