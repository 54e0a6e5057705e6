"""Engine -> Semantic Kernel: the messages each chat-completion request sends instead of its
own.

Why this seam: no SK filter sees each model request. PROMPT_RENDERING runs once per prompt
function (never for an agent or a direct service call); the AUTO_FUNCTION_INVOCATION filter
runs around each function call, before the tool result is appended, and an edit of its
``chat_history`` corrupts an agent thread (SK copies new messages into the thread by index).
Every connector's request goes through the base class's auto-function-calling loop
(``ChatCompletionClientBase.get_chat_message_contents`` /
``get_streaming_chat_message_contents``), which calls the service's
``_inner_get_chat_message_contents`` / ``_inner_get_streaming_chat_message_contents`` once
per round with the same, growing ``ChatHistory``. Connectors override those inner methods,
so they are wrapped per service instance (set in the instance's ``__dict__`` with
``object.__setattr__``, which bypasses pydantic's validated assignment), on the service's
first public call while installed: the services of every kernel, those built before
``install()`` and those ``select_ai_service`` returns later. ``uninstall()`` removes exactly
these instance entries.

Each round the wrapper hands the engine the request's messages (awaited on the caller's loop,
no blocking bridge, through :func:`ce.core.integration.prepare_openai`) and sends a NEW
``ChatHistory`` with the engine's input; the app's ``ChatHistory`` is never changed. A request
continuing the session's previous one (the loop's next round, the app's next turn on the same
``ChatHistory``) is converted only for its new messages (``plugin.histories``). After
the round it records the reply, its usage (``metadata["usage"]``, normalised across
connectors; streamed: the extra empty chunk OpenAI sends since SK asks for
``include_usage``) and its latency. SK's internal calls (a summarization reducer, a group
chat's strategy prompt) are recorded only (child scope, see ``_scopes``), their messages
passed through the configured redactor.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

from ce.core.integration import fail_open, is_suppressed, prepare_openai, redact_openai
from ce.core.schema import ModelUsageStage
from ce.semantic_kernel._convert import (
    Pending,
    SummaryTexts,
    author,
    continued,
    conversation,
    fingerprint,
    from_sent,
    message_text,
    normalise_usage,
    opaque,
    reply_to_message,
    to_openai,
    to_pending,
    tool_schemas,
)
from ce.semantic_kernel._record import model_call, write
from ce.semantic_kernel._scopes import CallSite, call_site

if TYPE_CHECKING:
    from ce.core.integration import History, Plugin
    from ce.core.schema import Author

__all__ = ["INNER", "INNER_STREAM", "Seam"]

INNER = "_inner_get_chat_message_contents"
INNER_STREAM = "_inner_get_streaming_chat_message_contents"


class Seam:
    """The per-request hook of one install: what a wrapped inner method does."""

    def __init__(self, plugin: Plugin, inject: bool) -> None:
        self.plugin = plugin
        self.inject = inject
        self.summaries = SummaryTexts()  # the summarization reducers' (see ``_pending``)

    def _pending(
        self, site: CallSite, messages: list[Any]
    ) -> tuple[Pending, History | None, list[Author | None] | None]:
        """The request's messages as the engine reads them, the converted history the engine
        is handed them from (None: from their dicts, converted again) and their authors
        (None: no message has one). Raises what the conversion raises.

        A summarization reducer's summary (marked, or the text of one a reducer made: see
        :func:`conversation`) is left out where the session holds the turns it summarizes:
        a session named for the conversation. In a
        scope no session names (a direct service call is a run of its own), the session never
        held them: the summary is the only copy of what they said, and goes as SK sends it."""
        session_id = site.session_id
        if site.scope.named:
            messages = conversation(messages, self.summaries)
        history = self.plugin.histories.convert(
            session_id, messages, to_openai, opaque, author, fingerprint_of=fingerprint
        )
        if history is None:
            pending = to_pending(messages)
            return pending, None, pending.authors
        pending = continued(history)
        if len(pending.messages) < len(history.app):  # handed without the repeats
            return pending, None, pending.authors
        return pending, history, None  # the history's messages carry their authors

    # -- before ----------------------------------------------------------------------------

    async def request(self, site: CallSite, history: Any, settings: Any) -> Any:
        """The ``ChatHistory`` the request sends: the engine's input (an internal call: the
        app's own, redacted), or on failure the app's own redacted; ``history`` itself when
        they go as they are."""
        plugin, session_id = self.plugin, site.session_id
        messages = list(history.messages)
        redactor = plugin.engine.redactor_for(plugin.config)

        def redact() -> Any:
            if redactor is None:
                return None
            pending = to_pending(messages)
            return from_sent(redact_openai(pending.dicts, redactor), pending)

        if not self.inject and not site.internal:
            await self._note_pending(site, messages, settings)
            return history
        if site.internal:
            try:
                redacted = redact()
            except Exception as exc:
                redacted = await fail_open(plugin, session_id, "redact", exc, redact)
            return history if redacted is None else redacted
        try:
            pending, converted, authors = self._pending(site, messages)
            schemas = tool_schemas(settings)
        except Exception as exc:
            own = await fail_open(plugin, session_id, "convert messages", exc, redact)
            return history if own is None else own
        sent = await prepare_openai(
            plugin, session_id, pending.dicts, schemas, authors, history=converted, rewind=True
        )
        if sent is None:
            return history
        try:
            return from_sent(sent, pending, converted)
        except Exception as exc:
            own = await fail_open(plugin, session_id, "convert messages", exc, redact)
            return history if own is None else own

    async def _note_pending(self, site: CallSite, messages: list[Any], settings: Any) -> None:
        """``inject=False``: the engine records the request's messages (fail-open), the model
        gets the app's own, as they are."""
        try:
            pending, converted, authors = self._pending(site, messages)
            schemas = tool_schemas(settings)
        except Exception as exc:
            await fail_open(self.plugin, site.session_id, "convert messages", exc, lambda: None)
            return
        await prepare_openai(
            self.plugin, site.session_id, pending.dicts, schemas, authors, history=converted
        )

    # -- after -----------------------------------------------------------------------------

    async def record(
        self,
        site: CallSite,
        replies: list[Any],
        usage: Any,
        started: float,
        first_token: float | None,
        error: BaseException | None,
    ) -> None:
        service = site.service
        reply = replies[0] if replies else None
        text = message_text(reply) if reply is not None else ""
        model = None
        if reply is not None and getattr(reply, "ai_model_id", None):
            model = str(reply.ai_model_id)
        stage = ModelUsageStage.OTHER
        if site.internal == "summarize":
            stage = ModelUsageStage.SUMMARIZE
        elif site.internal:
            stage = ModelUsageStage.ROUTE
        call = model_call(
            service, normalise_usage(usage), started, first_token, text, stage, error, model
        )
        message = None
        if reply is not None and not site.internal:
            message = reply_to_message(reply, site.agent, call.provider, call.model)
        await write(
            self.plugin,
            site.session_id,
            "record model call",
            lambda r: r.record_model_call(call, message),
        )

    # -- the wrappers ----------------------------------------------------------------------

    def _site(self, service: Any) -> CallSite | None:
        site = call_site.get()
        if site is None or site.service is not service or is_suppressed():
            return None
        if not self.plugin.installed:
            return None
        return site

    def wrap_inner(self, service: Any, original: Callable[..., Any]) -> Callable[..., Any]:
        """``service``'s non-streaming inner method, sending the engine's input."""
        seam = self

        async def _inner_get_chat_message_contents(
            chat_history: Any, settings: Any, *args: Any, **kwargs: Any
        ) -> Any:
            site = seam._site(service)
            if site is None:
                return await original(chat_history, settings, *args, **kwargs)
            sent = await seam.request(site, chat_history, settings)
            started = time.perf_counter()
            try:
                replies = await original(sent, settings, *args, **kwargs)
            except Exception as exc:
                await seam.record(site, [], None, started, None, exc)
                raise
            reply = replies[0] if replies else None
            usage = reply.metadata.get("usage") if reply is not None else None
            await seam.record(site, list(replies or ()), usage, started, None, None)
            return replies

        _inner_get_chat_message_contents.ce_wrapped = True  # type: ignore[attr-defined]
        return _inner_get_chat_message_contents

    def wrap_inner_stream(
        self, service: Any, original: Callable[..., Any]
    ) -> Callable[..., AsyncGenerator[Any, None]]:
        """``service``'s streaming inner method, sending the engine's input."""
        seam = self

        async def _inner_get_streaming_chat_message_contents(
            chat_history: Any, settings: Any, *args: Any, **kwargs: Any
        ) -> AsyncGenerator[Any, None]:
            site = seam._site(service)
            if site is None:
                async for chunks in original(chat_history, settings, *args, **kwargs):
                    yield chunks
                return
            sent = await seam.request(site, chat_history, settings)
            started = time.perf_counter()
            first: float | None = None
            usage: Any = None
            parts: list[Any] = []
            try:
                async for chunks in original(sent, settings, *args, **kwargs):
                    if first is None:
                        first = time.perf_counter()
                    for chunk in chunks or ():
                        if chunk is None:
                            continue
                        if chunk.metadata.get("usage") is not None:
                            usage = chunk.metadata["usage"]
                        if getattr(chunk, "choice_index", 0) == 0:
                            parts.append(chunk)
                    yield chunks
            except Exception as exc:
                await seam.record(site, [], usage, started, first, exc)
                raise
            await seam.record(
                site, [_combined(parts)] if parts else [], usage, started, first, None
            )

        _inner_get_streaming_chat_message_contents.ce_wrapped = True  # type: ignore[attr-defined]
        return _inner_get_streaming_chat_message_contents


def _combined(parts: list[Any]) -> Any:
    """The streamed chunks of one choice added up (as SK's loop adds them)."""
    total = parts[0]
    for part in parts[1:]:
        try:
            total = total + part
        except Exception:  # chunks SK refuses to add (another choice, another role)
            continue
    return total
