"""AutoGen model messages <-> the engine's neutral messages (through OpenAI-style dicts).

One agent's view of a conversation is not another's: AutoGen hands an agent its own replies as
``AssistantMessage(source=<agent>)`` and a team peer's reply as ``UserMessage(source=<peer>)``.
The session of a team holds each reply once, as the assistant message of the agent that wrote
it (``author``: kind agent, the agent's name). So :func:`to_pending` gives the engine a peer's
message as the assistant message it is in the session (recorded once, with the peer as
author), and :func:`from_sent` turns the engine's input back into the calling agent's view: a
peer's message is a user message named after the peer again, never the agent's own assistant
turn, and a peer's tool calls (with their results) are left out, as AutoGen leaves them out,
but for those a handoff passed on to the agent. A handoff passes a part of its author's reply
on to the peers (its context: the reply's tool calls but the handoffs, with their results, or
its thought alone), which AutoGen puts into their model contexts as the author's assistant
message: the engine gets that part as the whole reply the session holds
(:data:`~ce.autogen._record.HANDED`), so it is not stored again, and the agent receives the
part it was handed.
An agent's own tool-call summary or handoff message (stored when the team emits it, see
:func:`emitted_message`) is left out of its own view: AutoGen shows it to the peers only.

``HeadAndTailChatCompletionContext``'s "Skipped N messages." placeholder is left out: the
session holds what it stands for.

One OpenAI dict per unit (:data:`Unit`: an AutoGen message, or one result of a
``FunctionExecutionResultMessage``): a history an agent
continues is converted only for its new units (``plugin.histories``, see
:class:`ce.core.integration.HistoryMemo`; each neutral message written by its unit's author,
:func:`author_of`), and :func:`from_sent` checks an app message changed in place since before
it goes as the app's own object.

System messages: the agent's own system message (prepended by AutoGen outside the model
context) and the other system messages of the model context are the call's instruction (the
engine joins a call's system messages in order), except those a memory added (``_record``
notes them): the memory's hits are recorded as evidence and reach the model once, in the
engine's context.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

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

from ce.autogen._record import EMITTED, HANDED, SHOWN
from ce.core.integration import History, RewriteMemo, message_from_openai, reconcile_openai
from ce.core.schema import Author, AuthorKind, Message, ModelInvocation, Role

__all__ = [
    "Pending",
    "Unit",
    "author_of",
    "emitted_message",
    "from_sent",
    "handed_key",
    "opaque",
    "part_of",
    "redacted_natively",
    "reply_text",
    "reply_to_message",
    "society_turn",
    "stored_reply",
    "to_openai",
    "to_pending",
    "tool_schemas",
    "turn_key",
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


Unit = SystemMessage | UserMessage | AssistantMessage | FunctionExecutionResult
"""What one OpenAI dict of the engine's pending messages comes from: an AutoGen message, or
one result of a ``FunctionExecutionResultMessage`` (which holds the results of a turn)."""


def _is_peer(message: UserMessage, agent: str, peers: Collection[str]) -> bool:
    """Whether ``message`` is a team peer's reply the engine reads as the peer's assistant
    message (a peer's message with media stays a user message)."""
    return message.source in peers and message.source != agent and not _has_media(message.content)


def _is_handed(message: AssistantMessage, agent: str, peers: Collection[str]) -> bool:
    """Whether ``message`` is a part of a team peer's reply a handoff passed on to ``agent``
    (AutoGen puts a peer's assistant message into an agent's model context only so)."""
    return message.source != agent and message.source in peers


def _call_ids(message: AssistantMessage) -> set[str]:
    """The ids of the tool calls of ``message`` (none for a text)."""
    if not isinstance(message.content, list):
        return set()
    return {c.id for c in message.content if isinstance(c, FunctionCall)}


def handed_key(part: AssistantMessage) -> Hashable:
    """What identifies a part of a reply a handoff passes on: its tool calls (id, name,
    arguments) or its text, and its thought."""
    content = part.content
    if isinstance(content, list):
        calls = tuple((c.id, c.name, c.arguments) for c in content if isinstance(c, FunctionCall))
        return (calls, part.thought)
    return (content, part.thought)


def part_of(part: AssistantMessage, reply: AssistantMessage) -> bool:
    """Whether ``part`` (a handoff's context) is a part of ``reply``: some of its tool calls,
    or its thought alone."""
    if not isinstance(reply.content, list):
        return False
    if isinstance(part.content, list):
        made = {(c.id, c.name, c.arguments) for c in reply.content if isinstance(c, FunctionCall)}
        calls = [(c.id, c.name, c.arguments) for c in part.content if isinstance(c, FunctionCall)]
        return bool(calls) and made.issuperset(calls)
    return bool(part.content) and part.content == reply.thought


def stored_reply(message: Message) -> AssistantMessage:
    """A reply with tool calls the session stores (``message``) as AutoGen holds it: its
    calls with the model's arguments, its text as the thought, its author as the source."""
    calls = [
        FunctionCall(id=c.tool_call_id, name=c.name, arguments=c.raw_arguments or "{}")
        for c in message.tool_calls or ()
    ]
    source = message.author.id if message.author is not None else ""
    return AssistantMessage(content=calls, thought=message.content or None, source=source)


def to_openai(
    units: Sequence[Unit], agent: str = "", peers: Collection[str] = ()
) -> list[dict[str, Any]]:
    """One OpenAI-style dict per unit (see :func:`to_pending`), from ``agent``'s view (a
    peer's reply is its assistant message, see the module docstring; a part of a peer's
    reply a handoff passed on is the whole reply, as the session holds it, when
    :data:`~ce.autogen._record.HANDED` knows it). Raises :class:`TypeError` for a message
    type of a later AutoGen (the engine cannot read it)."""
    out: list[dict[str, Any]] = []
    for unit in units:
        if isinstance(unit, FunctionExecutionResult):
            out.append({"role": "tool", "tool_call_id": unit.call_id, "content": unit.content})
        elif isinstance(unit, UserMessage):
            if _is_peer(unit, agent, peers):  # as the peer wrote it (see ``ShownTexts``)
                text = SHOWN.written(unit.source, _text(unit.content))
                out.append({"role": "assistant", "content": text})
            else:
                out.append({"role": "user", "content": _text(unit.content)})
        elif isinstance(unit, AssistantMessage):
            reply = (
                HANDED.reply(unit.source, handed_key(unit))
                if _is_handed(unit, agent, peers)
                else None
            )
            if reply is not None:
                out.append(dict(reply))
                continue
            entry: dict[str, Any] = {"role": "assistant"}
            if isinstance(unit.content, list):
                entry["content"] = unit.thought or None
                entry["tool_calls"] = [
                    _call_dict(c) for c in unit.content if isinstance(c, FunctionCall)
                ]
            else:
                entry["content"] = unit.content
            out.append(entry)
        elif isinstance(unit, SystemMessage):
            out.append({"role": "system", "content": unit.content})
        else:  # a message type of a later AutoGen: the engine cannot read it
            raise TypeError(f"unsupported AutoGen message type {type(unit).__name__}")
    return out


def author_of(unit: Unit, agent: str = "", peers: Collection[str] = ()) -> Author | None:
    """Who wrote ``unit``, from ``agent``'s view (``None``: a system message, a tool result)."""
    if isinstance(unit, UserMessage):
        if _is_peer(unit, agent, peers):
            return agent_author(unit.source)
        return user_author(unit.source or "user")
    if isinstance(unit, AssistantMessage):
        return agent_author(unit.source or agent)
    return None


def opaque(unit: Unit) -> bool:
    """Whether ``unit`` carries content the engine cannot read (a user message's images)."""
    return isinstance(unit, UserMessage) and _has_media(unit.content)


@dataclass
class Pending:
    """An agent's messages as the engine's pending messages: ``units`` (what each OpenAI dict
    comes from, see :data:`Unit`), ``origins`` (the index of the AutoGen message each unit
    comes from); then, from :meth:`convert` (every unit converted) or :meth:`continued`
    (the units of a :class:`~ce.core.integration.History`): ``dicts`` (OpenAI-style),
    ``opaque`` (dicts whose message carries media the engine cannot read) and
    ``history``. ``handed``: the positions of the units that are parts of a peer's reply a
    handoff passed on (see :func:`to_openai`)."""

    units: list[Unit] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)
    handed: list[int] = field(default_factory=list)
    dicts: Sequence[dict[str, Any]] = ()
    opaque: set[int] = field(default_factory=set)
    history: History | None = None
    agent: str = ""
    peers: Collection[str] = ()
    _authors: list[Author | None] | None = field(default=None, init=False, repr=False)
    _names: dict[str, str] | None = field(default=None, init=False, repr=False)
    _results: dict[str, FunctionExecutionResult] | None = field(
        default=None, init=False, repr=False
    )

    def convert(self, dicts: Sequence[dict[str, Any]]) -> None:
        """Take ``dicts``, one per unit (every unit converted again)."""
        if len(dicts) != len(self.units):
            raise ValueError(f"{len(dicts)} messages for {len(self.units)} AutoGen messages")
        self.dicts = dicts
        self.opaque = {j for j, unit in enumerate(self.units) if opaque(unit)}
        self.history = None

    def continued(self, history: History) -> None:
        """Take the conversions of ``history`` (whose ``app`` are these units)."""
        self.dicts = history.pending
        self.opaque = set(history.opaque)
        self.history = history

    @property
    def authors(self) -> list[Author | None]:
        """Who wrote each dict (see :func:`author_of`)."""
        if self._authors is None:
            if self.history is not None:
                self._authors = [m.author for m in self.history.messages]
            else:
                self._authors = [author_of(u, self.agent, self.peers) for u in self.units]
        return self._authors

    def result(self, call_id: str) -> FunctionExecutionResult | None:
        """The app's last result of tool call ``call_id`` (``None``: the app has none)."""
        if self.history is not None:
            positions = self.history.results.get(call_id)
            unit = self.units[positions[-1]] if positions else None
            return unit if isinstance(unit, FunctionExecutionResult) else None
        if self._results is None:
            self._results = {
                unit.call_id: unit
                for unit in self.units
                if isinstance(unit, FunctionExecutionResult)
            }
        return self._results.get(call_id)

    def handed_part(
        self, author: str, text: str, call_ids: Collection[str]
    ) -> AssistantMessage | None:
        """The part of peer ``author``'s reply (its text ``text``, its tool calls
        ``call_ids``) that a handoff passed on to the agent, as the agent's own list holds it
        (``None``: none did)."""
        for j in self.handed:
            unit = cast(AssistantMessage, self.units[j])
            if unit.source != author:
                continue
            if isinstance(unit.content, list):
                if any(isinstance(c, FunctionCall) and c.id in call_ids for c in unit.content):
                    return unit
            elif text and unit.content == text:
                return unit
        return None

    def is_error(self, call_id: str) -> bool:
        """Whether the app's result of tool call ``call_id`` is an error."""
        result = self.result(call_id)
        return bool(result.is_error) if result is not None else False

    def tool_name(self, call_id: str) -> str:
        """The name of the tool call ``call_id`` calls: as the app's assistant message
        called it, else as its result names it (``""``: the app has neither)."""
        if self.history is not None:
            positions = self.history.results.get(call_id)
            if positions:  # the history names a result after the call before it
                name = self.history.messages[positions[0]].name
                unit = self.units[positions[0]]
                if name:
                    return name
                if isinstance(unit, FunctionExecutionResult) and unit.name:
                    return unit.name
        if self._names is None:
            calls: dict[str, str] = {}
            results: dict[str, str] = {}
            for unit in self.units:
                if isinstance(unit, AssistantMessage) and isinstance(unit.content, list):
                    calls.update(
                        (c.id, c.name) for c in unit.content if isinstance(c, FunctionCall)
                    )
                elif isinstance(unit, FunctionExecutionResult):
                    results.setdefault(unit.call_id, unit.name)
            self._names = {**results, **calls}
        return self._names.get(call_id, "")


