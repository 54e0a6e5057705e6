"""Injection helpers shared by plugins whose framework speaks OpenAI-style message dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ce.core.formats import from_openai_messages
from ce.core.integration._convert import assembled_to_openai, openai_to_messages
from ce.core.integration._guard import guarded, guarded_sync

if TYPE_CHECKING:
    from ce.core.engine import ContextEngine
    from ce.core.integration._plugin import Plugin
    from ce.core.schema import AssembledInput, PrepareResult
    from ce.core.tokens import TokenEstimator

__all__ = ["augment_openai", "prepare_openai", "prepare_openai_sync"]

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


def _sent(
    plugin: Plugin,
    engine: ContextEngine,
    messages: Sequence[Mapping[str, Any]],
    result: PrepareResult,
) -> list[dict[str, Any]]:
    if plugin.mode != "augment":
        return assembled_to_openai(result.assembled_input)
    hint = (plugin.config or engine.config).model_hint
    return augment_openai(
        messages, result.assembled_input, result.report.token_budget, engine.estimator, hint
    )


def prepare_openai_sync(
    plugin: Plugin,
    session_id: str,
    messages: Sequence[Mapping[str, Any]],
    tool_schemas: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]] | None:
    """Before a model call, from blocking code (with or without a running event loop): hand
    the framework's pending OpenAI-style ``messages`` to ``plugin.engine.prepare_call`` in
    ``session_id`` (with ``plugin.config`` and ``tool_schemas``) and return the OpenAI-style
    messages the model must receive instead (with ``plugin.mode == "augment"``, the
    framework's own messages plus the engine's context, see :func:`augment_openai`).
    Fail-open like :func:`guarded_sync`: ``None`` when the engine (or the conversion) failed,
    so the caller sends its own messages; with ``plugin.fail_closed`` the error is raised."""
    engine = plugin.engine

    def prepare() -> list[dict[str, Any]]:
        pending = openai_to_messages(messages)
        result = engine.sync.prepare_call(session_id, pending, plugin.config, tool_schemas)
        return _sent(plugin, engine, messages, result)

    return guarded_sync(plugin, prepare, session_id=session_id, what="prepare_call")


async def prepare_openai(
    plugin: Plugin,
    session_id: str,
    messages: Sequence[Mapping[str, Any]],
    tool_schemas: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]] | None:
    """The coroutine twin of :func:`prepare_openai_sync` (awaits the engine on the caller's
    loop; fail-open like :func:`guarded`)."""
    engine = plugin.engine

    async def prepare() -> list[dict[str, Any]]:
        pending = openai_to_messages(messages)
        result = await engine.prepare_call(session_id, pending, plugin.config, tool_schemas)
        return _sent(plugin, engine, messages, result)

    return await guarded(plugin, prepare, session_id=session_id, what="prepare_call")
