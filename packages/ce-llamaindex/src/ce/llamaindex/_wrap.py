"""The explicit seam: ``wrap(llm)`` is an LLM delegating to ``llm`` that hands it the engine's
assembled input on every chat call, as a new list (the caller's list is never touched).

The wrapper's chat methods are not decorated with LlamaIndex's ``llm_chat_callback``: the
wrapped LLM emits the chat events, once, with the messages it really received. Completions
(``complete`` and its async / streaming twins, which a provider may serve without a chat call:
``CondensePlusContextChatEngine``'s condense step on llama-index-llms-openai) go through the
engine too: the prompt is one user message of the call's scope (a completion is a prompt call,
so its own child scope), and the wrapped LLM receives that message's text as the engine
assembled it (redacted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.instrumentation.span import active_span_id
from llama_index.core.llms import LLM
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.tools.types import BaseTool

from ce.core.integration import is_suppressed
from ce.llamaindex._inject import inject_async, inject_sync
from ce.llamaindex._plugin import LlamaIndexPlugin

__all__ = ["ContextEngineLLM"]


class ContextEngineLLM(FunctionCallingLLM):
    """An LLM that sends ``inner`` the engine's assembled input instead of its own messages
    (see :func:`ce.llamaindex.wrap`), in the session the installed plugin resolves for the
    call by the same rule as the global injection (a call nested in a tool run or a prompt
    call gets its own child scope). Without an installed plugin and inside
    :func:`ce.core.integration.suppressed` it passes calls through unchanged."""

    inner: LLM
    """The wrapped LLM."""

    ce_injects: ClassVar[bool] = True  # the global span handler leaves this LLM's input alone

    @classmethod
    def class_name(cls) -> str:
        return "ContextEngineLLM"

    @property
    def metadata(self) -> LLMMetadata:
        return self.inner.metadata

    # -- injection --------------------------------------------------------------------------

    def _target(self) -> tuple[LlamaIndexPlugin, str] | None:
        """The plugin and the session of this call (its span's), or ``None`` to pass it
        through."""
        plugin = LlamaIndexPlugin()
        tracker = plugin.tracker
        if not plugin.installed or tracker is None:
            return None
        info = tracker.span(active_span_id.get())
        if info is None or info.call is None or info.call.skip:
            return None
        return plugin, info.call.session_id

    def _sent_sync(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> list[Any]:
        target = self._target()
        sent = None if target is None else inject_sync(*target, messages, kwargs.get("tools"))
        return list(messages) if sent is None else sent

    async def _sent_async(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> list[Any]:
        target = self._target()
        sent = None
        if target is not None:
            sent = await inject_async(*target, messages, kwargs.get("tools"))
        return list(messages) if sent is None else sent

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self.inner.chat(self._sent_sync(messages, kwargs), **kwargs)

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await self.inner.achat(await self._sent_async(messages, kwargs), **kwargs)

    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self.inner.stream_chat(self._sent_sync(messages, kwargs), **kwargs)

    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        return await self.inner.astream_chat(await self._sent_async(messages, kwargs), **kwargs)

    # -- completions: the prompt as one user message of the call's scope --------------------

    def _prompt_target(self) -> tuple[LlamaIndexPlugin, str] | None:
        plugin = LlamaIndexPlugin()
        tracker = plugin.tracker
        if not plugin.installed or tracker is None or is_suppressed():
            return None
        info = tracker.span(active_span_id.get())
        return None if info is None else (plugin, info.session_id)

    @staticmethod
    def _prompt_of(prompt: str, sent: list[ChatMessage] | None) -> str:
        users = [m for m in sent or () if m.role is MessageRole.USER]
        return prompt if not users else str(users[-1].content or "")

    def _prompt_sync(self, prompt: str) -> str:
        target = self._prompt_target()
        if target is None:
            return prompt
        sent = inject_sync(*target, [ChatMessage(role=MessageRole.USER, content=prompt)])
        return self._prompt_of(prompt, sent)

    async def _prompt_async(self, prompt: str) -> str:
        target = self._prompt_target()
        if target is None:
            return prompt
        sent = await inject_async(*target, [ChatMessage(role=MessageRole.USER, content=prompt)])
        return self._prompt_of(prompt, sent)

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self.inner.complete(self._prompt_sync(prompt), formatted, **kwargs)

    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        return await self.inner.acomplete(await self._prompt_async(prompt), formatted, **kwargs)

    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        return self.inner.stream_complete(self._prompt_sync(prompt), formatted, **kwargs)

    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        sent = await self._prompt_async(prompt)
        return await self.inner.astream_complete(sent, formatted, **kwargs)

    # -- delegation -------------------------------------------------------------------------

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The wrapped LLM's provider-specific request (tool specs, tool choice)."""
        return self._inner_fc()._prepare_chat_with_tools_compat(
            tools,
            user_msg=user_msg,
            chat_history=chat_history,
            verbose=verbose,
            allow_parallel_tool_calls=allow_parallel_tool_calls,
            tool_required=tool_required,
            **kwargs,
        )

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        return self._inner_fc()._validate_chat_with_tools_response(
            response, tools, allow_parallel_tool_calls, **kwargs
        )

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        return self._inner_fc().get_tool_calls_from_response(
            response, error_on_no_tool_call=error_on_no_tool_call, **kwargs
        )

    def _inner_fc(self) -> FunctionCallingLLM:
        if not isinstance(self.inner, FunctionCallingLLM):
            raise TypeError(f"{type(self.inner).__name__} does not call tools")
        return self.inner
