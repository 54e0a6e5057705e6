"""The explicit seam: ``wrap(model)`` is a chat model delegating to ``model`` that hands it the
engine's assembled input on every call, for LCEL / LangGraph apps that prefer not to patch
LangChain globally.

The wrapper injects in ``_generate`` / ``_agenerate`` / ``_stream`` / ``_astream``, where the
bound tools are visible (their schemas are counted against the budget). Its own run is the one
LangChain traces and the plugin records (usage, latency, the reply); the wrapped model is
called below the callbacks, so a call is recorded once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, ClassVar
from uuid import UUID

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig
from langchain_core.tools import BaseTool

from ce.langchain._inject import (
    _injected,
    already_injected,
    call_scope,
    current_config,
    inject_async,
    inject_sync,
    new_run_id,
    should_skip,
)
from ce.langchain._plugin import LangChainPlugin

__all__ = ["ContextEngineChatModel"]

_TOOLS_KEY = "ce_bound_tools"
"""Bound-kwarg carrying the tools given to :meth:`ContextEngineChatModel.bind_tools` (popped
before the wrapped model sees the call)."""

_RunManager = CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun

# The config of the wrapper's stream() / astream() call: LangChain's stream path calls
# ``_stream`` without the run manager (whose run's scope the other paths inject into); the
# config carries the run id the call's run takes.
_stream_config: ContextVar[RunnableConfig | None] = ContextVar("ce_wrap_stream", default=None)


def _with_run_id(config: RunnableConfig | None) -> RunnableConfig:
    """A copy of ``config`` naming the run id the call's run takes (a new one if none)."""
    copy = RunnableConfig(**(config or {}))
    if copy.get("run_id") is None:
        copy["run_id"] = new_run_id()
    return copy


class ContextEngineChatModel(BaseChatModel):
    """A chat model that sends ``inner`` the engine's assembled input instead of its own
    messages (see :func:`ce.langchain.wrap`). Without an installed plugin, inside
    :func:`ce.core.integration.suppressed`, for runs tagged ``"ce:skip"`` and under
    :func:`ce.langchain.middleware` (which injected already) it passes the call through."""

    inner: BaseChatModel
    """The wrapped chat model."""

    _ce_injects: ClassVar[bool] = True  # the global patch leaves this model's input alone

    @property
    def _llm_type(self) -> str:
        return f"context-engine:{self.inner._llm_type}"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"inner": self.inner._identifying_params}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        kwargs.pop(_TOOLS_KEY, None)
        params = self.inner._get_ls_params(stop=stop, **kwargs)
        if not params.get("ls_model_name"):
            name = getattr(self.inner, "model_name", None) or getattr(self.inner, "model", None)
            params["ls_model_name"] = str(name or self.inner._llm_type)
        return params

    def _should_stream(
        self, *, async_api: bool, run_manager: _RunManager | None = None, **kwargs: Any
    ) -> bool:
        kwargs.pop(_TOOLS_KEY, None)
        if self.disable_streaming is True:
            return False
        return self.inner._should_stream(async_api=async_api, run_manager=run_manager, **kwargs)

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        return self.inner.get_num_tokens_from_messages(messages, tools)

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The wrapped model's ``bind_tools`` (its provider-format kwargs), bound to this
        wrapper; the tools are kept to count their schemas against the budget."""
        bound = self.inner.bind_tools(tools, **kwargs)
        extra = {_TOOLS_KEY: list(tools)}
        if isinstance(bound, RunnableBinding) and bound.bound is self.inner:
            return self.bind(**bound.kwargs, **extra)
        if bound is self.inner:  # a model whose bind_tools is a no-op
            return self.bind(**extra)
        if isinstance(bound, BaseChatModel):  # a new model with the tools built in
            return self.model_copy(update={"inner": bound}).bind(**extra)
        raise TypeError(
            f"cannot wrap what {type(self.inner).__name__}.bind_tools returned "
            f"({type(bound).__name__}); wrap the tool-bound model's chat model instead"
        )

    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        config = _with_run_id(config)
        chunks = super().stream(input, config, stop=stop, **kwargs)
        try:
            while True:
                token = _stream_config.set(config)  # set per step, never across a yield
                try:
                    chunk = next(chunks, None)
                finally:
                    _stream_config.reset(token)
                if chunk is None:
                    return
                yield chunk
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        config = _with_run_id(config)
        chunks = super().astream(input, config, stop=stop, **kwargs)
        try:
            while True:
                token = _stream_config.set(config)
                try:
                    chunk = await anext(chunks, None)
                finally:
                    _stream_config.reset(token)
                if chunk is None:
                    return
                yield chunk
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()

    # -- injection --------------------------------------------------------------------------

    def _target(self, run_manager: _RunManager | None) -> tuple[LangChainPlugin, str] | None:
        """The plugin and session to inject into (the scope of this call's own run, which
        its callbacks are recorded into), or ``None`` to pass the call through."""
        plugin = LangChainPlugin()
        if _injected.get() or not plugin.installed:
            return None
        tags, metadata, _ = current_config()
        run_id: UUID | None
        if run_manager is not None:
            run_id, parent = run_manager.run_id, run_manager.parent_run_id
            tags = [*tags, *(run_manager.tags or [])]
            metadata = {**metadata, **(run_manager.metadata or {})}
        else:
            config = _stream_config.get() or {}
            run_id, parent = config.get("run_id"), None
            tags = [*tags, *(config.get("tags") or [])]
            metadata = {**metadata, **(config.get("metadata") or {})}
        tags = [*tags, *(self.tags or [])]
        metadata = {**metadata, **(self.metadata or {})}
        if should_skip(tags, metadata):
            return None
        scope = plugin.tracker.scope_of(run_id) if isinstance(run_id, UUID) else None
        if scope is None and run_manager is not None:
            scope = plugin.tracker.resolve(run_manager.run_id, parent, metadata, tags)
        elif scope is None:  # not followed (no handler saw the run): from the config
            scope = call_scope(plugin, _stream_config.get(), tags, metadata)
        return plugin, scope.session_id

    def _prepare_sync(
        self, messages: list[BaseMessage], run_manager: _RunManager | None, kwargs: dict[str, Any]
    ) -> list[BaseMessage]:
        tools = kwargs.pop(_TOOLS_KEY, None)
        target = self._target(run_manager)
        if target is None:
            return messages
        return inject_sync(target[0], target[1], messages, tools)

    async def _prepare_async(
        self, messages: list[BaseMessage], run_manager: _RunManager | None, kwargs: dict[str, Any]
    ) -> list[BaseMessage]:
        tools = kwargs.pop(_TOOLS_KEY, None)
        target = self._target(run_manager)
        if target is None:
            return messages
        return await inject_async(target[0], target[1], messages, tools)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        sent = self._prepare_sync(messages, run_manager, kwargs)
        with already_injected():
            return self.inner._generate(sent, stop=stop, run_manager=run_manager, **kwargs)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        sent = await self._prepare_async(messages, run_manager, kwargs)
        with already_injected():
            return await self.inner._agenerate(sent, stop=stop, run_manager=run_manager, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        sent = self._prepare_sync(messages, run_manager, kwargs)
        chunks = self.inner._stream(sent, stop=stop, run_manager=run_manager, **kwargs)
        while True:
            # marked injected only while the wrapped model runs, never across a yield
            with already_injected():
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        sent = await self._prepare_async(messages, run_manager, kwargs)
        chunks = self.inner._astream(sent, stop=stop, run_manager=run_manager, **kwargs)
        while True:
            with already_injected():
                chunk = await anext(chunks, None)
            if chunk is None:
                return
            yield chunk
