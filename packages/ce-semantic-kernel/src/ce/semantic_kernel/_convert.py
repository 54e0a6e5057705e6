"""Semantic Kernel chat messages <-> the engine's neutral messages (through OpenAI-style
dicts, which SK's own ``ChatMessageContent.to_dict()`` writes).

:func:`to_pending` turns the ``ChatHistory`` a request would send into dicts (and the author
of each: an assistant message SK named after its agent is that agent's); :func:`from_sent`
turns the engine's input back into a NEW ``ChatHistory`` for the one request: an app message
the engine left unchanged is the app's very object, one whose text alone it rewrote is a copy
with that text, anything else is built from the dict. The app's own ``ChatHistory`` (the auto
function-calling loop grows it round by round, an agent thread copies from it by index) is
never changed.

A request continuing the session's previous one (the same message objects, then new ones:
the auto function-calling loop's next round, the app's next turn on the same ``ChatHistory``)
is converted only for its new messages: :func:`to_openai` (one dict per message, what
:func:`to_pending` reads), :func:`opaque` and :func:`author` go to the plugin's
:class:`~ce.core.integration.HistoryMemo`, and :func:`continued` gives the request's
:class:`Pending` from the history it returns.
"""

from __future__ import annotations

import functools
import json
import operator
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ce.core.integration import History, RewriteMemo, message_from_openai, reconcile_openai
from ce.core.schema import Author, AuthorKind, Message, ModelInvocation

__all__ = [
    "SUMMARY_KEY",
    "Pending",
    "SummaryTexts",
    "continued",
    "conversation",
    "fingerprint",
    "from_sent",
    "message_text",
    "normalise_usage",
    "opaque",
    "reply_to_message",
    "to_openai",
    "to_pending",
    "tool_schemas",
    "turn_key",
]


SUMMARY_KEY = "__summary__"
"""The metadata key SK's ``ChatHistorySummarizationReducer`` marks its summary message with
(``SUMMARY_METADATA_KEY``)."""


class SummaryTexts:
    """The texts of the summaries SK's ``ChatHistorySummarizationReducer`` made in this
    process (the newest ``limit``), noted after each ``reduce()``: a prompt function that
    renders the reducer as ``{{$chat_history}}`` hands its messages on as prompt text, and
    the summary comes back without its ``__summary__`` mark. Thread-safe."""

    def __init__(self, limit: int = 1024) -> None:
        self._texts: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._limit = limit

    def note(self, messages: Sequence[Any]) -> None:
        """Note the summaries among ``messages`` (a reducer's, after its ``reduce()``)."""
        texts = [
            m.content
            for m in messages
            if (getattr(m, "metadata", None) or {}).get(SUMMARY_KEY)
            and isinstance(getattr(m, "content", None), str)
        ]
        if not texts:
            return
        with self._lock:
            for text in texts:
                self._texts[text] = None
                self._texts.move_to_end(text)
            while len(self._texts) > self._limit:
                self._texts.popitem(last=False)

    def __contains__(self, text: object) -> bool:
        return text in self._texts


def _summary(message: Any, summaries: SummaryTexts | None) -> bool:
    if (getattr(message, "metadata", None) or {}).get(SUMMARY_KEY):
        return True
    return (
        summaries is not None
        and _role(message) == "assistant"
        and getattr(message, "content", None) in summaries
    )


def conversation(messages: Sequence[Any], summaries: SummaryTexts | None = None) -> list[Any]:
    """``messages`` without the summaries SK's ``ChatHistorySummarizationReducer`` put in
    place of older turns: the session holds those turns (their requests went through the
    engine), and the engine fits them to the budget itself, so a summary is neither stored as
    a turn nor sent beside the turns it summarizes. A summary is the message SK marks as one,
    or an assistant message reading as one of ``summaries`` (a summary handed on through a
    prompt template, which drops the mark)."""
    return [m for m in messages if not _summary(m, summaries)]


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


