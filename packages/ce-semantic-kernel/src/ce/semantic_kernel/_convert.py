"""Semantic Kernel chat messages <-> the engine's neutral messages (through OpenAI-style
dicts, which SK's own ``ChatMessageContent.to_dict()`` writes).

:func:`to_pending` turns the ``ChatHistory`` a request would send into dicts (and the author
of each: an assistant message SK named after its agent is that agent's); :func:`from_sent`
turns the engine's input back into a NEW ``ChatHistory`` for the one request: an app message
the engine left unchanged is the app's very object, one whose text alone it rewrote is a copy
with that text, anything else is built from the dict. The app's own ``ChatHistory`` (the auto
function-calling loop grows it round by round, an agent thread copies from it by index) is
never changed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ce.core.integration import message_from_openai, reconcile_openai
from ce.core.schema import Author, AuthorKind, Message, ModelInvocation

__all__ = [
    "Pending",
    "from_sent",
    "message_text",
    "normalise_usage",
    "reply_to_message",
    "to_pending",
    "tool_schemas",
]


@functools.lru_cache(maxsize=4096)
def agent_author(name: str) -> Author:
    """The author of what agent ``name`` wrote (one shared, read-only object per name)."""
    return Author(kind=AuthorKind.AGENT, id=name)


def _role(message: Any) -> str:
    role = getattr(message, "role", "")
    return str(getattr(role, "value", role))


def _has_media(message: Any) -> bool:
    from semantic_kernel.contents import (
        FunctionCallContent,
        FunctionResultContent,
        TextContent,
    )

    return any(
        not isinstance(item, (TextContent, FunctionCallContent, FunctionResultContent))
        for item in getattr(message, "items", ()) or ()
    )


@dataclass(frozen=True)
class Pending:
    """The OpenAI-style dicts of a request's messages, their authors, and the app messages
    that carry content the engine cannot read (images, files): never sent unchanged."""

    dicts: list[dict[str, Any]]
    authors: list[Author | None]
    opaque: list[int]
    messages: list[Any]
    """The app messages the dicts stand for, one each."""


def to_pending(messages: Sequence[Any]) -> Pending:
    """The request's messages as the engine reads them. An agent's reply repeated right after
    itself is read once: an ``AgentGroupChat`` channel hands the next agent the previous
    agent's reply twice (SK's own behaviour), which the session holds once."""
    dicts: list[dict[str, Any]] = []
    authors: list[Author | None] = []
    opaque: list[int] = []
    kept: list[Any] = []
    for message in messages:
        entry = dict(message.to_dict())
        if (
            kept
            and entry.get("role") == "assistant"
            and getattr(message, "name", None)
            and getattr(kept[-1], "name", None) == message.name
            and kept[-1].to_dict() == entry
        ):
            continue
        index = len(kept)
        kept.append(message)
        role = entry.get("role")
        if role == "developer":
            entry["role"] = "system"
        name = getattr(message, "name", None)
        if role == "assistant" and name:
            authors.append(agent_author(str(name)))
        else:
            authors.append(None)
        entry.pop("name", None)
        if isinstance(entry.get("content"), list):
            if _has_media(message):
                opaque.append(index)
            entry["content"] = message_text(message)
        elif entry.get("content") is None and role != "assistant":
            entry["content"] = ""
        dicts.append(entry)
    return Pending(dicts, authors, opaque, kept)


def message_text(message: Any) -> str:
    """The text of a ``ChatMessageContent`` (its text items joined, a tool result's
    result)."""
    from semantic_kernel.contents import FunctionResultContent, TextContent

    texts: list[str] = []
    for item in getattr(message, "items", ()) or ():
        if isinstance(item, TextContent) and item.text:
            texts.append(item.text)
        elif isinstance(item, FunctionResultContent):
            texts.append(str(item.result))
    return "\n".join(texts)


def _call_names(sent: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    names: dict[str, str] = {}
    for entry in sent:
        for call in entry.get("tool_calls") or ():
            function = call.get("function") or {}
            names[str(call.get("id"))] = str(function.get("name") or "")
    return names


def _build(entry: Mapping[str, Any], names: Mapping[str, str]) -> Any:
    """A new ``ChatMessageContent`` from one assembled OpenAI dict."""
    from semantic_kernel.contents import (
        AuthorRole,
        ChatMessageContent,
        FunctionCallContent,
        FunctionResultContent,
        TextContent,
    )

    role = str(entry.get("role"))
    content = entry.get("content")
    text = content if isinstance(content, str) else ""
    if role == "tool":
        call_id = str(entry.get("tool_call_id") or "")
        result = FunctionResultContent(id=call_id, name=names.get(call_id) or "tool", result=text)
        return ChatMessageContent(role=AuthorRole.TOOL, items=[result])
    if role == "assistant":
        items: list[Any] = [TextContent(text=text)] if text else []
        for call in entry.get("tool_calls") or ():
            function = call.get("function") or {}
            items.append(
                FunctionCallContent(
                    id=str(call.get("id")),
                    name=str(function.get("name") or ""),
                    arguments=str(function.get("arguments") or "{}"),
                )
            )
        return ChatMessageContent(role=AuthorRole.ASSISTANT, items=items)
    return ChatMessageContent(role=AuthorRole(role), content=text)


def _with_text(message: Any, text: str) -> Any:
    """A copy of the app's system, user or tool ``message`` with ``text``, its other items
    (images, files) kept."""
    from semantic_kernel.contents import (
        ChatMessageContent,
        FunctionResultContent,
        TextContent,
    )

    items: list[Any] = []
    placed = False
    for item in message.items:
        if isinstance(item, FunctionResultContent):
            items.append(item.model_copy(update={"result": text}))
            placed = True
        elif isinstance(item, TextContent):
            if not placed:
                items.append(item.model_copy(update={"text": text}))
                placed = True
        else:
            items.append(item)
    if not placed:
        items.insert(0, TextContent(text=text))
    return ChatMessageContent(
        role=message.role, items=items, name=message.name, metadata=dict(message.metadata)
    )


def from_sent(sent: Sequence[Mapping[str, Any]], pending: Pending) -> Any:
    """A new ``ChatHistory`` holding the engine's input ``sent`` for a request whose own
    messages are ``pending`` (see the module docstring)."""
    from semantic_kernel.contents import ChatHistory

    messages = pending.messages
    names = _call_names(sent)
    out: list[Any] = []
    for entry, where in zip(
        sent, reconcile_openai(pending.dicts, sent, pending.opaque), strict=True
    ):
        if where.source is None:
            out.append(_build(entry, names))
        elif where.text is None:
            out.append(messages[where.source])
        else:
            out.append(_with_text(messages[where.source], where.text))
    return ChatHistory(messages=out)


def tool_schemas(settings: Any) -> list[dict[str, Any]] | None:
    """The tool schemas a request's execution settings carry (OpenAI-style), if any."""
    tools = getattr(settings, "tools", None)
    if not tools:
        return None
    schemas: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, Mapping):
            schemas.append(dict(tool))
    return schemas or None


