"""Engine -> LlamaIndex: the messages an LLM chat call receives instead of its own.

The one-line ``install()`` rewrites the ``messages`` of every outermost LLM chat span
(``chat`` / ``achat`` / ``stream_chat`` / ``astream_chat``) from the root dispatcher's span
handler: span handlers run before the method body with the very list object the method
receives, and no other LlamaIndex hook can change an LLM's input for every call. The list is
rewritten in place and put back as it was when the call is over (see ``_spans``), so a list
the application passed in itself is unchanged afterwards. ``wrap(llm)`` is the explicit seam:
it hands the wrapped LLM a new list and never touches the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ce.core.integration import prepare_openai, prepare_openai_sync
from ce.llamaindex._convert import from_openai, to_openai, tool_schemas

if TYPE_CHECKING:
    from llama_index.core.base.llms.types import ChatMessage

    from ce.core.integration import Plugin

__all__ = ["inject_async", "inject_sync"]


def inject_sync(
    plugin: Plugin, session_id: str, messages: Sequence[ChatMessage], tools: Any = None
) -> list[ChatMessage] | None:
    """The messages the model receives instead of ``messages`` (``None`` when the engine
    failed: fail-open); the schemas of ``tools`` are counted against the budget. Raises the
    engine's error with ``plugin.fail_closed``."""
    pending = to_openai(messages)
    sent = prepare_openai_sync(plugin, session_id, pending, tool_schemas(tools))
    return None if sent is None else from_openai(sent, messages, pending)


async def inject_async(
    plugin: Plugin, session_id: str, messages: Sequence[ChatMessage], tools: Any = None
) -> list[ChatMessage] | None:
    """The coroutine twin of :func:`inject_sync`."""
    pending = to_openai(messages)
    sent = await prepare_openai(plugin, session_id, pending, tool_schemas(tools))
    return None if sent is None else from_openai(sent, messages, pending)
