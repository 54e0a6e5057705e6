"""AutoGen model messages <-> the engine's neutral messages (through OpenAI-style dicts).

One agent's view of a conversation is not another's: AutoGen hands an agent its own replies as
``AssistantMessage(source=<agent>)`` and a team peer's reply as ``UserMessage(source=<peer>)``.
The session of a team holds each reply once, as the assistant message of the agent that wrote
it (``author``: kind agent, the agent's name). So :func:`to_pending` gives the engine a peer's
message as the assistant message it is in the session (recorded once, with the peer as
author), and :func:`from_sent` turns the engine's input back into the calling agent's view: a
peer's message is a user message named after the peer again, never the agent's own assistant
turn, and a peer's tool calls (with their results) are left out, as AutoGen leaves them out.

``HeadAndTailChatCompletionContext``'s "Skipped N messages." placeholder is left out: the
session holds what it stands for.

System messages: the agent's own system message (prepended by AutoGen outside the model
context) is the call's instruction; other system messages of the model context are joined to
it, except those a memory added (``_record`` notes them): the memory's hits are recorded as
evidence and reach the model once, in the engine's context.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autogen_core import FunctionCall, Image
from autogen_core.models import (
    AssistantMessage,
    CreateResult,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    SystemMessage,
    UserMessage,
)

from ce.core.integration import message_from_openai, reconcile_openai
from ce.core.schema import Author, AuthorKind, Message, ModelInvocation

__all__ = [
    "Pending",
    "from_sent",
    "redacted_natively",
    "reply_text",
    "reply_to_message",
    "to_pending",
    "tool_schemas",
]


_SKIPPED = re.compile(r"Skipped \d+ messages\.")
"""``HeadAndTailChatCompletionContext``'s placeholder for the messages it left out."""


@functools.lru_cache(maxsize=4096)
def agent_author(name: str) -> Author:
    """The author of what agent ``name`` wrote (one shared, read-only object per name)."""
    return Author(kind=AuthorKind.AGENT, id=name)


@functools.lru_cache(maxsize=4096)
def user_author(name: str) -> Author:
    """The author of what the user (or a user proxy) named ``name`` wrote."""
    return Author(kind=AuthorKind.USER, id=name)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part for part in content if isinstance(part, str))
    return ""


def _has_media(content: Any) -> bool:
    return isinstance(content, list) and any(not isinstance(p, str) for p in content)


def _call_dict(call: FunctionCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments or "{}"},
    }


@dataclass
class Pending:
    """An agent's messages as the engine's pending messages: ``dicts`` (OpenAI-style),
    ``authors`` (one per dict), ``origins`` (the index of the AutoGen message each dict
    comes from), ``opaque`` (dicts whose message carries media the engine cannot read),
    ``errors`` (tool call id -> whether its result is an error) and ``names`` (tool call id
    -> tool name)."""

    dicts: list[dict[str, Any]] = field(default_factory=list)
    authors: list[Author | None] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)
    opaque: set[int] = field(default_factory=set)
    errors: dict[str, bool] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    merged_system: bool = False

    def add(self, entry: dict[str, Any], author: Author | None, origin: int) -> None:
        self.dicts.append(entry)
        self.authors.append(author)
        self.origins.append(origin)


