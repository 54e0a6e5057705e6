"""Engine -> LlamaIndex: the messages an LLM chat call receives instead of its own.

The one-line ``install()`` rewrites the ``messages`` of every outermost LLM chat span
(``chat`` / ``achat`` / ``stream_chat`` / ``astream_chat``): span handlers run before the
method body with the very list object the method receives, and no other LlamaIndex hook can
change an LLM's input for every call. A sync call is rewritten by the root dispatcher's span
handler (:func:`inject_sync`, the blocking engine inline); an async one by the async seam inside
its span (:func:`inject_async`, awaited on the caller's loop; see ``_seam``). The list is
rewritten in place and put back as it was when the call is over (see ``_handlers``), so a list
the application passed in itself is unchanged afterwards. ``wrap(llm)`` is the explicit seam:
it hands the wrapped LLM a new list and never touches the caller's.

Fail-open, never unredacted: the conversion of LlamaIndex messages to and from the kit's
OpenAI-style dicts runs inside the same guard as the engine. When the engine fails, the kit
returns the app's own messages redacted (:func:`ce.core.integration.prepare_openai_sync`);
when the conversion itself fails, the app's messages come back with their text blocks passed
through the configured redactor here. ``None`` (send the app's messages as they are) only when
redaction is off or failed too. With ``plugin.fail_closed`` every error is raised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import TextBlock

from ce.core.integration import (
    fail_open,
    fail_open_sync,
    prepare_openai,
    prepare_openai_sync,
)
from ce.llamaindex._convert import fingerprint, from_openai, to_openai, tool_schemas

if TYPE_CHECKING:
    from llama_index.core.base.llms.types import ChatMessage

    from ce.core.integration import Plugin

__all__ = ["inject_async", "inject_sync", "redacted_natively", "redacted_prompt"]


def redacted_prompt(plugin: Plugin, prompt: str) -> str:
    """A completion's ``prompt`` passed through the configured redactor (as it is when
    redaction is off). Raises what redaction raised."""
    redactor = plugin.engine.redactor_for(plugin.config)
    return prompt if redactor is None else redactor.redact_text(prompt).redacted_text


def redacted_natively(plugin: Plugin, messages: Sequence[ChatMessage]) -> list[ChatMessage] | None:
    """Copies of ``messages`` with the text of every text block passed through the configured
    redactor (``None`` when redaction is off). Raises what redaction raised."""
    redactor = plugin.engine.redactor_for(plugin.config)
    if redactor is None:
        return None
    out: list[ChatMessage] = []
    for message in messages:
        blocks = [
            TextBlock(text=redactor.redact_text(b.text).redacted_text)
            if isinstance(b, TextBlock)
            else b
            for b in message.blocks
        ]
        out.append(message.model_copy(update={"blocks": blocks}))
    return out


def _opaque(message: ChatMessage) -> bool:
    """Whether the engine cannot read ``message``: never (it reads text, images, audio and
    documents; other blocks are left out of what it is given)."""
    return False


def inject_sync(
    plugin: Plugin, session_id: str, messages: Sequence[ChatMessage], tools: Any = None
) -> list[ChatMessage] | None:
    """The messages the model receives instead of ``messages``: the engine's input for
    ``session_id``, or on failure the app's own redacted (``None``: send them as they are);
    the schemas of ``tools`` are counted against the budget. Raises the error with
    ``plugin.fail_closed``."""
    try:
        history = plugin.histories.convert(
            session_id, messages, to_openai, _opaque, fingerprint_of=fingerprint
        )
        pending = to_openai(messages) if history is None else history.pending
        schemas = tool_schemas(tools)
    except Exception as exc:
        return fail_open_sync(
            plugin, session_id, "convert messages", exc, lambda: redacted_natively(plugin, messages)
        )
    sent = prepare_openai_sync(plugin, session_id, pending, schemas, history=history, rewind=True)
    if sent is None:
        return None
    try:
        return from_openai(sent, messages, pending, history)
    except Exception as exc:
        return fail_open_sync(
            plugin, session_id, "convert messages", exc, lambda: redacted_natively(plugin, messages)
        )


async def inject_async(
    plugin: Plugin, session_id: str, messages: Sequence[ChatMessage], tools: Any = None
) -> list[ChatMessage] | None:
    """The coroutine twin of :func:`inject_sync`."""
    try:
        history = plugin.histories.convert(
            session_id, messages, to_openai, _opaque, fingerprint_of=fingerprint
        )
        pending = to_openai(messages) if history is None else history.pending
        schemas = tool_schemas(tools)
    except Exception as exc:
        return await fail_open(
            plugin, session_id, "convert messages", exc, lambda: redacted_natively(plugin, messages)
        )
    sent = await prepare_openai(plugin, session_id, pending, schemas, history=history, rewind=True)
    if sent is None:
        return None
    try:
        return from_openai(sent, messages, pending, history)
    except Exception as exc:
        return await fail_open(
            plugin, session_id, "convert messages", exc, lambda: redacted_natively(plugin, messages)
        )
