"""LangChain message types <-> the engine's neutral messages (through OpenAI-style dicts), and
the engine's input back onto the app's own message objects (:func:`reconcile`)."""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
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

__all__ = [
    "ai_to_message",
    "from_openai",
    "message_text",
    "reconcile",
    "to_openai",
    "tool_schemas",
]

_TEXT_TYPES = frozenset({"text", "input_text", "output_text"})
# Content blocks handed to the model as the app wrote them (the engine reads only text): images,
# files, audio, in OpenAI, OpenAI Responses, Anthropic and LangChain standard formats. Other
# blocks (reasoning, provider-specific ones) carry text the engine and its redactor never saw:
# a message with one is not handed over as it is, and a rewritten copy leaves them out.
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


# -- the engine's input back onto the app's messages ---------------------------------------
#
# The engine speaks text: ``ce.core.formats.from_openai_messages`` keeps only the text parts of
# a message (image, file and audio parts are dropped before ``prepare_call``) and the assembled
# input comes back as plain OpenAI dicts. Rebuilding LangChain messages from those would lose
# what the engine never saw: image parts, message ids, ``additional_kwargs``,
# ``response_metadata``, a tool message's ``artifact``.

_Key = tuple[Hashable, ...]


def _text(content: Any) -> str:
    """A content's text as the engine reads it (``ce.core.formats``): a string, or the text
    parts of a list joined with newlines; anything else counts as no text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        part if isinstance(part, str) else str(part.get("text", ""))
        for part in content
        if isinstance(part, str) or (isinstance(part, Mapping) and part.get("type") in _TEXT_TYPES)
    )


def _arguments(function: Mapping[str, Any]) -> str:
    raw = function.get("arguments")
    if raw is not None and not isinstance(raw, str):
        raw = json.dumps(raw, ensure_ascii=False, separators=(",", ":"))
    return raw if raw and raw.strip() else "{}"


def _key(message: Mapping[str, Any]) -> _Key:
    """What the engine sees of an OpenAI message (role, text, tool call id, the name of a
    user or assistant message, tool calls): two messages with equal keys are one message to
    the engine. The same reading as ``ce.core.formats.from_openai_messages`` (then
    ``to_openai_messages``), without building its parts."""
    role = message.get("role")
    role = "system" if role == "developer" else role
    name = message.get("name") if role in ("user", "assistant") else None
    calls = tuple(
        (call.get("id"), function.get("name"), _arguments(function))
        for call in message.get("tool_calls") or ()
        if isinstance(call, Mapping) and isinstance(function := call.get("function"), Mapping)
    )
    call_id = message.get("tool_call_id") if role == "tool" else None
    return (role, _text(message.get("content")), call_id, name, calls)


def _unchanged(app_keys: list[_Key], sent_keys: list[_Key]) -> list[int | None]:
    """For each sent message, the index of the app message it is unchanged from, or None:
    matched from the end, keeping the order (the newest messages are the app's pending ones;
    older ones may come from the store)."""
    index: dict[_Key, list[int]] = {}
    for j, key in enumerate(app_keys):
        index.setdefault(key, []).append(j)
    match: list[int | None] = [None] * len(sent_keys)
    bound = len(app_keys)
    for i in range(len(sent_keys) - 1, -1, -1):
        candidates = index.get(sent_keys[i])
        while candidates and candidates[-1] >= bound:
            candidates.pop()
        if candidates:
            bound = candidates.pop()
            match[i] = bound
    return match


def _rewritten(
    app_keys: list[_Key], sent_keys: list[_Key], match: list[int | None]
) -> dict[int, int]:
    """Sent messages whose text alone the engine rewrote (redaction, a fenced tool result,
    the system prompt with the engine's context), to the app message each stands for: between
    the same unchanged neighbours, a tool result with the same ``tool_call_id``, and the
    system and user messages in order when both sides have as many of them there (after the
    last unchanged message, the newest user message at least: the app's pending question).
    Assistant messages are never paired (their tool calls go as the engine sent them)."""
    pairs: dict[int, int] = {}
    anchors = [(i, j) for i, j in enumerate(match) if j is not None]
    low_i = low_j = -1
    for high_i, high_j in [*anchors, (len(sent_keys), len(app_keys))]:
        sent_gap = range(low_i + 1, high_i)
        app_gap = range(low_j + 1, high_j)
        if sent_gap and app_gap:
            for role in ("system", "user"):
                sent_role = [i for i in sent_gap if sent_keys[i][0] == role]
                app_role = [j for j in app_gap if app_keys[j][0] == role]
                if sent_role and len(sent_role) == len(app_role):
                    pairs.update(zip(sent_role, app_role, strict=True))
                elif sent_role and app_role and role == "user" and high_i == len(sent_keys):
                    pairs[sent_role[-1]] = app_role[-1]
            results = {app_keys[j][2]: j for j in app_gap if app_keys[j][0] == "tool"}
            for i in sent_gap:
                if sent_keys[i][0] == "tool" and sent_keys[i][2] in results:
                    pairs[i] = results.pop(sent_keys[i][2])
        low_i, low_j = high_i, high_j
    return pairs


def _is_text(block: Any) -> bool:
    return isinstance(block, str) or (isinstance(block, dict) and block.get("type") in _TEXT_TYPES)


def _is_media(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in _MEDIA_TYPES


def _as_written(message: BaseMessage) -> bool:
    """Whether ``message`` can reach the model as the app wrote it: its content is text and
    media only (see :data:`_MEDIA_TYPES`)."""
    content = message.content
    return isinstance(content, str) or all(_is_text(b) or _is_media(b) for b in content)


def _with_text(message: BaseMessage, text: str) -> BaseMessage:
    """A copy of ``message`` with ``text`` as its text: a string content is replaced; in a
    list content the first text block takes ``text`` (its other keys kept), the other text
    blocks go, media blocks (images, files, audio) stay where they were, any other block
    goes."""
    content = message.content
    if isinstance(content, str):
        return message.model_copy(update={"content": text})
    blocks: list[Any] = []
    placed = False
    for block in content:
        if _is_media(block):
            blocks.append(block)
        elif not _is_text(block):
            continue
        elif not placed:
            placed = True
            blocks.append({**block, "text": text} if isinstance(block, dict) else text)
    if not placed and text:
        blocks.insert(0, {"type": "text", "text": text})
    return message.model_copy(update={"content": blocks})


def reconcile(
    app: Sequence[BaseMessage],
    pending: Sequence[Mapping[str, Any]],
    sent: Sequence[Mapping[str, Any]],
) -> list[BaseMessage]:
    """The LangChain messages the model receives for the engine's OpenAI-style ``sent``,
    given the app's own messages ``app`` and their OpenAI dicts ``pending`` (one each, in
    order): the app's own object for every message the engine kept as it was (ids,
    ``additional_kwargs``, image / file / audio parts and all), a copy of the app's message
    with the engine's text (and its media parts) for a system, user or tool message whose text
    alone the engine rewrote, and new messages for what the engine added (its summary, history
    the app did not pass, an assistant turn it changed). A message with content blocks the
    engine cannot read but text and media (reasoning, provider-specific blocks) is never
    handed over as it is."""
    if len(pending) != len(app):
        return from_openai(sent)
    app_keys, sent_keys = [_key(m) for m in pending], [_key(m) for m in sent]
    for j, message in enumerate(app):
        if not _as_written(message):  # never unchanged: rewritten (a copy) or built new
            role, _, call_id, name, calls = app_keys[j]
            app_keys[j] = (role, object(), call_id, name, calls)
    match = _unchanged(app_keys, sent_keys)
    rewritten = _rewritten(app_keys, sent_keys, match)
    out: list[BaseMessage | None] = []
    built: list[int] = []
    for i, j in enumerate(match):
        if j is not None:
            out.append(app[j])
        elif i in rewritten:
            text = sent_keys[i][1]
            out.append(_with_text(app[rewritten[i]], text if isinstance(text, str) else ""))
        else:
            out.append(None)
            built.append(i)
    if built:
        new = from_openai([sent[i] for i in built])
        for i, message in zip(built, new, strict=True):
            out[i] = message
    return [m for m in out if m is not None]