def _entry(message: Any) -> dict[str, Any]:
    """The OpenAI-style dict the engine reads for ``message``: SK's ``to_dict()``, the name
    kept on an assistant message only (an agent's reply goes with its agent's name: the
    engine stores it, sends it and counts it; the agent is its author too), ``developer``
    read as ``system``, a list of items as their text."""
    entry = dict(message.to_dict())
    role = entry.get("role")
    if role == "developer":
        entry["role"] = "system"
    if role != "assistant":
        entry.pop("name", None)
    if isinstance(entry.get("content"), list):
        entry["content"] = message_text(message)
    elif entry.get("content") is None and role != "assistant":
        entry["content"] = ""
    return entry


# What SK writes of an item of each class (``to_dict()``, the text the engine reads); None: an
# item of any other class (an image, a file) is read whole.
_ITEM_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _item_fields(cls: type) -> tuple[str, ...] | None:
    fields = _ITEM_FIELDS.get(cls, ())
    if fields == ():
        from semantic_kernel.contents import (
            FunctionCallContent,
            FunctionResultContent,
            TextContent,
        )

        if issubclass(cls, TextContent):
            fields = ("text",)
        elif issubclass(cls, FunctionCallContent):
            fields = ("id", "name", "function_name", "plugin_name", "arguments")
        elif issubclass(cls, FunctionResultContent):
            fields = ("id", "name", "function_name", "plugin_name", "result")
        else:
            fields = None
        _ITEM_FIELDS[cls] = fields
    return fields


def fingerprint(message: Any) -> tuple[Any, ...]:
    """What :func:`to_openai`, :func:`opaque` and :func:`author` read of an SK message,
    cheaply (see :class:`~ce.core.integration.HistoryMemo`): its class, role and name, its
    items (the list and its length) and, of each item, its class and what SK writes of it (a
    text's text; a function call's or result's id, names and arguments or result; every field
    of any other item). Reading every field of every message and item costs about four times
    as much on SK's pydantic messages."""
    fields = message.__dict__
    items = fields.get("items") or ()
    out: list[Any] = [type(message), fields.get("role"), fields.get("name"), items, len(items)]
    for item in items:
        read = _item_fields(type(item))
        values = item.__dict__
        out.append(type(item))
        if read is None:
            out.extend(values.values())
        else:
            out.extend([values.get(name) for name in read])
    return tuple(out)