def to_pending(
    messages: Sequence[LLMMessage],
    agent: str,
    peers: Collection[str],
    memory_texts: Collection[str] = (),
) -> Pending:
    """``messages`` (the list an agent's model call sends) as the engine's pending messages,
    from ``agent``'s view (see the module docstring); ``peers`` are the names of the other
    agents of its team, ``memory_texts`` the system messages memories added."""
    pending = Pending()
    system: list[tuple[int, str]] = []
    for index, message in enumerate(messages):
        if isinstance(message, SystemMessage):
            if message.content not in memory_texts:
                system.append((index, message.content))
        elif isinstance(message, UserMessage):
            text = _text(message.content)
            if message.source == "System" and _SKIPPED.fullmatch(text):
                continue  # HeadAndTail's placeholder for what it cut: the session has it
            peer = message.source in peers and message.source != agent
            if peer and not _has_media(message.content):
                pending.add(
                    {"role": "assistant", "content": text}, agent_author(message.source), index
                )
                continue
            author = user_author(message.source or "user")
            if _has_media(message.content):
                pending.opaque.add(len(pending.dicts))
            pending.add({"role": "user", "content": text}, author, index)
        elif isinstance(message, AssistantMessage):
            entry: dict[str, Any] = {"role": "assistant"}
            if isinstance(message.content, list):
                calls = [c for c in message.content if isinstance(c, FunctionCall)]
                entry["content"] = message.thought or None
                entry["tool_calls"] = [_call_dict(c) for c in calls]
                pending.names.update((c.id, c.name) for c in calls)
            else:
                entry["content"] = message.content
            pending.add(entry, agent_author(message.source or agent), index)
        elif isinstance(message, FunctionExecutionResultMessage):
            for result in message.content:
                pending.errors[result.call_id] = bool(result.is_error)
                pending.names.setdefault(result.call_id, result.name)
                pending.add(
                    {"role": "tool", "tool_call_id": result.call_id, "content": result.content},
                    None,
                    index,
                )
        else:  # a message type of a later AutoGen: the engine cannot read it
            raise TypeError(f"unsupported AutoGen message type {type(message).__name__}")
    if system:
        pending.merged_system = len(system) > 1
        head = {"role": "system", "content": "\n\n".join(text for _, text in system)}
        pending.dicts.insert(0, head)
        pending.authors.insert(0, None)
        pending.origins.insert(0, system[0][0])
        pending.opaque = {i + 1 for i in pending.opaque}
    return pending


def _with_text(original: LLMMessage, text: str) -> LLMMessage:
    """A copy of ``original`` with its text replaced (a user message's images kept)."""
    if isinstance(original, UserMessage) and isinstance(original.content, list):
        media = [p for p in original.content if not isinstance(p, str)]
        content: list[str | Image] = [text, *media] if text else list(media)
        return original.model_copy(update={"content": content})
    return original.model_copy(update={"content": text})


class AuthorLookup:
    """Who wrote an assistant message the engine assembled that is not among the agent's
    own pending messages (history from the store): by its text or its tool call ids."""

    def __init__(self, texts: Mapping[str, str], calls: Mapping[str, str]) -> None:
        self.texts = texts
        self.calls = calls

    def author(self, text: str, call_ids: Sequence[str]) -> str | None:
        for call_id in call_ids:
            if call_id in self.calls:
                return self.calls[call_id]
        return self.texts.get(text) if text else None


def from_sent(
    sent: Sequence[Mapping[str, Any]],
    messages: Sequence[LLMMessage],
    pending: Pending,
    agent: str,
    peers: Collection[str],
    lookup: AuthorLookup | None = None,
) -> list[LLMMessage]:
    """The AutoGen messages ``agent``'s model call sends for the engine's input ``sent``,
    through the kit's reconciler (:func:`ce.core.integration.reconcile_openai`): a message
    the engine left as it was is the app's very object; a system, user or tool message whose
    text alone the engine changed is a copy of it with the new text (images kept); the rest
    is built anew, from ``agent``'s view (see the module docstring)."""
    origins = reconcile_openai(pending.dicts, sent, pending.opaque)
    out: list[LLMMessage] = []
    results: list[FunctionExecutionResult] = []
    unchanged: list[int | None] = []  # per result: the pending dict it is unchanged from
    dropped: set[str] = set()

    def flush() -> None:
        if not results:
            return
        # all the results of one app message, unchanged and in order: the app's own object
        first = unchanged[0]
        original = messages[pending.origins[first]] if first is not None else None
        if (
            first is not None
            and isinstance(original, FunctionExecutionResultMessage)
            and len(original.content) == len(results)
            and pending.origins[first - 1] != pending.origins[first]  # its first result
            and unchanged == list(range(first, first + len(results)))
        ):
            out.append(original)
        else:
            out.append(FunctionExecutionResultMessage(content=list(results)))
        results.clear()
        unchanged.clear()

    for message, origin in zip(sent, origins, strict=True):
        role = message.get("role")
        text = _text(message.get("content"))
        if role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            if call_id in dropped:
                continue
            name = message.get("name") or pending.names.get(call_id, "")
            unchanged.append(origin.source if origin.text is None else None)
            results.append(
                FunctionExecutionResult(
                    content=text,
                    name=str(name),
                    call_id=call_id,
                    is_error=pending.errors.get(call_id, False),
                )
            )
            continue
        flush()
        if origin.source is not None:
            original = messages[pending.origins[origin.source]]
            if role == "system" and pending.merged_system:
                out.append(SystemMessage(content=origin.text if origin.text is not None else text))
            elif origin.text is None:
                out.append(original)
            else:
                out.append(_with_text(original, origin.text))
            continue
        if role == "system":
            out.append(SystemMessage(content=text))
        elif role == "user":
            out.append(UserMessage(content=text, source=str(message.get("name") or "user")))
        else:
            calls = [
                FunctionCall(
                    id=str(c.get("id") or ""),
                    name=str(c["function"]["name"]),
                    arguments=str(c["function"].get("arguments") or "{}"),
                )
                for c in message.get("tool_calls") or ()
            ]
            author = lookup.author(text, [c.id for c in calls]) if lookup else None
            if author is not None and author != agent and author in peers:
                if calls:  # a peer's tool calls are its own business, as in AutoGen
                    dropped.update(c.id for c in calls)
                else:
                    out.append(UserMessage(content=text, source=author))
                continue
            if calls:
                out.append(AssistantMessage(content=calls, thought=text or None, source=agent))
            else:
                out.append(AssistantMessage(content=text, source=agent))
    flush()
    return out


