"""Haystack ``ChatMessage`` <-> the engine's neutral messages (through OpenAI-style dicts,
which Haystack's own ``ChatMessage.to_openai_dict_format()`` writes).

:func:`to_pending` turns the messages a chat generator would send into dicts: a user
message's or a tool result's pictures and files (``ImageContent``, ``FileContent``) are
OpenAI content parts in order with its text, which the engine stores with the message and
counts against the budget. :func:`from_sent` turns the engine's input back into a NEW list of
``ChatMessage`` for the one call: an app message the engine left unchanged is the app's very
object, one whose text alone it rewrote is a copy with that text (its pictures and files
kept unless the engine left them out), anything else is built from the dict (pictures and
files the session supplies as ``ImageContent`` and ``FileContent``). The app's own list (an
Agent's ``State``) is never changed. A history the app continues is converted only for its
new messages (:func:`to_openai` and :func:`opaque` are what ``plugin.histories`` converts
with; :class:`Pending` then carries that history).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ce.core.integration import (
    History,
    RetrievalHit,
    RewriteMemo,
    content_with_media,
    message_from_openai,
    reconcile_openai,
)
from ce.core.schema import Author, AuthorKind, Message, ModelInvocation

__all__ = [
    "Pending",
    "as_messages",
    "documents_in",
    "from_sent",
    "gives_documents",
    "hits_from_documents",
    "is_readable",
    "normalise_usage",
    "opaque",
    "prompt_text",
    "readable",
    "reply_text",
    "reply_to_message",
    "to_openai",
    "to_pending",
    "tool_schemas",
    "turn_key",
    "with_prompt_text",
]

COMPACTION_META = "context_compaction"
"""The ``meta`` key Haystack's compactors (``CompactionHook``) put on the messages they write:
an omission note, a summary."""
_READ_TYPES = ("text", "image_url", "file")
"""The OpenAI content parts the engine reads of Haystack's: text, and those Haystack writes
for ``ImageContent`` and ``FileContent``."""
_URI_KEYS = ("source", "url", "uri", "link", "file_path", "path", "file_name")
_SMALL = 512
_DOCUMENT_TYPE = re.compile(r"\bDocument\b")


@functools.lru_cache(maxsize=4096)
def agent_author(name: str) -> Author:
    """The author of what agent ``name`` wrote (one shared, read-only object per name)."""
    return Author(kind=AuthorKind.AGENT, id=name)


def as_messages(messages: Any) -> list[Any]:
    """A chat generator's ``messages`` argument as a list (a ``str`` is one user message, as
    Haystack reads it)."""
    from haystack.dataclasses import ChatMessage

    if isinstance(messages, str):
        return [ChatMessage.from_user(messages)]
    return list(messages or ())


@dataclass(frozen=True)
class Pending:
    """The OpenAI-style dicts of a call's messages and the app messages they stand for.
    ``history``: the :class:`~ce.core.integration.History` the dicts come from (then shared
    with the next call: read-only), or None when they were converted for this call alone."""

    dicts: list[dict[str, Any]]
    messages: list[Any]
    history: History | None = None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _content(parts: list[Any]) -> str | list[dict[str, Any]]:
    """An OpenAI content-part list as the engine reads it: its text (the text parts joined),
    or, when it holds pictures or files, those parts in order with one text part holding
    that text where the first text part was (none when the text is empty)."""
    kinds = [(p.get("type") if isinstance(p, dict) else None, p) for p in parts]
    return content_with_media(
        _text_of(parts),
        (None if kind == "text" else part for kind, part in kinds if kind in _READ_TYPES),
    )


def _media_result(result: Any) -> bool:
    """Whether a ``ToolCallResult`` holds pictures or files (Haystack's Chat Completions
    form takes none: its parts are written as a user message's are)."""
    from haystack.dataclasses import TextContent

    return not isinstance(result.result, str) and any(
        not isinstance(part, TextContent) for part in result.result
    )


def _entry(message: Any) -> dict[str, Any]:
    """One message as the engine reads it (a new dict): text, tool calls, tool results, and
    a user message's or tool result's pictures and files as content parts (see
    :func:`_content`)."""
    result = message.tool_call_result
    if result is not None and _media_result(result):
        from haystack.dataclasses import ChatMessage

        parts = ChatMessage.from_user(content_parts=result.result).to_openai_dict_format()
        entry = {"role": "tool", "content": parts["content"]}
        if result.origin.id is not None:
            entry["tool_call_id"] = result.origin.id
    else:
        entry = dict(message.to_openai_dict_format(require_tool_call_ids=False))
    entry.pop("name", None)
    content = entry.get("content")
    if isinstance(content, list):
        entry["content"] = _content(content)
    elif content is None and entry.get("role") != "assistant":
        entry["content"] = ""
    if entry.get("role") == "developer":
        entry["role"] = "system"
    return entry


def turn_key(message: Any) -> Hashable | None:
    """A Haystack message as a conversation holds it (``None`` for a system message, which
    two unrelated calls may share)."""
    if message.is_from("system"):
        return None
    calls = tuple(str(c.id) for c in message.tool_calls)
    result = message.tool_call_result
    answered = str(result.origin.id) if result is not None else None
    return (str(message.role.value), message.text, calls, answered)


def is_readable(message: Any) -> bool:
    """Whether the engine reads ``message``: every message but one a ``CompactionHook``
    compactor wrote, which stands for history the session holds in full."""
    return COMPACTION_META not in (message.meta or {})


def readable(messages: Sequence[Any]) -> list[Any]:
    """The call's messages the engine reads (see :func:`is_readable`)."""
    return [m for m in messages if is_readable(m)]


def to_openai(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """``messages`` as the engine reads them, one new OpenAI-style dict each (text, tool
    calls with their ids, tool results; a user message's or tool result's pictures and files
    as OpenAI content parts in order with its text)."""
    return [_entry(message) for message in messages]


def opaque(message: Any) -> bool:
    """Whether the engine cannot read ``message``: never (it reads what Haystack sends of
    it, pictures and files included)."""
    return False


def to_pending(messages: Sequence[Any]) -> Pending:
    """The call's messages as the engine reads them (see :func:`to_openai`), converted for
    this call alone. A message a ``CompactionHook`` compactor wrote is left out (see
    :func:`readable`)."""
    kept = readable(messages)
    return Pending(to_openai(kept), kept)


def prompt_text(entry: Mapping[str, Any]) -> str | None:
    """The text of a system or user message dict as :func:`to_openai` writes it (its string
    content, or the one text part among its pictures and files); None for another message,
    or one with no text."""
    if entry.get("role") not in ("system", "user"):
        return None
    content = entry.get("content")
    if isinstance(content, list):
        return next((str(p["text"]) for p in content if p.get("type") == "text"), None)
    return content if isinstance(content, str) else None


def with_prompt_text(entry: Mapping[str, Any], text: str) -> dict[str, Any]:
    """A copy of a system or user message dict that has a :func:`prompt_text`, with
    ``text`` in its place (its pictures and files kept)."""
    content = entry.get("content")
    if isinstance(content, list):
        return {
            **entry,
            "content": [{**p, "text": text} if p.get("type") == "text" else p for p in content],
        }
    return {**entry, "content": text}


def _calls(sent: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    for entry in sent:
        for call in entry.get("tool_calls") or ():
            function = call.get("function") or {}
            calls[str(call.get("id"))] = (str(function.get("name") or ""), _args(function))
    return calls


def _args(function: Mapping[str, Any]) -> dict[str, Any]:
    raw = function.get("arguments")
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _data_url(url: Any) -> tuple[str | None, str] | None:
    """The MIME type and base64 payload of a ``data:<mime>;base64,`` URL; None for another
    URL."""
    if not isinstance(url, str) or not url.startswith("data:"):
        return None
    header, found, payload = url[5:].partition(",")
    if not found or not header.endswith(";base64"):
        return None
    return header[: -len(";base64")] or None, payload


def _parts(content: Any) -> list[Any]:
    """Haystack content parts for an assembled OpenAI content-part list: text as
    ``TextContent``, a picture or file given inline (a ``data:`` URL: how Haystack sends
    them) as ``ImageContent`` / ``FileContent`` (detail, MIME type and file name kept).
    Parts Haystack cannot hold (a picture or file by URL or file id, audio: another writer of
    the session stored them) are left out."""
    from haystack.dataclasses import FileContent, ImageContent, TextContent

    parts: list[Any] = []
    for part in content if isinstance(content, list) else ():
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            parts.append(TextContent(str(part.get("text", ""))))
        elif kind == "image_url":
            image = part.get("image_url") or {}
            inline = _data_url(image.get("url"))
            if inline is not None:
                parts.append(
                    ImageContent(
                        base64_image=inline[1],
                        mime_type=inline[0],
                        detail=image.get("detail"),
                        validation=False,
                    )
                )
        elif kind == "file":
            file = part.get("file") or {}
            inline = _data_url(file.get("file_data"))
            if inline is not None:
                parts.append(
                    FileContent(
                        base64_data=inline[1],
                        mime_type=inline[0],
                        filename=file.get("filename"),
                        validation=False,
                    )
                )
    return parts


def _build(
    entry: Mapping[str, Any], calls: Mapping[str, tuple[str, dict[str, Any]]], tool_media: bool
) -> Any:
    """A new ``ChatMessage`` from one assembled OpenAI dict (a user message's pictures and
    files as Haystack parts, see :func:`_parts`; a tool result's too when ``tool_media``)."""
    from haystack.dataclasses import ChatMessage, TextContent, ToolCall

    role = str(entry.get("role"))
    content = entry.get("content")
    text = _text_of(content)
    parts = _parts(content) if role in ("user", "tool") else []
    media = any(not isinstance(part, TextContent) for part in parts)
    if role == "tool":
        call_id = str(entry.get("tool_call_id") or "")
        name, arguments = calls.get(call_id, ("tool", {}))
        origin = ToolCall(tool_name=name, arguments=arguments, id=call_id)
        return ChatMessage.from_tool(
            tool_result=parts if media and tool_media else text, origin=origin
        )
    if role == "assistant":
        tool_calls = [
            ToolCall(
                tool_name=str((call.get("function") or {}).get("name") or ""),
                arguments=_args(call.get("function") or {}),
                id=str(call.get("id")),
            )
            for call in entry.get("tool_calls") or ()
        ]
        return ChatMessage.from_assistant(text=text or None, tool_calls=tool_calls or None)
    if role == "user":
        if media:
            return ChatMessage.from_user(content_parts=parts)
        return ChatMessage.from_user(text)
    return ChatMessage.from_system(text)


_rewrites = RewriteMemo()


def _with_text(message: Any, text: str, media: bool) -> Any:
    """A copy of the app's system, user or tool ``message`` with ``text`` first (its
    pictures and files after it, kept when ``media``). Made once per message and text (see
    :class:`~ce.core.integration.RewriteMemo`)."""
    return _rewrites.copy(
        message, (text, media), functools.partial(_copy_with_text, message, text, media)
    )


def _copy_with_text(message: Any, text: str, media: bool) -> Any:
    from haystack.dataclasses import ChatMessage, TextContent

    result = message.tool_call_result
    if result is not None:
        held = () if isinstance(result.result, str) or not media else result.result
        extra = [p for p in held if not isinstance(p, TextContent)]
        return ChatMessage.from_tool(
            tool_result=[TextContent(text), *extra] if extra else text,
            origin=result.origin,
            error=result.error,
            meta=dict(message.meta),
        )
    if message.is_from("user"):
        extra = [*message.images, *message.files] if media else []
        if extra:
            return ChatMessage.from_user(
                content_parts=[text, *extra], meta=dict(message.meta), name=message.name
            )
        return ChatMessage.from_user(text, meta=dict(message.meta), name=message.name)
    return ChatMessage.from_system(text, meta=dict(message.meta), name=message.name)


def _unchanged_since(pending: Pending, source: int) -> bool:
    """Whether the app message ``source`` still reads as the history ``pending`` comes from
    holds it (the app may have changed it in place since it was converted)."""
    history = pending.history
    return history is None or history.unchanged(
        source, pending.messages[source], lambda m: to_openai([m])[0]
    )


def from_sent(
    sent: Sequence[Mapping[str, Any]], pending: Pending, tool_media: bool = True
) -> list[Any]:
    """The ``ChatMessage`` list holding the engine's input ``sent`` for a call whose own
    messages are ``pending`` (see the module docstring). With the history ``pending`` comes
    from, an app message that would go as it is but was changed in place since it was
    converted goes as ``sent`` has it. ``tool_media``: whether a tool result built from
    ``sent`` keeps its pictures and files (false for a generator that takes none in tool
    messages: Haystack's Chat Completions form refuses them); it then goes as its text."""
    calls = _calls(sent)
    origins = reconcile_openai(pending.dicts, sent, history=pending.history)
    out: list[Any] = []
    for entry, where in zip(sent, origins, strict=True):
        if where.source is None or (
            where.text is None and not _unchanged_since(pending, where.source)
        ):
            out.append(_build(entry, calls, tool_media))
        elif where.text is None:
            out.append(pending.messages[where.source])
        else:
            out.append(_with_text(pending.messages[where.source], where.text, where.media))
    return out


def tool_schemas(tools: Any) -> list[dict[str, Any]] | None:
    """The OpenAI-style schemas of a call's ``tools`` (Tools and Toolsets), if any."""
    if not tools:
        return None
    schemas: list[dict[str, Any]] = []
    for item in _flat(tools):
        spec = getattr(item, "tool_spec", None)
        if isinstance(spec, Mapping):
            schemas.append({"type": "function", "function": dict(spec)})
    return schemas or None


def _flat(tools: Any) -> Iterable[Any]:
    for item in tools:
        if hasattr(item, "tool_spec"):
            yield item
        elif isinstance(item, Iterable):
            yield from _flat(item)


def normalise_usage(usage: Any) -> tuple[int, int]:
    """``(prompt, completion)`` tokens from a reply's ``meta["usage"]``: OpenAI's
    ``prompt_tokens`` / ``completion_tokens`` and Anthropic's ``input_tokens`` /
    ``output_tokens`` (a dict, as Haystack's generators write it, or an object)."""
    if usage is None:
        return 0, 0

    def read(*names: str) -> int:
        for name in names:
            value = usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return int(value)
        return 0

    return read("prompt_tokens", "input_tokens"), read("completion_tokens", "output_tokens")


def reply_text(reply: Any) -> str:
    """The text of a reply (its text parts joined)."""
    return "\n".join(t for t in reply.texts if t)


def reply_to_message(reply: Any, agent: str | None, provider: str, model: str) -> Message | None:
    """The model's reply as the neutral assistant :class:`Message` the engine commits,
    written by ``agent``; ``None`` when it has neither text nor tool calls."""
    text = reply_text(reply)
    calls = reply.tool_calls
    if not text and not calls:
        return None
    entry: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        entry["tool_calls"] = [
            {
                "id": str(call.id),
                "type": "function",
                "function": {
                    "name": call.tool_name,
                    "arguments": json.dumps(call.arguments, ensure_ascii=False, default=str),
                },
            }
            for call in calls
        ]
    author = agent_author(agent) if agent else None
    return message_from_openai(entry, author).model_copy(
        update={"invocation": ModelInvocation(provider=provider or "unknown", model=model)}
    )


def _snake(key: str) -> str:
    key = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key)
    return re.sub(r"[^a-z0-9_]+", "_", key.lower()).strip("_") or "key"


def _small(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= _SMALL
    return isinstance(value, (int, float, bool))


def hits_from_documents(documents: Any) -> list[RetrievalHit]:
    """Haystack ``Document`` objects as retrieval hits: content, the source in ``meta`` (else
    the document's id), score, id, and the document's small scalar metadata."""
    hits: list[RetrievalHit] = []
    for doc in documents or ():
        content = getattr(doc, "content", None)
        if not isinstance(content, str) or not content:
            continue
        meta = getattr(doc, "meta", None) or {}
        doc_id = getattr(doc, "id", None)
        uri = next((str(meta[k]) for k in _URI_KEYS if meta.get(k)), "")
        metadata = {_snake(str(k)): v for k, v in meta.items() if k not in _URI_KEYS and _small(v)}
        score = getattr(doc, "score", None)
        hits.append(
            RetrievalHit(
                content=content,
                uri=uri or f"haystack://document/{doc_id}",
                score=float(score) if isinstance(score, (int, float)) else None,
                doc_id=str(doc_id) if doc_id is not None else None,
                metadata=metadata,
            )
        )
    return hits


def documents_in(values: Iterable[Any]) -> list[Any]:
    """The Haystack ``Document`` objects among a component's input or output values: a
    document, a list of them, or a list of such lists (a variadic input, as a joiner takes)."""
    from haystack import Document

    found: list[Any] = []
    for value in values:
        if isinstance(value, Document):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, Document):
                    found.append(item)
                elif isinstance(item, (list, tuple)):
                    found.extend(d for d in item if isinstance(d, Document))
    return found


def gives_documents(output_spec: Any, output: Mapping[str, Any]) -> bool:
    """Whether a component gives documents out (an output socket typed with ``Document``:
    a retriever, a ranker, a filter, a joiner), as its span's ``output_spec`` says, else as
    its ``output`` holds some; a prompt builder, a writer, an answer builder do not."""
    if isinstance(output_spec, Mapping):
        return any(
            isinstance(socket, Mapping) and _DOCUMENT_TYPE.search(str(socket.get("type", "")))
            for socket in output_spec.values()
        )
    return bool(documents_in(output.values()))
