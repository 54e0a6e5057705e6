"""LlamaIndex chat messages <-> the engine's neutral messages (through OpenAI-style dicts).

Tool calls are read from both places LlamaIndex keeps them: ``ToolCallBlock`` content blocks
(llama-index-core >= 0.14.1) and ``additional_kwargs["tool_calls"]`` (OpenAI-style dicts or
the OpenAI SDK's objects, the older form). A tool result names its call in
``additional_kwargs["tool_call_id"]``, as FunctionAgent writes it.
"""

from __future__ import annotations

import base64
import functools
import json
import threading
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    AudioBlock,
    ChatMessage,
    DocumentBlock,
    ImageBlock,
    MessageRole,
    TextBlock,
)

from ce.core.integration import (
    History,
    RewriteMemo,
    content_with_media,
    message_from_openai,
    reconcile_openai,
)
from ce.core.schema import Message, ModelInvocation

__all__ = [
    "fingerprint",
    "from_openai",
    "message_text",
    "reply_to_message",
    "to_openai",
    "tool_schemas",
    "turn_key",
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


_ASSISTANT_ROLES = frozenset(
    {MessageRole.ASSISTANT.value, MessageRole.CHATBOT.value, MessageRole.MODEL.value}
)


def _answer(text: str) -> str:
    """An assistant message's text as the engine reads it (:func:`to_openai`,
    :func:`turn_key`, and so the replies the plugin records): without the whitespace around
    it, since the same answer comes back in either form. llama-index-core's
    ``StreamingAgentChatResponse`` writes a chat engine's streamed answer to its memory
    stripped (``final_text.strip()``), while the model's reply, an agent's memory and an
    app's own history (the streamed tokens joined) keep the model's whitespace: read as
    written, the next turn's history would hold a second copy of each such answer."""
    return text.strip()


def message_text(message: ChatMessage) -> str:
    """The text of ``message``: its text blocks, joined."""
    return "".join(b.text for b in message.blocks if isinstance(b, TextBlock))


def turn_key(message: Any) -> Hashable | None:
    """A LlamaIndex message as a conversation holds it (``None`` for a system message, which
    two unrelated calls may share)."""
    role = getattr(message, "role", None)
    if role is None or getattr(role, "value", role) == "system":
        return None
    kwargs = getattr(message, "additional_kwargs", None) or {}
    calls = (
        tuple(str(b.tool_call_id) for b in message.blocks if isinstance(b, ToolCallBlock))
        if ToolCallBlock is not None
        else ()
    )
    text = message_text(message)
    if getattr(role, "value", role) in _ASSISTANT_ROLES:
        text = _answer(text)
    return (str(getattr(role, "value", role)), text, calls, kwargs.get("tool_call_id"))


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


# Inline image, audio and document data as the base64 text OpenAI takes, by the block's data
# (a framework passes the same blocks on every call: each is encoded once). Bounded; holds the
# data it converted alive until evicted.
_INLINE_MAX = 32
_inline: dict[Any, str] = {}
_lock = threading.Lock()


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    with _lock:
        if len(cache) >= _INLINE_MAX:
            cache.pop(next(iter(cache)))
        cache[key] = value


# An ImageBlock's URL as a string, by the URL object (pydantic builds a new string, a copy of a
# data URL, on every str()): the object is kept with its string so its id is not reused.
_urls: dict[int, tuple[Any, str]] = {}


def _url_text(url: Any) -> str:
    if isinstance(url, str):
        return url
    held = _urls.get(id(url))
    if held is not None and held[0] is url:
        return held[1]
    text = str(url)
    _remember(_urls, id(url), (url, text))
    return text


def _inline_text(block: Any, data: Any, resolve: str, mime: str | None = None) -> str:
    """The base64 text of a block's data (a ``data:<mime>;base64,`` URL when ``mime`` is
    given), built once per bytes object or path: LlamaIndex keeps inline bytes base64-encoded
    already; a path (or a buffer) is read through the block's ``resolve`` method."""
    key: tuple[Any, ...] | None = None
    if isinstance(data, bytes):
        key = (mime, data)
    elif data is None and block.path:
        key = (mime, "path", str(block.path))
    if key is not None:
        cached = _inline.get(key)
        if cached is not None:
            return cached
    if isinstance(data, bytes):
        b64 = data.decode("ascii")
    else:
        b64 = base64.b64encode(getattr(block, resolve)().read()).decode("ascii")
    text = b64 if mime is None else f"data:{mime};base64,{b64}"
    if key is not None:
        _remember(_inline, key, text)
    return text


def _media_part(block: Any) -> dict[str, Any] | None:
    """The OpenAI content part of an image, audio or document block (as LlamaIndex's OpenAI
    LLM sends it), ``None`` for another block or one whose data cannot be read."""
    try:
        if isinstance(block, ImageBlock):
            if block.url:
                url = _url_text(block.url)
            else:
                mime = block.image_mimetype or "image/png"
                url = _inline_text(block, block.image, "resolve_image", mime)
            image: dict[str, Any] = {"url": url}
            if block.detail in ("low", "high"):
                image["detail"] = block.detail
            return {"type": "image_url", "image_url": image}
        if isinstance(block, AudioBlock):
            if not block.format:  # OpenAI needs the format: such a block goes uncounted
                return None
            data = _inline_text(block, block.audio, "resolve_audio")
            return {"type": "input_audio", "input_audio": {"data": data, "format": block.format}}
        if isinstance(block, DocumentBlock):
            file: dict[str, Any] = {"filename": block.title}
            if not block.data and str(block.url or "").startswith(("http://", "https://")):
                file["file_url"] = str(block.url)
            else:
                mime = block.document_mimetype or "application/pdf"
                file["file_data"] = _inline_text(block, block.data, "resolve_document", mime)
            return {"type": "file", "file": file}
    except Exception:  # unreadable data: the block goes to the model as it is, uncounted
        return None
    return None


def _content(message: ChatMessage) -> str | list[dict[str, Any]]:
    """The OpenAI content of ``message``: its text (the text blocks joined), or, when it has
    images, audio or documents, the content parts in order (the text where its first block
    was)."""
    return content_with_media(message_text(message), _parts(message))


def _parts(message: ChatMessage) -> Iterator[dict[str, Any] | None]:
    """``message``'s blocks as :func:`~ce.core.integration.content_with_media` reads them: a
    media part, or ``None`` for a text block (a block of another kind is left out)."""
    for block in message.blocks:
        if isinstance(block, TextBlock):
            yield None
        elif (part := _media_part(block)) is not None:
            yield part


def fingerprint(message: ChatMessage) -> tuple[Any, ...]:
    """What a conversion of ``message`` reads: the values of its fields and of its blocks'
    fields, and the number of its blocks."""
    blocks = message.blocks
    return (
        *message.__dict__.values(),
        len(blocks),
        *(value for block in blocks for value in block.__dict__.values()),
    )


def to_openai(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """LlamaIndex messages as OpenAI chat message dicts (the text; image, audio and document
    blocks as OpenAI content parts, in order; tool calls and tool call ids kept)."""
    converted: list[dict[str, Any]] = []
    for message in messages:
        role = _ROLES.get(str(getattr(message.role, "value", message.role)), "user")
        content = _content(message) if role != "system" else message_text(message)
        if role == "assistant" and isinstance(content, str):
            content = _answer(content)
        entry: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            calls = _tool_calls(message)
            if calls:
                entry["tool_calls"] = calls
        elif role == "tool":
            call_id = message.additional_kwargs.get("tool_call_id")
            entry["tool_call_id"] = str(call_id or "")
        converted.append(entry)
    return converted


_MEDIA_BLOCKS = (ImageBlock, AudioBlock, DocumentBlock)


_rewrites = RewriteMemo()


def _with_text(original: ChatMessage, text: str, media: bool = True) -> ChatMessage:
    """A copy of ``original`` with ``text`` as its text; its other blocks kept, but for its
    images, audio and documents when ``media`` is false (the engine left them out). Made
    once per message and text (see :class:`~ce.core.integration.RewriteMemo`)."""
    return _rewrites.copy(
        original, (text, media), functools.partial(_copy_with_text, original, text, media)
    )


def _copy_with_text(original: ChatMessage, text: str, media: bool) -> ChatMessage:
    blocks: list[Any] = [
        b
        for b in original.blocks
        if not isinstance(b, TextBlock) and (media or not isinstance(b, _MEDIA_BLOCKS))
    ]
    if text:
        blocks.insert(0, TextBlock(text=text))
    return original.model_copy(update={"blocks": blocks})


def _blocks(content: list[Any]) -> list[Any]:
    """LlamaIndex blocks for an OpenAI content-part list (text, images, audio, files)."""
    blocks: list[Any] = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            blocks.append(TextBlock(text=str(part.get("text", ""))))
        elif kind == "image_url":
            image = part["image_url"]
            blocks.append(ImageBlock(url=image["url"], detail=image.get("detail")))
        elif kind == "input_audio":
            audio = part["input_audio"]
            blocks.append(AudioBlock(audio=audio["data"].encode(), format=audio["format"]))
        elif kind == "file":
            file = part["file"]
            data = file.get("file_data") or ""
            if data.startswith("data:"):
                header, _, payload = data[5:].partition(",")
                blocks.append(
                    DocumentBlock(
                        data=payload.encode(),
                        document_mimetype=header.split(";", 1)[0] or None,
                        title=file.get("filename"),
                    )
                )
            elif file.get("file_url"):
                blocks.append(DocumentBlock(url=file["file_url"], title=file.get("filename")))
    return blocks


def _build(sent: Mapping[str, Any]) -> ChatMessage:
    role = sent["role"]
    text = sent.get("content") or ""
    if not isinstance(text, str):
        if role == "user":
            return ChatMessage(role=MessageRole.USER, blocks=_blocks(text))
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


def from_openai(
    sent: Sequence[Mapping[str, Any]],
    originals: Sequence[ChatMessage],
    original_dicts: Sequence[Mapping[str, Any]],
    history: History | None = None,
) -> list[ChatMessage]:
    """The LlamaIndex messages for what the engine assembled, through the kit's reconciler
    (:func:`ce.core.integration.reconcile_openai`): a message the engine left as it was is
    the app's very object (its images, provider fields and tool-call form kept); a system,
    user or tool message whose text alone the engine changed (redaction, a fenced tool
    result) is a copy of the app's message with the new text, its other blocks (images,
    audio) kept unless the engine left them out; the rest (the engine's system message,
    history from earlier runs, an assistant message whose calls the engine changed) are new
    messages. With the ``history`` ``original_dicts`` comes from, the work grows with
    ``sent``, not with the app's history; an app message that would go as it is but was
    changed in place since it was converted goes as the engine's input has it."""
    if len(originals) != len(original_dicts):
        return [_build(message) for message in sent]
    result: list[ChatMessage] = []
    origins = reconcile_openai(original_dicts, sent, history=history)
    for message, origin in zip(sent, origins, strict=True):
        if origin.source is None or (
            origin.text is None
            and history is not None
            and not history.unchanged(
                origin.source, originals[origin.source], lambda m: to_openai([m])[0]
            )
        ):
            result.append(_build(message))
        elif origin.text is None:
            result.append(originals[origin.source])
        else:
            result.append(_with_text(originals[origin.source], origin.text, origin.media))
    return result


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