def to_pending(
    messages: Sequence[LLMMessage],
    agent: str,
    peers: Collection[str],
    memory_texts: Collection[str] = (),
) -> Pending:
    """``messages`` (the list an agent's model call sends) as the units of the engine's
    pending messages, from ``agent``'s view (see the module docstring; convert them with
    :func:`to_openai`, one dict each): the system messages but those memories added
    (``memory_texts``); each result of a
    ``FunctionExecutionResultMessage`` one unit; ``HeadAndTailChatCompletionContext``'s
    placeholder left out; ``peers`` are the names of the other agents of its team."""
    pending = Pending(agent=agent, peers=peers)
    units, origins = pending.units, pending.origins
    for index, message in enumerate(messages):
        kind, plain = type(message), cast(Any, message)
        # the common messages first, without isinstance (an ABC check on pydantic models)
        if kind is AssistantMessage or (kind is UserMessage and plain.source != "System"):
            if kind is AssistantMessage and _is_handed(plain, agent, peers):
                pending.handed.append(len(units))
            units.append(plain)
            origins.append(index)
        elif isinstance(message, FunctionExecutionResultMessage):
            units.extend(message.content)
            origins.extend([index] * len(message.content))
        elif isinstance(message, SystemMessage):
            if message.content not in memory_texts:
                units.append(message)
                origins.append(index)
        elif (
            isinstance(message, UserMessage)
            and message.source == "System"
            and _SKIPPED.fullmatch(_text(message.content))
        ):
            continue  # HeadAndTail's placeholder for what it cut: the session has it
        else:
            units.append(message)
            origins.append(index)
    return pending