def to_openai(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The OpenAI-style dict of each of ``messages``, one per message (what
    :func:`to_pending` reads for a message it keeps)."""
    return [_entry(message) for message in messages]


def opaque(message: Any) -> bool:
    """Whether ``message`` carries content the engine cannot read (images, files): SK writes
    its items as a list, and one of them is neither text nor a function call or result."""
    if not _has_media(message):
        return False
    from semantic_kernel.contents import FunctionCallContent

    # an assistant message with function calls is written as its calls alone
    return not (
        _role(message) == "assistant"
        and any(isinstance(item, FunctionCallContent) for item in message.items)
    )


def author(message: Any) -> Author | None:
    """Who wrote ``message``: the agent an assistant message is named after, else none."""
    name = getattr(message, "name", None)
    return agent_author(str(name)) if name and _role(message) == "assistant" else None


def _repeats(kept: Any, message: Any) -> bool:
    """Whether ``message`` is the agent's reply ``kept`` again, right after it."""
    name = getattr(message, "name", None)
    return bool(
        name
        and _role(message) == "assistant"
        and getattr(kept, "name", None) == name
        and kept.to_dict() == message.to_dict()
    )


def to_pending(messages: Sequence[Any]) -> Pending:
    """The request's messages as the engine reads them. An agent's reply repeated right after
    itself is read once: an ``AgentGroupChat`` channel hands the next agent the previous
    agent's reply twice (SK's own behaviour), which the session holds once."""
    kept: list[Any] = []
    for message in messages:
        if not (kept and _repeats(kept[-1], message)):
            kept.append(message)
    return Pending(
        to_openai(kept),
        [author(message) for message in kept],
        [index for index, message in enumerate(kept) if opaque(message)],
        kept,
    )


def continued(history: History) -> Pending:
    """The request's :class:`Pending` from its converted ``history``: every message, or,
    when an agent's reply repeats right after itself, without the repeats, as
    :func:`to_pending` reads them (only the history's ``repeats`` are looked at)."""
    app = history.app
    repeated = {j for j in history.repeats if _repeats(app[j - 1], app[j])}
    authors = list(map(operator.attrgetter("author"), history.messages))
    if not repeated:
        return Pending(history.pending, authors, history.opaque, app)
    hidden = set(history.opaque)
    kept = [index for index in range(len(app)) if index not in repeated]
    return Pending(
        [history.pending[index] for index in kept],
        [authors[index] for index in kept],
        [position for position, index in enumerate(kept) if index in hidden],
        [app[index] for index in kept],
    )


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


def turn_key(message: Any) -> Hashable | None:
    """An SK message as a conversation holds it: its role, its text and the ids of the
    function calls it makes or answers (``None`` for a system or developer message, which two
    unrelated calls may share)."""
    from semantic_kernel.contents import FunctionCallContent, FunctionResultContent

    role = _role(message)
    if role in ("system", "developer"):
        return None
    items = getattr(message, "items", ()) or ()
    calls = tuple(str(item.id) for item in items if isinstance(item, FunctionCallContent))
    answered = tuple(str(item.id) for item in items if isinstance(item, FunctionResultContent))
    return (role, message_text(message), calls, answered)


def _call_names(sent: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    names: dict[str, str] = {}
    for entry in sent:
        for call in entry.get("tool_calls") or ():
            function = call.get("function") or {}
            names[str(call.get("id"))] = str(function.get("name") or "")
    return names


def _build(entry: Mapping[str, Any], names: Mapping[str, str]) -> Any:
    """A new ``ChatMessageContent`` from one assembled OpenAI dict; an assistant message
    keeps the name it was stored with (its agent's, as SK names an agent's reply)."""
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
        name = entry.get("name")  # as the engine stored it (and counted it)
        return ChatMessageContent(
            role=AuthorRole.ASSISTANT, items=items, name=name if isinstance(name, str) else None
        )
    return ChatMessageContent(role=AuthorRole(role), content=text)


_rewrites = RewriteMemo()


def _with_text(message: Any, text: str) -> Any:
    """A copy of the app's system, user or tool ``message`` with ``text``, its other items
    (images, files) kept. Made once per message and text (see
    :class:`~ce.core.integration.RewriteMemo`)."""
    return _rewrites.copy(message, text, functools.partial(_copy_with_text, message, text))


def _copy_with_text(message: Any, text: str) -> Any:
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


def _reads_as_held(message: Any, history: History, position: int) -> bool:
    """Whether the app's ``message`` at ``position`` of ``history`` still reads as it did
    when the history was converted (it may have been changed in place since)."""
    return history.unchanged(position, message, lambda m: None if opaque(m) else _entry(m))


def from_sent(
    sent: Sequence[Mapping[str, Any]], pending: Pending, history: History | None = None
) -> Any:
    """A new ``ChatHistory`` holding the engine's input ``sent`` for a request whose own
    messages are ``pending`` (see the module docstring); an agent's reply built anew (the
    engine changed its text: redacted, at a cheaper level of detail) is still named after
    its agent, never sent as the caller's own turn. With the ``history`` ``pending`` comes
    from, the work grows with ``sent``, not with the app's history; an app message that
    would go as it is but was changed in place since it was converted goes as the engine's
    input has it."""
    from semantic_kernel.contents import ChatHistory

    messages = pending.messages
    names = _call_names(sent)
    out: list[Any] = []
    origins = reconcile_openai(pending.dicts, sent, pending.opaque, history=history)
    for entry, where in zip(sent, origins, strict=True):
        if where.source is None or (
            where.text is None
            and history is not None
            and not _reads_as_held(messages[where.source], history, where.source)
        ):
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
    :class:`Message` the engine commits, written by ``agent`` and named after it (SK sends an
    agent's reply with its name in later requests); ``None`` when it has neither text nor
    function calls."""
    from semantic_kernel.contents import FunctionCallContent

    calls = [item for item in reply.items if isinstance(item, FunctionCallContent)]
    text = message_text(reply)
    if not text and not calls:
        return None
    entry: dict[str, Any] = {"role": "assistant", "content": text or None}
    if agent:
        entry["name"] = agent
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
