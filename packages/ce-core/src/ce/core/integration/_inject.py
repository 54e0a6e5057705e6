"""Injection helpers shared by plugins whose framework speaks OpenAI-style message dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ce.core.formats import from_openai_messages
from ce.core.integration._convert import assembled_to_openai, openai_to_messages
from ce.core.integration._guard import (
    guarded,
    guarded_sync,
    redacted_or_reported,
    redacted_or_reported_sync,
)

if TYPE_CHECKING:
    from ce.core.engine import ContextEngine
    from ce.core.integration._history import History
    from ce.core.integration._plugin import Plugin
    from ce.core.redaction import RegexRedactor
    from ce.core.schema import AssembledInput, Author, Message, PrepareResult
    from ce.core.tokens import TokenEstimator

__all__ = ["augment_openai", "prepare_openai", "prepare_openai_sync", "redact_openai"]

_SYSTEM_ROLES = ("system", "developer")


def augment_openai(
    messages: Sequence[Mapping[str, Any]],
    assembled: AssembledInput,
    token_budget: int,
    estimator: TokenEstimator,
    model_hint: str | None = None,
) -> list[dict[str, Any]]:
    """``mode="augment"``: the framework's own OpenAI-style ``messages`` stay, with the
    engine's context (the system sections of ``assembled`` but the instruction: memory,
    state, summary, evidence) as one more system message after the leading system prompt,
    and the history trimmed to ``token_budget``: the longest suffix that fits, never starting
    on a tool result (a tool call keeps its results), from the last user message on always
    kept."""
    app = [dict(m) for m in messages]
    lead = 0
    while lead < len(app) and app[lead].get("role") in _SYSTEM_ROLES:
        lead += 1
    system, history = app[:lead], app[lead:]
    engine_system = ""
    if assembled.parts and assembled.parts[0].role.value == "system":
        engine_system = assembled.parts[0].content
    prompt = "\n\n".join(_text(m.get("content")) for m in system)
    context = engine_system
    if prompt and engine_system == prompt:
        context = ""
    elif prompt and engine_system.startswith(prompt + "\n\n"):
        context = engine_system[len(prompt) + 2 :]
    head = [*system, *([{"role": "system", "content": context}] if context else [])]

    def tokens(message: dict[str, Any]) -> int:
        return sum(estimator.estimate_part(p, model_hint) for p in from_openai_messages([message]))

    available = token_budget - estimator.reply_priming(model_hint) - sum(map(tokens, head))
    users = [i for i, m in enumerate(history) if m.get("role") == "user"]
    start = users[-1] if users else 0
    used = sum(tokens(m) for m in history[start:])
    for index in range(start - 1, -1, -1):
        used += tokens(history[index])
        if used > available:
            break
        if history[index].get("role") != "tool":
            start = index
    return [*head, *history[start:]]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def redact_openai(
    messages: Sequence[Mapping[str, Any]], redactor: RegexRedactor
) -> list[dict[str, Any]]:
    """Copies of OpenAI-style ``messages`` with every text ``redactor`` matches replaced:
    string contents, the text parts of multimodal contents (other parts unchanged) and tool
    call arguments. Roles, ids and names stay."""
    out: list[dict[str, Any]] = []
    for message in messages:
        copy = dict(message)
        content = copy.get("content")
        if isinstance(content, str):
            copy["content"] = redactor.redact_text(content).redacted_text
        elif isinstance(content, list):
            copy["content"] = [
                {**part, "text": redactor.redact_text(part["text"]).redacted_text}
                if isinstance(part, dict) and isinstance(part.get("text"), str)
                else part
                for part in content
            ]
        calls = copy.get("tool_calls")
        if isinstance(calls, list):
            copy["tool_calls"] = [_redact_call(call, redactor) for call in calls]
        out.append(copy)
    return out


def _redact_call(call: Any, redactor: RegexRedactor) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    arguments = redactor.redact_text(function["arguments"]).redacted_text
    return {**call, "function": {**function, "arguments": arguments}}


def _fallback(
    plugin: Plugin, engine: ContextEngine, messages: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]] | None:
    """The framework's own messages, redacted, for a call the engine could not serve; None
    when redaction is off (they go as they are). Raises what redaction raised."""
    redactor = engine.redactor_for(plugin.config)
    return None if redactor is None else redact_openai(messages, redactor)


def _sent(
    plugin: Plugin,
    engine: ContextEngine,
    messages: Sequence[Mapping[str, Any]],
    result: PrepareResult,
) -> list[dict[str, Any]]:
    if plugin.mode != "augment":
        return assembled_to_openai(result.assembled_input)
    hint = (plugin.config or engine.config).model_hint
    redactor = engine.redactor_for(plugin.config)
    own = messages if redactor is None else redact_openai(messages, redactor)
    return augment_openai(
        own, result.assembled_input, result.report.token_budget, engine.estimator, hint
    )


def _authored(
    messages: Sequence[Mapping[str, Any]],
    authors: Sequence[Author | None] | None,
    history: History | None = None,
) -> list[Message]:
    """The pending messages of ``messages`` (those of ``history``, when given), each written
    by its ``authors`` entry."""
    pending = openai_to_messages(messages) if history is None else history.messages
    if not authors:
        return pending
    if len(authors) != len(pending):
        raise ValueError(f"{len(authors)} authors for {len(pending)} messages")
    return [
        m if a is None or m.author == a else m.model_copy(update={"author": a})
        for m, a in zip(pending, authors, strict=True)
    ]


def _rewinds(rewind: bool, history: History | None) -> bool:
    return rewind and (history is None or not history.extends)


def prepare_openai_sync(
    plugin: Plugin,
    session_id: str,
    messages: Sequence[Mapping[str, Any]],
    tool_schemas: list[dict[str, Any]] | None = None,
    authors: Sequence[Author | None] | None = None,
    *,
    history: History | None = None,
    rewind: bool = False,
) -> list[dict[str, Any]] | None:
    """Before a model call, from blocking code (with or without a running event loop): hand
    the framework's pending OpenAI-style ``messages`` to ``plugin.engine.prepare_call`` in
    ``session_id`` (with ``plugin.config`` and ``tool_schemas``; what it records is
    committed with the recording of the model call's outcome: ``defer_commit``) and return
    the OpenAI-style messages the model must receive instead (with ``plugin.mode == "augment"``, the
    framework's own messages, redacted, plus the engine's context, see
    :func:`augment_openai`).
    Fail-open like :func:`guarded_sync`, but never unredacted: when the engine (or the
    conversion) failed, the framework's own ``messages`` come back through the configured
    redactor (:func:`redact_openai`). ``None`` means "send your own messages as they are":
    redaction is off, or it failed too (counted in ``plugin.failures["redaction_failed"]``
    and reported as a ``Degraded`` event with reason ``redaction_failed``, at WARNING level).
    With ``plugin.fail_closed`` the error is raised instead. ``authors``, one per message
    (``None``: none), is who wrote each message, for frameworks with several agents: a
    message the session does not hold yet is recorded with it. ``history``: the
    :class:`~ce.core.integration.History` ``messages`` come from (its neutral messages are
    used, not converted again). ``rewind``: ``messages`` is the app's whole conversation as
    it stands, which may go back to an earlier point (see ``ContextEngine.prepare_call``);
    not when ``history`` continues the previous call's messages with more (the flow's
    conversation went on: turns of another flow of the session after its own are not taken
    back)."""
    engine = plugin.engine

    def prepare() -> list[dict[str, Any]]:
        pending = _authored(messages, authors, history)
        result = engine.sync.prepare_call(
            session_id,
            pending,
            plugin.config,
            tool_schemas,
            defer_commit=True,
            rewind=_rewinds(rewind, history),
        )
        return _sent(plugin, engine, messages, result)

    sent = guarded_sync(plugin, prepare, session_id=session_id, what="prepare_call")
    if sent is not None:
        return sent
    return redacted_or_reported_sync(
        plugin, session_id, lambda: _fallback(plugin, engine, messages)
    )


async def prepare_openai(
    plugin: Plugin,
    session_id: str,
    messages: Sequence[Mapping[str, Any]],
    tool_schemas: list[dict[str, Any]] | None = None,
    authors: Sequence[Author | None] | None = None,
    *,
    history: History | None = None,
    rewind: bool = False,
) -> list[dict[str, Any]] | None:
    """The coroutine twin of :func:`prepare_openai_sync` (awaits the engine on the caller's
    loop; fail-open, redacted, the same way)."""
    engine = plugin.engine

    async def prepare() -> list[dict[str, Any]]:
        pending = _authored(messages, authors, history)
        result = await engine.prepare_call(
            session_id,
            pending,
            plugin.config,
            tool_schemas,
            defer_commit=True,
            rewind=_rewinds(rewind, history),
        )
        return _sent(plugin, engine, messages, result)

    sent = await guarded(plugin, prepare, session_id=session_id, what="prepare_call")
    if sent is not None:
        return sent
    return await redacted_or_reported(
        plugin, session_id, lambda: _fallback(plugin, engine, messages)
    )