_rewrites = RewriteMemo()


def _with_text(original: LLMMessage, text: str) -> LLMMessage:
    """A copy of ``original`` with its text replaced (a user message's images kept). Made
    once per message and text (see :class:`~ce.core.integration.RewriteMemo`)."""
    return _rewrites.copy(original, text, functools.partial(_copy_with_text, original, text))


def _copy_with_text(original: LLMMessage, text: str) -> LLMMessage:
    if isinstance(original, UserMessage) and isinstance(original.content, list):
        media = [p for p in original.content if not isinstance(p, str)]
        content: list[str | Image] = [text, *media] if text else list(media)
        return original.model_copy(update={"content": content})
    return original.model_copy(update={"content": text})


class AuthorLookup:
    """Who wrote an assistant message the engine assembled that is not among the agent's
    own pending messages (history from the store): by its text or its tool call ids; and
    which of them an agent emitted without AutoGen putting them into its own model context
    (``emitted``: text -> agent, see :func:`emitted_message`)."""

    def __init__(
        self, texts: Mapping[str, str], calls: Mapping[str, str], emitted: Mapping[str, str]
    ) -> None:
        self.texts = texts
        self.calls = calls
        self.emitted = emitted

    def author(self, text: str, call_ids: Sequence[str]) -> str | None:
        for call_id in call_ids:
            if call_id in self.calls:
                return self.calls[call_id]
        return self.texts.get(text) if text else None

    def unexplained(self, sent: Sequence[Mapping[str, Any]]) -> set[str]:
        """The texts and tool call ids of the assistant messages of ``sent`` whose author is
        not known."""
        unknown: set[str] = set()
        for message in sent:
            if message.get("role") != "assistant":
                continue
            calls = [str(c.get("id") or "") for c in message.get("tool_calls") or ()]
            if calls:
                unknown.update(c for c in calls if c not in self.calls)
                continue
            text = _text(message.get("content"))
            if text and text not in self.texts:
                unknown.add(text)
        return unknown


