"""Injection helpers shared by plugins whose framework speaks OpenAI-style message dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ce.core.integration._convert import assembled_to_openai, openai_to_messages
from ce.core.integration._guard import guarded, guarded_sync

if TYPE_CHECKING:
    from ce.core.integration._plugin import Plugin

__all__ = ["prepare_openai", "prepare_openai_sync"]


def prepare_openai_sync(
    plugin: Plugin,
    session_id: str,
    messages: Sequence[Mapping[str, Any]],
    tool_schemas: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]] | None:
    """Before a model call, from blocking code (with or without a running event loop): hand
    the framework's pending OpenAI-style ``messages`` to ``plugin.engine.prepare_call`` in
    ``session_id`` (with ``plugin.config`` and ``tool_schemas``) and return the OpenAI-style
    messages the model must receive instead. Fail-open like :func:`guarded_sync`: ``None``
    when the engine (or the conversion) failed, so the caller sends its own messages; with
    ``plugin.fail_closed`` the error is raised."""
    engine = plugin.engine

    def prepare() -> list[dict[str, Any]]:
        pending = openai_to_messages(messages)
        result = engine.sync.prepare_call(session_id, pending, plugin.config, tool_schemas)
        return assembled_to_openai(result.assembled_input)

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
        return assembled_to_openai(result.assembled_input)

    return await guarded(plugin, prepare, session_id=session_id, what="prepare_call")