def normalise_usage(usage: Any) -> tuple[int, int]:
    """``(prompt, completion)`` tokens from a response's ``metadata["usage"]`` across SK's
    connectors: ``CompletionUsage`` (OpenAI, Azure, Ollama, Google, ...), Anthropic's
    ``input_tokens`` / ``output_tokens`` (object or dict), Mistral's 1-tuple."""
    if isinstance(usage, (tuple, list)):
        usage = usage[0] if usage else None
    if usage is None:
        return 0, 0

    def read(*names: str) -> int:
        for name in names:
            value = usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return int(value)
        return 0

    return (
        read("prompt_tokens", "input_tokens", "prompt_token_count"),
        read("completion_tokens", "output_tokens", "candidates_token_count"),
    )


def reply_to_message(reply: Any, agent: str | None, provider: str, model: str) -> Message | None:
    """The model's reply (a ``ChatMessageContent``) as the neutral assistant
    :class:`Message` the engine commits, written by ``agent``; ``None`` when it has neither
    text nor function calls."""
    from semantic_kernel.contents import FunctionCallContent

    calls = [item for item in reply.items if isinstance(item, FunctionCallContent)]
    text = message_text(reply)
    if not text and not calls:
        return None
    entry: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        entry["tool_calls"] = [
            {
                "id": str(call.id),
                "type": "function",
                "function": {
                    "name": call.name or "",
                    "arguments": _arguments(call.arguments),
                },
            }
            for call in calls
        ]
    author = agent_author(agent) if agent else None
    return message_from_openai(entry, author).model_copy(
        update={"invocation": ModelInvocation(provider=provider or "unknown", model=model)}
    )


def _arguments(arguments: Any) -> str:
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    try:
        return json.dumps(dict(arguments), ensure_ascii=False)
    except (TypeError, ValueError):
        return str(arguments)
