"""LangChain message types <-> the engine's neutral messages (through OpenAI-style dicts), and
the engine's input back onto the app's own message objects (:func:`reconcile`)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
    convert_to_openai_messages,
)
from langchain_core.utils.function_calling import convert_to_openai_tool

from ce.core.integration import History, RewriteMemo, message_from_openai, reconcile_openai
from ce.core.schema import Message, ModelInvocation, Role

__all__ = [
    "SUMMARY_SOURCE",
    "ai_to_message",
    "failed_results",
    "fingerprint",
    "from_openai",
    "in_conversation",
    "message_text",
    "opaque",
    "reconcile",
    "to_openai",
    "tool_schemas",
]

_TEXT_TYPES = frozenset({"text", "input_text", "output_text"})
# Content blocks handed to the model as the app wrote them (the engine reads their OpenAI form,
# ``convert_to_openai_messages``, into its parts: counted and stored): images, files, audio, in
# OpenAI, OpenAI Responses, Anthropic and LangChain standard formats. Other blocks (reasoning,
# provider-specific ones) carry text the engine and its redactor never saw: a message with one
# is not handed over as it is, and a rewritten copy leaves them out.
_MEDIA_TYPES = frozenset(
    {
        "image_url",
        "image",
        "input_image",
        "input_audio",
        "audio",
        "file",
        "input_file",
        "video",
        "document",
    }
)


SUMMARY_SOURCE = "summarization"
"""The ``additional_kwargs["lc_source"]`` LangChain's ``SummarizationMiddleware`` marks the
summary message it puts in place of older turns with."""


def in_conversation(message: BaseMessage) -> bool:
    """Whether ``message`` is part of the conversation the engine reads: every message but
    a summary LangChain's ``SummarizationMiddleware`` put in place of older turns. The session
    holds those turns (their calls went through the engine), and the engine fits them to the
    budget itself, so a summary is neither stored as a user turn nor sent beside the turns it
    summarizes."""
    return not (
        message.type == "human" and message.additional_kwargs.get("lc_source") == SUMMARY_SOURCE
    )


_CONVERTED_MAX = 8192
# The OpenAI dicts of a LangChain message, by the message object: an app passes its history
# (the same objects) on every call, so each message is converted once. An entry holds the
# message and what its conversion read (content, tool calls, additional kwargs, name, tool
# call id), compared by identity: a message given new content is converted again.
_converted: dict[int, tuple[BaseMessage, tuple[Any, ...], list[dict[str, Any]]]] = {}
_converted_lock = threading.Lock()


_KINDS: dict[type, tuple[str | None, bool, bool, bool]] = {}


def _kind(cls: type) -> tuple[str | None, bool, bool, bool]:
    """For a message class: the role of its text-alone OpenAI form (None: not one of those)
    and whether it is an AI, a tool and a chat message, asked of the class once (``isinstance``
    on LangChain's message classes costs microseconds)."""
    kind = _KINDS.get(cls)
    if kind is None:
        ai = issubclass(cls, AIMessage)
        role = (
            "assistant"
            if ai
            else "user"
            if issubclass(cls, HumanMessage)
            else "system"
            if issubclass(cls, SystemMessage)
            else None
        )
        kind = _KINDS[cls] = (role, ai, issubclass(cls, ToolMessage), issubclass(cls, ChatMessage))
    return kind


def fingerprint(message: BaseMessage) -> tuple[Any, ...]:
    """What a conversion of ``message`` reads besides its class: its content, tool calls,
    additional kwargs, name, tool call id, the number of its content blocks, and the role of a
    ``ChatMessage``."""
    content = message.content
    _, ai, tool, chat = _kind(type(message))
    return (
        content,
        message.tool_calls if ai else None,  # type: ignore[attr-defined]
        message.additional_kwargs,
        message.name,
        message.tool_call_id if tool else None,  # type: ignore[attr-defined]
        len(content) if isinstance(content, list) else -1,
        message.role if chat else None,  # type: ignore[attr-defined]
    )


def _same(read: tuple[Any, ...], held: tuple[Any, ...]) -> bool:
    return (
        read[0] is held[0]
        and read[1] is held[1]
        and read[2] is held[2]
        and read[3] == held[3]
        and read[4] == held[4]
        and read[5] == held[5]
        and read[6] == held[6]
    )


def _plain(message: BaseMessage) -> dict[str, Any] | None:
    """The OpenAI dict of a human, system or AI message of text alone (no name, no tool calls,
    no refusal, no role of its own): what ``convert_to_openai_messages`` makes of it, made at
    once; None for any other."""
    content = message.content
    role, ai, _, _ = _kind(type(message))
    if role is None or not isinstance(content, str) or message.name:
        return None
    extra = message.additional_kwargs
    if extra and (extra.get("refusal") or "__openai_role__" in extra):
        return None
    if ai and message.tool_calls:  # type: ignore[attr-defined]
        return None
    return {"role": role, "content": content}


def to_openai(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as OpenAI chat message dicts (tool calls and ids kept); fresh dicts
    each call, a message met before unchanged is not converted again."""
    out: list[dict[str, Any]] = []
    for message in messages:
        plain = _plain(message)
        if plain is not None:
            out.append(plain)
            continue
        read = fingerprint(message)
        held = _converted.get(id(message))
        if held is None or held[0] is not message or not _same(read, held[1]):
            dicts = [dict(m) for m in convert_to_openai_messages([message])]
            with _converted_lock:
                if len(_converted) >= _CONVERTED_MAX:
                    _converted.clear()
                _converted[id(message)] = (message, read, dicts)
        else:
            dicts = held[2]
        out.extend(dict(d) for d in dicts)
    return out


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
    invocation = ModelInvocation(provider=provider or "unknown", model=model)
    plain = _plain(message)
    if plain is not None:  # a reply of text alone (most of them): its message made at once
        return Message(role=Role.ASSISTANT, content=plain["content"], invocation=invocation)
    (converted,) = to_openai([message])
    if converted.get("content") is None:
        converted["content"] = ""
    return message_from_openai(converted).model_copy(update={"invocation": invocation})


def failed_results(messages: Sequence[BaseMessage]) -> list[ToolMessage]:
    """The tool messages of ``messages`` that LangChain marks as failed (``status="error"``),
    in order: the error of a tool that raised, a call ``HumanInTheLoopMiddleware`` rejected, a
    call of an unknown tool. Their OpenAI form does not say so (:func:`to_openai`)."""
    return [m for m in messages if isinstance(m, ToolMessage) and m.status == "error"]


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


# -- the engine's input back onto the app's messages ---------------------------------------
#
# The kit's reconciler (``ce.core.integration.reconcile_openai``) says which app message each
# assembled one is; rebuilding LangChain messages from the assembled dicts would lose what the
# engine never saw: image parts, message ids, ``additional_kwargs``, ``response_metadata``, a
# tool message's ``artifact``.


def _is_text(block: Any) -> bool:
    return isinstance(block, str) or (isinstance(block, dict) and block.get("type") in _TEXT_TYPES)


def _is_media(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in _MEDIA_TYPES


def _as_written(message: BaseMessage) -> bool:
    """Whether ``message`` can reach the model as the app wrote it: its content is text and
    media only (see :data:`_MEDIA_TYPES`)."""
    content = message.content
    return isinstance(content, str) or all(_is_text(b) or _is_media(b) for b in content)


_rewrites = RewriteMemo()


def _with_text(message: BaseMessage, text: str, media: bool = True) -> BaseMessage:
    """A copy of ``message`` with ``text`` as its text: a string content is replaced; in a
    list content the first text block takes ``text`` (its other keys kept), the other text
    blocks go, media blocks (images, files, audio) stay where they were (or go too, when
    ``media`` is false: the engine left them out), any other block goes. Made once per
    message and text (see :class:`~ce.core.integration.RewriteMemo`)."""
    return _rewrites.copy(
        message, (text, media), functools.partial(_copy_with_text, message, text, media)
    )


def _copy_with_text(message: BaseMessage, text: str, media: bool) -> BaseMessage:
    content = message.content
    if isinstance(content, str):
        return message.model_copy(update={"content": text})
    blocks: list[Any] = []
    placed = False
    for block in content:
        if _is_media(block):
            if media:
                blocks.append(block)
        elif not _is_text(block):
            continue
        elif not placed:
            placed = True
            blocks.append({**block, "text": text} if isinstance(block, dict) else text)
    if not placed and text:
        blocks.insert(0, {"type": "text", "text": text})
    return message.model_copy(update={"content": blocks})


def _one_dict(message: BaseMessage) -> dict[str, Any] | None:
    """``message`` converted again, as one OpenAI dict (None when it makes several)."""
    converted = convert_to_openai_messages([message])
    return dict(converted[0]) if len(converted) == 1 else None


def opaque(message: BaseMessage) -> bool:
    """Whether ``message`` holds content the engine cannot read (see :func:`reconcile`)."""
    return not _as_written(message)


def reconcile(
    app: Sequence[BaseMessage],
    pending: Sequence[Mapping[str, Any]],
    sent: Sequence[Mapping[str, Any]],
    history: History | None = None,
) -> list[BaseMessage]:
    """The LangChain messages the model receives for the engine's OpenAI-style ``sent``,
    given the app's own messages ``app`` and their OpenAI dicts ``pending`` (one each, in
    order), through :func:`ce.core.integration.reconcile_openai`: the app's own object for
    every message the engine kept as it was (ids, ``additional_kwargs``, image / file / audio
    parts and all), a copy of the app's message with the engine's text (and its media parts)
    for a system, user or tool message whose text alone the engine rewrote, and new messages
    for what the engine added or changed. A message with content blocks the engine cannot
    read but text and media (reasoning, provider-specific blocks) is never handed over as it
    is. With the ``history`` ``pending`` comes from, the work grows with ``sent``, not with
    the app's history; an app message that would go as it is but was changed in place since
    it was converted goes as the engine's input has it."""
    if len(pending) != len(app):
        return from_openai(sent)
    if history is None:
        hidden = [j for j, message in enumerate(app) if not _as_written(message)]
        origins = reconcile_openai(pending, sent, hidden)
    else:
        origins = reconcile_openai(pending, sent, history=history)
    out: list[BaseMessage | None] = []
    built: list[int] = []
    for i, origin in enumerate(origins):
        if origin.source is None or (
            origin.text is None
            and history is not None
            and not history.unchanged(origin.source, app[origin.source], _one_dict)
        ):
            out.append(None)
            built.append(i)
        elif origin.text is None:
            out.append(app[origin.source])
        else:
            out.append(_with_text(app[origin.source], origin.text, origin.media))
    if built:
        new = from_openai([sent[i] for i in built])
        for i, message in zip(built, new, strict=True):
            out[i] = message
    return [m for m in out if m is not None]