def redacted_natively(redactor: Any, messages: Sequence[LLMMessage]) -> list[LLMMessage] | None:
    """Copies of ``messages`` with their text (tool call arguments and results included)
    passed through ``redactor`` (``None`` when redaction is off). Raises what redaction
    raised."""
    if redactor is None:
        return None

    def red(text: str) -> str:
        return str(redactor.redact_text(text).redacted_text)

    out: list[LLMMessage] = []
    for message in messages:
        if isinstance(message, FunctionExecutionResultMessage):
            content = [r.model_copy(update={"content": red(r.content)}) for r in message.content]
            out.append(message.model_copy(update={"content": content}))
        elif isinstance(message, AssistantMessage) and isinstance(message.content, list):
            calls = [dataclasses.replace(c, arguments=red(c.arguments)) for c in message.content]
            thought = red(message.thought) if message.thought else message.thought
            out.append(message.model_copy(update={"content": calls, "thought": thought}))
        elif isinstance(message.content, str):
            out.append(message.model_copy(update={"content": red(message.content)}))
        elif isinstance(message, UserMessage) and isinstance(message.content, list):
            parts = [red(p) if isinstance(p, str) else p for p in message.content]
            out.append(message.model_copy(update={"content": parts}))
        else:
            out.append(message)
    return out


def tool_schemas(tools: Sequence[Any]) -> list[dict[str, Any]] | None:
    """The tools a model call sends (AutoGen ``Tool`` objects or ``ToolSchema`` dicts) as
    OpenAI tool schemas, which the engine counts against the budget; ``None`` without
    tools."""
    schemas: list[dict[str, Any]] = []
    for tool in tools or ():
        schema = tool if isinstance(tool, Mapping) else getattr(tool, "schema", None)
        if not isinstance(schema, Mapping) or not schema.get("name"):
            continue
        function: dict[str, Any] = {"name": schema["name"]}
        if schema.get("description"):
            function["description"] = schema["description"]
        if schema.get("parameters") is not None:
            function["parameters"] = dict(schema["parameters"])
        schemas.append({"type": "function", "function": function})
    return schemas or None


def reply_text(result: CreateResult) -> str:
    """The text of a model reply (its thought when it only calls tools)."""
    if isinstance(result.content, str):
        return result.content
    return result.thought or ""


def reply_to_message(result: CreateResult, agent: str | None, provider: str, model: str) -> Message:
    """The model's reply as the neutral assistant :class:`Message` the engine commits,
    written by ``agent``."""
    entry: dict[str, Any] = {"role": "assistant"}
    if isinstance(result.content, list):
        entry["content"] = result.thought or None
        entry["tool_calls"] = [_call_dict(c) for c in result.content if isinstance(c, FunctionCall)]
    else:
        entry["content"] = result.content
    author = agent_author(agent) if agent else None
    return message_from_openai(entry, author).model_copy(
        update={"invocation": ModelInvocation(provider=provider or "unknown", model=model)}
    )


def arguments_of(call: FunctionCall) -> dict[str, Any] | str:
    """A tool call's arguments as the model gave them (a dict when they parse)."""
    try:
        parsed = json.loads(call.arguments or "{}")
    except ValueError:
        return call.arguments
    return parsed if isinstance(parsed, dict) else call.arguments