def turn_key(message: LLMMessage) -> Hashable | None:
    """An AutoGen message as a conversation holds it (``None`` for a system message, which
    two unrelated calls may share): its kind, source and content (a list of parts, tool
    calls or results as their reprs)."""
    if isinstance(message, SystemMessage):
        return None
    content: Any = message.content
    if isinstance(content, list):
        content = tuple(part if isinstance(part, str) else repr(part) for part in content)
    return (type(message).__name__, getattr(message, "source", None), content)


def from_sent(
    sent: Sequence[Mapping[str, Any]],
    messages: Sequence[LLMMessage],
    pending: Pending,
    agent: str,
    peers: Collection[str],
    lookup: AuthorLookup | None = None,
    own_only: bool = False,
) -> list[LLMMessage]:
    """The AutoGen messages ``agent``'s model call sends for the engine's input ``sent``,
    through the kit's reconciler (:func:`ce.core.integration.reconcile_openai`): a message
    the engine left as it was is the app's very object; a system, user or tool message whose
    text alone the engine changed is a copy of it with the new text (images kept); the rest
    is built anew, from ``agent``'s view (see the module docstring). With a continued
    history (``pending.history``) the work grows with ``sent``, not with the history; an app
    message that would go as it is but was changed in place since the history converted it
    goes as the engine's input has it (the engine never read its new text). With
    ``own_only`` (an agent a ``MessageFilterAgent`` wraps: it receives only what its filter
    let into its model context) a message of the engine's input that stands for none of
    ``messages`` (the session's history) is left out, system messages kept."""
    history = pending.history
    if history is None:
        origins = reconcile_openai(pending.dicts, sent, pending.opaque)
    else:
        origins = reconcile_openai(history.pending, sent, history=history)

    def as_it_was(j: int) -> bool:
        """Whether unit ``j`` still reads as it did when it was converted."""
        if history is None:
            return True
        return history.unchanged(j, pending.units[j], lambda u: to_openai([u], agent, peers)[0])

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
        source = origin.source
        if source is not None and origin.text is None and not as_it_was(source):
            source = None  # changed in place since: as the engine has it
        if role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            if call_id in dropped or (own_only and origin.source is None):
                continue
            name = message.get("name") or pending.tool_name(call_id)
            unchanged.append(source if origin.text is None else None)
            results.append(
                FunctionExecutionResult(
                    content=text,
                    name=str(name),
                    call_id=call_id,
                    is_error=pending.is_error(call_id),
                )
            )
            continue
        flush()
        if own_only and origin.source is None and role != "system":
            continue  # the session's, which the agent's filter kept from it
        if source is not None:
            original = messages[pending.origins[source]]
            if isinstance(original, AssistantMessage) and source in pending.handed:
                # the peer's whole reply: the agent receives the part it was handed
                held = _call_ids(original)
                whole = (str(c.get("id") or "") for c in message.get("tool_calls") or ())
                dropped.update(i for i in whole if i not in held)
            if origin.text is None:
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
            if lookup is not None and not calls and lookup.emitted.get(text) == agent:
                continue  # its own summary or handoff message: never in its own model context
            ids = [c.id for c in calls]
            author = lookup.author(text, ids) if lookup else None
            if author is not None and author != agent and author in peers:
                part = pending.handed_part(author, text, ids)
                if part is not None:  # as the handoff passed it on to the agent
                    held = _call_ids(part)
                    kept = [c for c in calls if c.id in held]
                    dropped.update(i for i in ids if i not in held)
                    if kept:
                        out.append(
                            AssistantMessage(content=kept, thought=text or None, source=author)
                        )
                    else:
                        out.append(AssistantMessage(content=text, source=author))
                elif calls:  # a peer's tool calls are its own business, as in AutoGen
                    dropped.update(ids)
                else:
                    out.append(UserMessage(content=text, source=author))
                continue
            # a call no agent makes (a tool body's own) names no source: AutoGen's clients
            # send a message's source as its name, which may not be empty
            source_name = agent or "assistant"
            if calls:
                out.append(
                    AssistantMessage(content=calls, thought=text or None, source=source_name)
                )
            else:
                out.append(AssistantMessage(content=text, source=source_name))
    flush()
    return out


