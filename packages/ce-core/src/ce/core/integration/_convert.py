"""Assembled input and neutral messages <-> OpenAI-style chat message dicts."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ce.core.formats import from_openai_messages, to_openai_messages
from ce.core.integration._reconcile import Key, SentMessages, openai_key
from ce.core.schema import AssembledInput, Author, Message, MessagePart, Role

__all__ = [
    "assembled_to_openai",
    "content_with_media",
    "message_from_openai",
    "message_from_part",
    "openai_to_messages",
]


_PARTS_MAX = 8192
# Each assembled part's OpenAI message, reconcile key, whether that message is flat (string
# content, no tool calls: a shallow copy is the caller's own) and author, by the part object:
# the engine keeps the renderings of the history it sends, so a kept message is the same part
# on every call.
_parts: dict[int, tuple[MessagePart, dict[str, Any], Key, bool, Author | None]] = {}
_parts_lock = threading.Lock()


def assembled_to_openai(assembled: AssembledInput) -> SentMessages:
    """The OpenAI chat messages the model receives for ``assembled`` (see
    :func:`ce.core.formats.to_openai_messages`), fresh dicts, with their reconcile keys and
    authors (a :class:`~ce.core.integration.SentMessages`). A part converted before is not
    converted again."""
    messages: list[dict[str, Any]] = []
    keys: list[Key] = []
    authors: list[Author | None] = []
    for part in assembled.parts:
        held = _parts.get(id(part))
        if held is None or held[0] is not part:
            (message,) = to_openai_messages([part])
            flat = isinstance(message["content"], str) and "tool_calls" not in message
            held = (part, message, openai_key(message), flat, part.author)
            with _parts_lock:
                if len(_parts) >= _PARTS_MAX:
                    _parts.clear()
                _parts[id(part)] = held
        # a copy is the caller's own: a shallow one of a flat message
        messages.append(held[1].copy() if held[3] else _copied(held[1]))
        keys.append(held[2])
        authors.append(held[4])
    return SentMessages(messages, keys, authors)


def content_with_media(
    text: str, parts: Iterable[Mapping[str, Any] | None]
) -> str | list[dict[str, Any]]:
    """A framework message's OpenAI content as the engine reads it: ``text`` (its text
    parts joined) alone, or, when ``parts`` (the message's parts in order: an OpenAI media
    part, or ``None`` for a text part) hold pictures, files or audio, those parts in order
    with one text part holding ``text`` where the first text part was (none when ``text``
    is empty)."""
    media: list[dict[str, Any]] = []
    text_at: int | None = None
    for part in parts:
        if part is None:
            if text_at is None:
                text_at = len(media)
        else:
            media.append(dict(part))
    if not media:
        return text
    if text:
        media.insert(text_at or 0, {"type": "text", "text": text})
    return media


def _copied(value: Any) -> Any:
    """A copy of an OpenAI message's value, its dicts and lists copied at every depth."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    return value


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
        parts=part.parts,
    )


_CACHE_MAX = 8192
# Converted messages by what identifies them: a framework passes its whole history again on
# every call, so each message is converted (and validated) once. Strings cache their hash.
_converted: dict[tuple[Any, ...], Message] = {}
_converted_lock = threading.Lock()


def _cache_key(message: Mapping[str, Any]) -> tuple[Any, ...] | None:
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        return None  # a list of parts: not worth keying
    calls = message.get("tool_calls")
    call_key: tuple[Any, ...] = ()
    if calls:
        try:
            call_key = tuple(
                (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls
            )
            hash(call_key)
        except (KeyError, TypeError):
            return None
    name, call_id = message.get("name"), message.get("tool_call_id")
    if not isinstance(name, (str, type(None))) or not isinstance(call_id, (str, type(None))):
        return None
    return (message.get("role"), content, name, call_id, call_key)


def openai_to_messages(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Pending messages for ``engine.prepare_call`` from OpenAI chat message dicts: system
    (and developer), user, assistant with ``tool_calls``, tool with ``tool_call_id``;
    content as a string, null or a list of parts (text, and images, files and audio, which
    the message keeps as its ``parts``). Malformed input raises
    :class:`ValueError` (see :func:`ce.core.formats.from_openai_messages`).

    A message met before (same role, content, name and tool ids) is converted once: the
    same :class:`Message` object comes back, so treat the result as read-only."""
    keys = [_cache_key(m) for m in messages]
    out: list[Message | None] = [_converted.get(k) if k is not None else None for k in keys]
    made = [i for i, m in enumerate(out) if m is None]
    for i in made:
        out[i] = _plain(messages[i])
    missing = [i for i in made if out[i] is None]
    if len(missing) == len(out):
        out = [message_from_part(p) for p in from_openai_messages(messages)]
    elif missing:
        try:
            parts = from_openai_messages([messages[i] for i in missing])
        except ValueError:
            from_openai_messages(messages)  # raise with the message's real position
            raise
        names = {c.tool_call_id: c.name for m in out if m is not None for c in m.tool_calls or ()}
        for i, part in zip(missing, parts, strict=True):
            if part.role is Role.TOOL and part.name is None and part.tool_call_id in names:
                part = part.model_copy(update={"name": names[part.tool_call_id]})
            out[i] = message_from_part(part)
    if made:
        with _converted_lock:
            if len(_converted) > _CACHE_MAX:
                _converted.clear()
            for i in made:
                key = keys[i]
                message = out[i]
                if key is not None and message is not None:
                    _converted[key] = message
    return [m for m in out if m is not None]


_PLAIN_ROLES = {"assistant": Role.ASSISTANT, "user": Role.USER, "system": Role.SYSTEM}


def _plain(message: Mapping[str, Any], author: Author | None = None) -> Message | None:
    """The :class:`Message` of a dict of a role and text alone (most of a conversation, a
    model's reply): what reading it into parts makes, made at once; None for any other."""
    role = _PLAIN_ROLES.get(message.get("role"))  # type: ignore[arg-type]
    content = message.get("content")
    if role is None or not isinstance(content, str) or len(message) != 2:
        return None
    return Message(role=role, content=content, author=author)


def message_from_openai(message: Mapping[str, Any], author: Author | None = None) -> Message:
    """One OpenAI chat message dict as a :class:`Message` written by ``author`` (for
    multi-agent frameworks, the agent that wrote it)."""
    plain = _plain(message, author)
    if plain is not None:
        return plain
    (part,) = from_openai_messages([message])
    return message_from_part(part, author)
