"""Tool chains of OpenAI-style chat messages as plain assistant text, and other agents'
turns as theirs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ce.core.schema import AuthorKind

__all__ = ["peer_turn_text", "peer_turns_as_user", "tool_chains_as_text"]

_PLAIN = {"role", "content", "name"}
_TOOL_KEYS = ("tool_calls", "tool_call_id")


def _text(content: Any) -> str:
    """A message's content as text (the text parts of a list of content parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = [
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        ]
        return "\n".join(t for t in texts if t)
    return str(content)


def _call_line(call: Any) -> tuple[str | None, str, str]:
    """``(call id, tool name, "[called name(arguments)]")`` of one ``tool_calls`` entry."""
    call = call if isinstance(call, Mapping) else {}
    function = call.get("function")
    function = function if isinstance(function, Mapping) else {}
    name = str(function.get("name") or "tool")
    args = function.get("arguments")
    args_text = "" if args is None else args if isinstance(args, str) else str(args)
    call_id = call.get("id")
    return (call_id if isinstance(call_id, str) else None), name, f"[called {name}({args_text})]"


def tool_chains_as_text(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` (OpenAI-style chat dicts) with every tool call and tool result as plain
    assistant text, for a request that defines no tools.

    Some providers reject tool blocks in a request without tools (Anthropic: "Requests which
    include tool_use or tool_result blocks must define tools"; Bedrock: "The toolConfig field
    must be defined ..."), while a shared session can hand one agent another agent's tool
    chain. Each assistant message with ``tool_calls`` becomes an assistant message holding its
    own content, then one ``[called <name>(<arguments>)]`` line per call; each
    ``role: "tool"`` result is appended to that same message as ``[<name> returned:]`` and its
    content, so a call and its result stay together and user / assistant alternation holds.
    Adjacent assistant text messages next to such a chain are merged into one. No
    ``tool_calls`` or ``tool_call_id`` key is left; every other message is copied unchanged.
    Returns fresh dicts; ``messages`` is not changed."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    chained = False  # whether out[-1] holds text made from a tool chain

    def add(text: str, *, chain: bool) -> None:
        """Append assistant ``text``: to ``out[-1]`` when it is assistant text and one of the
        two comes from a tool chain, else as a message of its own."""
        nonlocal chained
        last = out[-1] if out else None
        if (
            last is not None
            and (chain or chained)
            and last.get("role") == "assistant"
            and isinstance(last.get("content"), (str, type(None)))
            and set(last) <= _PLAIN
        ):
            before = last.get("content") or ""
            last["content"] = f"{before}\n{text}" if before and text else before or text
        else:
            out.append({"role": "assistant", "content": text})
        chained = chained or chain

    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role == "assistant" and message.get("tool_calls"):
            lines = [_text(content)] if content else []
            for call in message.get("tool_calls") or ():
                call_id, name, line = _call_line(call)
                if call_id is not None:
                    names[call_id] = name
                lines.append(line)
            add("\n".join(line for line in lines if line), chain=True)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            name = message.get("name") or (names.get(call_id) if call_id else None) or "tool"
            add(f"[{name} returned:]\n{_text(content)}", chain=True)
        elif (
            chained and role == "assistant" and isinstance(content, str) and set(message) <= _PLAIN
        ):
            add(content, chain=False)  # the answer after a chain: one assistant message
        else:
            out.append({k: v for k, v in message.items() if k not in _TOOL_KEYS})
            chained = False
    return out


def peer_turns_as_user(messages: Sequence[Mapping[str, Any]], agent: str) -> list[dict[str, Any]]:
    """``messages`` (the engine's input for a model call, as
    :func:`~ce.core.integration.assembled_to_openai` makes it) as agent ``agent`` reads them
    in a session several agents share: each turn another agent wrote (its assistant
    messages, the results of its tool calls and the observations of its ReAct steps, in a
    row) becomes one user message, ``[<that agent> wrote:]`` then the turn's text, its tool
    calls and results as text (see :func:`tool_chains_as_text`). So the model never takes a
    peer's answer for its own turn, nor a peer's tool chain for calls it made. A call that
    continues ``agent``'s tool loop reads that loop's open chain (its newest tool calls and
    their results) last: turns peers wrote while it ran its tools come before it. Messages
    whose author is unknown, or a user's, or ``agent``'s own stay as they are. Without the
    authors (a list that is not a :class:`~ce.core.integration.SentMessages`) the messages
    come back as they are. When no turn is another agent's (the common call of an agent on
    its own), ``messages`` itself comes back, so a reconciler keeps the keys it holds (see
    :class:`~ce.core.integration.SentMessages`); else fresh dicts. ``messages`` is not
    changed."""
    authors = getattr(messages, "authors", None)
    if not isinstance(authors, list) or len(authors) != len(messages):
        return [dict(m) for m in messages]
    if not any(
        author is not None
        and author.kind is AuthorKind.AGENT
        and author.id != agent
        and message.get("role") == "assistant"
        for message, author in zip(messages, authors, strict=True)
    ):
        return messages  # type: ignore[return-value]  # the caller's own fresh dicts
    out: list[dict[str, Any]] = []
    peers: set[int] = set()  # the places in ``out`` of the peers' turns
    calls: int | None = None  # the place of ``agent``'s newest message calling tools
    i = 0
    while i < len(messages):
        author = authors[i]
        message = messages[i]
        if (
            author is None
            or author.kind is not AuthorKind.AGENT
            or author.id == agent
            or message.get("role") != "assistant"
        ):
            if author is not None and author.id == agent and message.get("tool_calls"):
                calls = len(out)
            out.append(dict(message))
            i += 1
            continue
        end = i + 1
        while end < len(messages) and authors[end] == author:
            end += 1
        peers.add(len(out))
        out.append({"role": "user", "content": peer_turn_text(messages[i:end], author.id)})
        i = end
    return _own_chain_last(out, peers, calls)


def _own_chain_last(
    out: list[dict[str, Any]], peers: set[int], calls: int | None
) -> list[dict[str, Any]]:
    """``out`` with the agent's tool chain still open (its newest message calling tools,
    followed by nothing but those calls' results and peers' turns) last: the turns other
    agents wrote while it ran its tools (agents running at once) come before that chain, so
    the call that continues its tool loop reads its results last, as its framework expects;
    a turn of the user's after the chain, or an answer of its own, leaves ``out`` as it is."""
    if calls is None:
        return out
    tail = range(calls + 1, len(out))
    moved = [i for i in tail if i in peers]
    results = [i for i in tail if i not in peers]
    if not moved or not results or any(out[i].get("role") != "tool" for i in results):
        return out
    return [*out[:calls], *(out[i] for i in moved), out[calls], *(out[i] for i in results)]


def peer_turn_text(turn: Sequence[Mapping[str, Any]], agent: str) -> str:
    """The text of the user message that a turn agent ``agent`` wrote (its assistant
    messages with their tool results, OpenAI-style) becomes for another agent (see
    :func:`peer_turns_as_user`): ``[<agent> wrote:]`` then the turn's text, its tool calls
    and results as text."""
    lines = (_text(m.get("content")) for m in tool_chains_as_text(turn))
    text = "\n".join(t for t in lines if t)
    return f"[{agent} wrote:]\n{text}"
