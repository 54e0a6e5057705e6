"""Conversion of provider-neutral message parts to and from provider wire formats.

``to_openai_messages`` / ``from_openai_messages`` speak the OpenAI chat-completions message
format; ``to_anthropic_messages`` builds the ``system`` + ``messages`` of an Anthropic Messages
request. Both expect parts shaped as :func:`ce.core.state.render_live_context` produces them:
every assistant part with tool calls directly followed by one tool part per call.

Images, files and audio (a part's ``parts``) go through in order with the text: OpenAI's
``image_url`` / ``file`` / ``input_audio`` content parts are read into them and written back;
Anthropic gets ``image`` / ``document`` blocks, Gemini ``inlineData`` / ``fileData`` parts (see
each converter for remote URLs and what a provider cannot take).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ce.core.schema import (
    AudioPart,
    ContentPart,
    FilePart,
    ImagePart,
    MessagePart,
    Role,
    TextPart,
    ToolCallRequest,
)
from ce.core.schema._enums import ROLE_TEXT
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

    A part with images, files or audio gets a list of content parts, in its order:
    ``{"type": "text", "text"}`` for its text (left out when empty), ``{"type": "image_url",
    "image_url": {"url", "detail"}}`` (``detail`` only when not ``auto``), ``{"type": "file",
    "file": {"file_data" | "file_id", "filename"}}`` and ``{"type": "input_audio",
    "input_audio": {"data", "format"}}``; a file by URL as ``{"type": "file", "file":
    {"file_url"}}`` (the Responses API's field: the chat API takes no file by URL, and
    :func:`ce.core.testing.payloads.openai_problems` says so). A text-only part keeps a string
    content.
    """
    out: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        message: dict[str, Any]
        if part.role is Role.TOOL:
            if not part.tool_call_id:
                raise ValueError(f"parts[{index}]: a tool part needs a tool_call_id")
            message = {"role": "tool", "tool_call_id": part.tool_call_id, "content": part.content}
            if part.parts:
                message["content"] = _openai_content(part)
        elif part.role is Role.ASSISTANT and part.tool_calls:
            message = {
                "role": "assistant",
                "content": (_openai_content(part) if part.parts else part.content) or None,
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
            content = _openai_content(part) if part.parts else part.content
            message = {"role": ROLE_TEXT[part.role], "content": content}
        if part.name and part.role in (Role.USER, Role.ASSISTANT):
            message["name"] = part.name
        out.append(message)
    return out


def _in_order(part: MessagePart) -> list[ContentPart | str]:
    """A part's content in order: its text (where its ``TextPart`` is, else first; left out
    when empty) and its media parts."""
    media = part.parts or ()
    out: list[ContentPart | str] = []
    placed = False
    for item in media:
        if isinstance(item, TextPart):
            if not placed and part.content:
                out.append(part.content)
            placed = True
        else:
            out.append(item)
    if not placed and part.content:
        out.insert(0, part.content)
    return out


def _openai_media(item: ContentPart) -> dict[str, Any]:
    if isinstance(item, ImagePart):
        image: dict[str, Any] = {"url": item.url}
        if item.detail != "auto":
            image["detail"] = item.detail
        return {"type": "image_url", "image_url": image}
    if isinstance(item, AudioPart):
        return {"type": "input_audio", "input_audio": {"data": item.data, "format": item.format}}
    assert isinstance(item, FilePart)
    file: dict[str, Any]
    if item.url:
        file = {"file_url": item.url}
    elif item.data:
        file = {"file_data": item.data}
    else:
        file = {"file_id": item.file_id}
    if item.filename:
        file["filename"] = item.filename
    return {"type": "file", "file": file}


def _openai_content(part: MessagePart) -> list[dict[str, Any]]:
    return [
        {"type": "text", "text": item} if isinstance(item, str) else _openai_media(item)
        for item in _in_order(part)
    ]


def _openai_part(item: Mapping[str, Any], where: str) -> ContentPart | None:
    """The media part of one OpenAI content part (chat or Responses form), ``None`` for a
    kind that is neither text nor media (refusal…); malformed media raises ValueError."""
    kind = item.get("type")
    try:
        if kind in ("image_url", "input_image"):
            image = item.get("image_url")
            detail = item.get("detail")
            if isinstance(image, Mapping):
                detail = image.get("detail", detail)
                image = image.get("url")
            if image is None and item.get("file_id"):
                return None  # a Responses image by file id: no URL to hold, left out
            if not isinstance(image, str):
                raise ValueError("an image part needs an image_url url")
            return ImagePart(url=image, detail=detail or "auto")
        if kind == "input_audio":
            audio = item.get("input_audio")
            if not isinstance(audio, Mapping):
                raise ValueError("an input_audio part needs input_audio data and format")
            return AudioPart(data=audio.get("data"), format=audio.get("format"))
        if kind in ("file", "input_file"):
            file = item.get("file") if kind == "file" else item
            if not isinstance(file, Mapping):
                raise ValueError("a file part needs a file")
            return FilePart(
                data=file.get("file_data"),
                file_id=file.get("file_id"),
                url=file.get("file_url"),
                filename=file.get("filename"),
            )
    except ValueError as exc:  # pydantic's ValidationError included
        raise ValueError(f"{where}: malformed {kind} part: {exc}") from None
    return None


def _openai_content_parts(content: Any, where: str) -> tuple[str, list[ContentPart] | None]:
    """The text of an OpenAI message content and its media parts in order (``None``: no
    media; the text's place is a ``TextPart`` where its first piece was)."""
    if content is None:
        return "", None
    if isinstance(content, str):
        return content, None
    if not isinstance(content, list):
        raise ValueError(f"{where}: content must be a string, a list of parts or null")
    texts: list[str] = []
    parts: list[ContentPart] = []
    text_at: int | None = None
    for index, item in enumerate(content):
        if isinstance(item, str):
            text = item
        elif isinstance(item, Mapping) and item.get("type") in _TEXT_PART_TYPES:
            text = str(item.get("text", ""))
        elif isinstance(item, Mapping):
            media = _openai_part(item, f"{where}.content[{index}]")
            if media is not None:
                parts.append(media)
            continue
        else:
            continue
        texts.append(text)
        if text_at is None:
            text_at = len(parts)
    if not parts:
        return "\n".join(texts), None
    if text_at is not None and any(texts):
        parts.insert(text_at, TextPart())
    return "\n".join(texts), parts


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
    or a list of parts, whose text parts are joined with newlines; its images
    (``image_url``, ``input_image``), files (``file``, ``input_file``) and audio
    (``input_audio``) become the part's ``parts``, in order with the text (a malformed one
    raises :class:`ValueError`; a system message's are left out, as other kinds of parts).
    Tool-call arguments are parsed (``parse_error`` when they are not a JSON object); a tool
    message takes its ``name`` from the call it answers. An unknown role or a malformed tool
    call raises :class:`ValueError`.
    """
    names: dict[str, str] = {}
    parts: list[MessagePart] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role")
        content, media = _openai_content_parts(message.get("content"), where)
        name = message.get("name") if isinstance(message.get("name"), str) else None
        if role in ("system", "developer"):
            parts.append(MessagePart(role=Role.SYSTEM, content=content))
        elif role == "user":
            parts.append(MessagePart(role=Role.USER, content=content, name=name, parts=media))
        elif role == "assistant":
            calls = [
                _openai_call(call, f"{where}.tool_calls[{i}]")
                for i, call in enumerate(message.get("tool_calls") or ())
            ]
            names.update((call.tool_call_id, call.name) for call in calls)
            parts.append(
                MessagePart(
                    role=Role.ASSISTANT,
                    content=content,
                    tool_calls=calls or None,
                    name=name,
                    parts=media,
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
                    parts=media,
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


def _data_url(url: str) -> tuple[str, str] | None:
    """``(mime type, base64 data)`` of a base64 ``data:`` URL, else None."""
    if not url.startswith("data:"):
        return None
    header, _, data = url[5:].partition(",")
    if not header.endswith(";base64"):
        return None
    return header.split(";", 1)[0], data


def _anthropic_source(url: str) -> dict[str, Any]:
    inline = _data_url(url)
    if inline is None:
        return {"type": "url", "url": url}
    return {"type": "base64", "media_type": inline[0], "data": inline[1]}


def _anthropic_media(item: ContentPart) -> dict[str, Any] | None:
    if isinstance(item, ImagePart):
        return {"type": "image", "source": _anthropic_source(item.url)}
    if isinstance(item, FilePart):
        if item.file_id:
            source: dict[str, Any] = {"type": "file", "file_id": item.file_id}
        else:
            source = _anthropic_source(item.data or item.url or "")
        block: dict[str, Any] = {"type": "document", "source": source}
        if item.filename:
            block["title"] = item.filename
        return block
    return None  # audio: Anthropic takes none


def _anthropic_content(part: MessagePart) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for item in _in_order(part):
        if isinstance(item, str):
            if item.strip():
                blocks.append({"type": "text", "text": item})
        elif (block := _anthropic_media(item)) is not None:
            blocks.append(block)
    return blocks


def _anthropic_blocks(part: MessagePart) -> list[dict[str, Any]]:
    if part.role is Role.TOOL:
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": part.tool_call_id}
        if part.parts:
            block["content"] = _anthropic_content(part)
        elif part.content:
            block["content"] = part.content
        if part.is_error:
            block["is_error"] = True
        return [block]
    blocks: list[dict[str, Any]] = []
    if part.parts:
        blocks.extend(_anthropic_content(part))
    elif part.content.strip():
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
    message after it, before any user text. Images become ``image`` blocks and files
    ``document`` blocks (``title`` from the filename), in order with the text: a ``data:`` URL
    as a ``base64`` source (its media type and data), a remote URL as a ``url`` source, a
    provider file id as a ``file`` source; a tool result with media gets a list ``content``.
    Anthropic takes no audio: audio parts are left out. Blank texts are left out and messages
    without blocks dropped; a placeholder user text (:data:`ANTHROPIC_PLACEHOLDER_TEXT`) is inserted
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


_GEMINI_REMOTE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".pdf": "application/pdf",
}


def _gemini_media(item: ContentPart) -> dict[str, Any]:
    if isinstance(item, AudioPart):
        return {"inlineData": {"mimeType": f"audio/{item.format}", "data": item.data}}
    if isinstance(item, ImagePart):
        url, default = item.url, "image/jpeg"
    else:
        assert isinstance(item, FilePart)
        url, default = item.data or item.url or item.file_id or "", "application/pdf"
    inline = _data_url(url)
    if inline is not None:
        return {"inlineData": {"mimeType": inline[0], "data": inline[1]}}
    path = url.split("?", 1)[0].lower()
    suffix = path[path.rfind(".") :] if "." in path.rsplit("/", 1)[-1] else ""
    return {"fileData": {"mimeType": _GEMINI_REMOTE_TYPES.get(suffix, default), "fileUri": url}}


def _gemini_parts(part: MessagePart, names: dict[str, str]) -> list[dict[str, Any]]:
    if part.role is Role.TOOL:
        name = part.name or names.get(part.tool_call_id or "", "") or "tool"
        response: dict[str, Any] = {"content": part.content}
        if part.is_error:
            response = {"error": part.content}
        return [{"functionResponse": {"name": name, "response": response}}]
    out: list[dict[str, Any]] = []
    if part.parts:
        for item in _in_order(part):
            if not isinstance(item, str):
                out.append(_gemini_media(item))
            elif item.strip():
                out.append({"text": item})
    elif part.content.strip():
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
    any user text. Images, files and audio go in order with the text: a ``data:`` URL as
    ``inlineData`` (``mimeType``, ``data``), audio as ``inlineData`` of ``audio/<format>``, a
    remote URL or file id as ``fileData`` (``fileUri``; ``mimeType`` from the URL's extension,
    else ``image/jpeg`` for an image, ``application/pdf`` for a file). A tool result's media
    are left out (a ``functionResponse`` holds JSON). Blank texts are left out; a placeholder
    user text (:data:`ANTHROPIC_PLACEHOLDER_TEXT`) opens the contents when the model would
    speak first."""
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