def emitted_message(message: Any, agent: str) -> Message | None:
    """The chat message ``message`` (the final message of an agent's turn in a team) as the
    neutral assistant :class:`Message` written by ``agent``, when it is one AutoGen shows the
    agent's peers but never puts into the agent's own model context: a
    ``ToolCallSummaryMessage`` (the tool results, ``reflect_on_tool_use=False``) or a
    ``HandoffMessage``; its meta :data:`~ce.autogen._record.EMITTED` names its type.
    ``None`` for any other message (a model reply, which its model call records) and for
    one without text."""
    from autogen_agentchat.messages import HandoffMessage, ToolCallSummaryMessage

    if not isinstance(message, (ToolCallSummaryMessage, HandoffMessage)):
        return None
    text = _text(message.to_model_message().content)
    if not text.strip():
        return None
    return Message(
        role=Role.ASSISTANT,
        content=text,
        author=agent_author(agent),
        meta={EMITTED: type(message).__name__},
    )


def society_turn(incoming: Sequence[Any], answer: Any, agent: str) -> list[Message]:
    """A ``SocietyOfMindAgent``'s turn as the neutral messages of its conversation: each
    chat message the turn received that has text, as a user message by its source, then the
    agent's answer ``answer`` (when it has text) as the assistant message ``agent`` wrote."""
    turn = [
        Message(role=Role.USER, content=text, author=user_author(str(message.source)))
        for message in incoming
        if (text := _text(message.to_model_message().content)).strip()
    ]
    text = _text(answer.to_model_message().content)
    if text.strip():
        turn.append(Message(role=Role.ASSISTANT, content=text, author=agent_author(agent)))
    return turn


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
