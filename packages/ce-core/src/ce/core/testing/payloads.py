"""Checks of a model request against each provider's conversation convention, for tests and
the payload fuzz benchmark: each returns the problems found (empty when valid).

- OpenAI chat: every ``tool`` message answers a call of the assistant message before it (no
  other message in between but that call's results), every call is answered, ids are unique.
- Anthropic Messages: ``system`` separate; roles alternate ``user`` / ``assistant``, starting
  with ``user``; each ``tool_use`` is answered by a ``tool_result`` in the very next user
  message, whose result blocks come before any text; no result without its ``tool_use``.
- Gemini ``contents``: roles alternate ``user`` / ``model``, starting with ``user``; each
  ``functionCall`` of a model turn is answered by a ``functionResponse`` of the same name in
  the next user turn, as many as there were calls.

Media: an OpenAI content-part list holds only known part types, each with its payload
(``image_url.url``, ``input_audio`` data and format, ``file`` data or id), and media only in
user messages (the chat API takes text only from system, assistant and tool messages); an
Anthropic ``image`` / ``document`` block (a tool result's too) has a ``base64`` source with its
media type and data, or a ``url`` / ``file`` source; a Gemini ``inlineData`` part has a
``mimeType`` and ``data``, a ``fileData`` part a ``mimeType`` and ``fileUri``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ce.core.formats import AnthropicRequest, GeminiRequest

__all__ = ["anthropic_problems", "gemini_problems", "openai_problems"]


def _openai_part_problem(part: Any) -> str | None:
    if not isinstance(part, Mapping):
        return "a content part is not an object"
    kind = part.get("type")
    if kind == "text":
        return None if isinstance(part.get("text"), str) else "a text part without text"
    if kind == "image_url":
        image = part.get("image_url")
        ok = isinstance(image, Mapping) and isinstance(image.get("url"), str) and image["url"]
        return None if ok else "an image_url part without a url"
    if kind == "input_audio":
        audio = part.get("input_audio")
        ok = isinstance(audio, Mapping) and audio.get("data") and audio.get("format")
        return None if ok else "an input_audio part without data and format"
    if kind == "file":
        file = part.get("file")
        ok = isinstance(file, Mapping) and (file.get("file_data") or file.get("file_id"))
        return None if ok else "a file part without file_data or file_id"
    return f"an unknown content part type {kind!r}"


def _openai_content_problems(index: int, message: Mapping[str, Any]) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    problems = [
        f"[{index}] {problem}"
        for problem in map(_openai_part_problem, content)
        if problem is not None
    ]
    media = [p for p in content if isinstance(p, Mapping) and p.get("type") != "text"]
    if media and message.get("role") != "user":
        problems.append(f"[{index}] {message.get('role')} message with media parts")
    return problems


def openai_problems(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    problems: list[str] = []
    seen: set[str] = set()
    open_calls: set[str] = set()
    for index, message in enumerate(messages):
        problems += _openai_content_problems(index, message)
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in open_calls:
                problems.append(f"[{index}] tool result {call_id!r} answers no pending call")
            open_calls.discard(str(call_id))
            continue
        if open_calls:
            problems.append(f"[{index}] {role} message before results of {sorted(open_calls)}")
            open_calls = set()
        if role == "assistant":
            for call in message.get("tool_calls") or ():
                call_id = call.get("id")
                if call_id in seen:
                    problems.append(f"[{index}] tool call id {call_id!r} used twice")
                seen.add(call_id)
                open_calls.add(call_id)
    if open_calls:
        problems.append(f"calls never answered: {sorted(open_calls)}")
    return problems


def _alternation(roles: Sequence[str], first: str, name: str) -> list[str]:
    problems = []
    if roles and roles[0] != first:
        problems.append(f"{name}: the first turn is {roles[0]!r}, not {first!r}")
    for index in range(1, len(roles)):
        if roles[index] == roles[index - 1]:
            problems.append(f"{name}: turns {index - 1} and {index} are both {roles[index]!r}")
    return problems


def _anthropic_source_problem(block: Mapping[str, Any]) -> str | None:
    source = block.get("source")
    if not isinstance(source, Mapping):
        return f"a {block['type']} block without a source"
    kind = source.get("type")
    if kind == "base64":
        ok = source.get("media_type") and source.get("data")
        return None if ok else f"a base64 {block['type']} source without media_type and data"
    if kind == "url":
        return None if source.get("url") else f"a url {block['type']} source without a url"
    if kind == "file":
        return None if source.get("file_id") else f"a file {block['type']} source without an id"
    return f"a {block['type']} source of unknown type {kind!r}"


def _anthropic_media_problems(index: int, blocks: Sequence[Mapping[str, Any]]) -> list[str]:
    problems = []
    for block in blocks:
        inner = block.get("content") if block["type"] == "tool_result" else None
        for item in [block, *(inner if isinstance(inner, list) else ())]:
            if item["type"] in ("image", "document"):
                problem = _anthropic_source_problem(item)
                if problem is not None:
                    problems.append(f"anthropic [{index}] {problem}")
    return problems


def anthropic_problems(request: AnthropicRequest) -> list[str]:
    messages = request.messages
    problems = _alternation([m["role"] for m in messages], "user", "anthropic")
    pending: set[str] = set()
    for index, message in enumerate(messages):
        blocks = message["content"]
        problems += _anthropic_media_problems(index, blocks)
        if not blocks:
            problems.append(f"anthropic [{index}] has no content blocks")
        if message["role"] == "user":
            results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            if set(results) != pending or len(results) != len(set(results)):
                problems.append(
                    f"anthropic [{index}] answers {sorted(results)}, expected {sorted(pending)}"
                )
            kinds = [b["type"] == "tool_result" for b in blocks]
            if kinds != sorted(kinds, reverse=True):
                problems.append(f"anthropic [{index}] has text before tool results")
            pending = set()
        else:
            if pending:
                problems.append(f"anthropic [{index}] follows unanswered {sorted(pending)}")
            pending = {b["id"] for b in blocks if b["type"] == "tool_use"}
    if pending:
        problems.append(f"anthropic: tool uses never answered: {sorted(pending)}")
    return problems


def gemini_problems(request: GeminiRequest) -> list[str]:
    contents = request.contents
    problems = _alternation([c["role"] for c in contents], "user", "gemini")
    pending: Counter[str] = Counter()
    for index, content in enumerate(contents):
        parts = content["parts"]
        if not parts:
            problems.append(f"gemini [{index}] has no parts")
        for part in parts:
            for key, fields in (
                ("inlineData", ("mimeType", "data")),
                ("fileData", ("mimeType", "fileUri")),
            ):
                value = part.get(key)
                if value is not None and not all(value.get(f) for f in fields):
                    problems.append(f"gemini [{index}] a {key} part without {' and '.join(fields)}")
        if content["role"] == "user":
            answered = Counter(
                p["functionResponse"]["name"] for p in parts if "functionResponse" in p
            )
            if answered != pending:
                problems.append(
                    f"gemini [{index}] answers {dict(answered)}, expected {dict(pending)}"
                )
            pending = Counter()
        else:
            if pending:
                problems.append(f"gemini [{index}] follows unanswered calls {dict(pending)}")
            pending = Counter(p["functionCall"]["name"] for p in parts if "functionCall" in p)
    if pending:
        problems.append(f"gemini: calls never answered: {dict(pending)}")
    return problems
