"""Engine -> LangChain: the assembled input replaces the chat model's input before every call.

Two seams. The one-line ``install()`` wraps ``BaseChatModel._convert_input``: LangChain has no
public hook that can change a chat model's input for every call, and ``invoke``, ``ainvoke``,
``stream`` and ``astream`` all convert their input through this one method before any callback
fires (so traces show what the model really received). ``middleware()`` uses the official
``create_agent`` seam, ``wrap_model_call`` / ``awrap_model_call``, and is ephemeral like
LangChain's ``ContextEditingMiddleware`` (the graph state keeps the app's own messages).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage, SystemMessage
from langchain_core.prompt_values import ChatPromptValue, PromptValue
from langchain_core.runnables.config import var_child_runnable_config

from ce.core.integration import (
    is_suppressed,
    prepare_openai,
    prepare_openai_sync,
    resolve_session,
)
from ce.langchain._convert import from_openai, message_text, to_openai, tool_schemas

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from ce.core.integration import Plugin

__all__ = [
    "SKIP_METADATA_KEY",
    "SKIP_TAG",
    "already_injected",
    "current_config",
    "framework_session",
    "inject_async",
    "inject_sync",
    "make_convert_input",
    "make_middleware",
    "should_skip",
]

SKIP_TAG = "ce:skip"
"""A model (or run) tagged with this is left alone: no injection, no recording."""
SKIP_METADATA_KEY = "ce_skip"
"""Metadata key with the same effect as :data:`SKIP_TAG` when true."""
SESSION_METADATA_KEY = "ce_session_id"
"""Run-config metadata naming the session explicitly (wins over ``thread_id``)."""

# create_agent runs middleware hooks as graph nodes named "<Middleware>.<hook>"; model calls
# made there (the summarizer's, a tool selector's) are helper calls, not the agent's.
_HELPER_NODE_SUFFIXES = (".before_model", ".after_model", ".before_agent", ".after_agent")

# Set while a middleware / wrapper has already injected: the global patch then stays out.
_injected: ContextVar[bool] = ContextVar("ce_langchain_injected", default=False)
# The messages the patch handed out last in this context. Providers convert their input again
# inside ``_generate`` (langchain-openai's ``_get_request_payload`` does): that second
# conversion of the very same message objects must pass through, not be prepared again.
_handed_out: ContextVar[tuple[BaseMessage, ...]] = ContextVar("ce_langchain_handed_out", default=())


@contextmanager
def already_injected() -> Iterator[None]:
    token = _injected.set(True)
    try:
        yield
    finally:
        _injected.reset(token)


def framework_session(
    metadata: Mapping[str, Any] | None, configurable: Mapping[str, Any] | None = None
) -> str | None:
    """The session LangChain names for a run: metadata ``ce_session_id``, else the LangGraph
    ``thread_id`` (configurable or metadata)."""
    for source in (metadata or {}, configurable or {}):
        for key in (SESSION_METADATA_KEY, "thread_id"):
            value = source.get(key)
            if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
                return str(value)
    return None


def should_skip(
    tags: Sequence[str] | None, metadata: Mapping[str, Any] | None, *, check_node: bool = True
) -> bool:
    """Whether a run is left alone: suppressed context, the skip tag or metadata, or (with
    ``check_node``) a model call made inside a ``create_agent`` middleware hook node."""
    if is_suppressed():
        return True
    if tags and SKIP_TAG in tags:
        return True
    metadata = metadata or {}
    if metadata.get(SKIP_METADATA_KEY):
        return True
    node = metadata.get("langgraph_node")
    return check_node and isinstance(node, str) and node.endswith(_HELPER_NODE_SUFFIXES)


def current_config() -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    config = var_child_runnable_config.get() or {}
    return (
        list(config.get("tags") or []),
        dict(config.get("metadata") or {}),
        dict(config.get("configurable") or {}),
    )


def inject_sync(
    plugin: Plugin,
    session_id: str,
    messages: list[BaseMessage],
    tools: Sequence[Any] | None = None,
) -> list[BaseMessage]:
    """The messages the model receives instead of ``messages`` (themselves on failure);
    the schemas of the bound ``tools`` are counted against the budget."""
    sent = prepare_openai_sync(plugin, session_id, to_openai(messages), tool_schemas(tools))
    return messages if sent is None else from_openai(sent)


async def inject_async(
    plugin: Plugin,
    session_id: str,
    messages: list[BaseMessage],
    tools: Sequence[Any] | None = None,
) -> list[BaseMessage]:
    """The coroutine twin of :func:`inject_sync`."""
    sent = await prepare_openai(plugin, session_id, to_openai(messages), tool_schemas(tools))
    return messages if sent is None else from_openai(sent)


_ENTRY_POINTS = frozenset({"invoke", "ainvoke", "stream", "astream"})


def _caller_tools(model: BaseChatModel) -> Sequence[Any] | None:
    """The tools bound to the call ``model._convert_input`` is converting for.

    ``bind_tools`` binds them as the ``tools`` kwarg, which reaches ``invoke`` / ``ainvoke``
    / ``stream`` / ``astream`` (and ``_generate`` later) but not ``_convert_input``; they are
    read from that caller's ``kwargs``, two frames up (the caller of the patched method).
    Anything unexpected there means no tools (the budget then just ignores them)."""
    frame = sys._getframe(2)
    try:
        if frame.f_code.co_name not in _ENTRY_POINTS or frame.f_locals.get("self") is not model:
            return None
        kwargs = frame.f_locals.get("kwargs")
    finally:
        del frame
    tools = kwargs.get("tools") if isinstance(kwargs, dict) else None
    return tools if isinstance(tools, (list, tuple)) and tools else None


def make_convert_input(
    plugin: Plugin,
) -> Callable[[Callable[[Any, Any], PromptValue]], Callable[[Any, Any], PromptValue]]:
    """The ledger's replacement factory for ``BaseChatModel._convert_input``."""

    def factory(
        original: Callable[[BaseChatModel, Any], PromptValue],
    ) -> Callable[[BaseChatModel, Any], PromptValue]:
        def _convert_input(self: BaseChatModel, model_input: Any) -> PromptValue:
            value = original(self, model_input)
            if _injected.get() or not plugin.installed or getattr(self, "_ce_injects", False):
                return value
            messages = value.to_messages()
            last = _handed_out.get()
            if len(last) == len(messages) and all(
                a is b for a, b in zip(last, messages, strict=True)
            ):
                return value
            tags, metadata, configurable = current_config()
            own_tags = list(self.tags or [])
            own_metadata = dict(self.metadata or {})
            if should_skip([*tags, *own_tags], {**metadata, **own_metadata}):
                return value
            session_id = resolve_session(framework_session(metadata, configurable), plugin)
            sent = inject_sync(plugin, session_id, messages, _caller_tools(self))
            _handed_out.set(tuple(sent))
            return ChatPromptValue(messages=sent)

        _convert_input.__wrapped__ = original  # type: ignore[attr-defined]
        return _convert_input

    return factory


def _split_system(messages: list[BaseMessage]) -> tuple[SystemMessage | None, list[BaseMessage]]:
    system = [m for m in messages if isinstance(m, SystemMessage)]
    rest = [m for m in messages if not isinstance(m, SystemMessage)]
    if not system:
        return None, rest
    if len(system) == 1:
        return system[0], rest
    return SystemMessage(content="\n\n".join(str(m.content) for m in system)), rest


def make_middleware(plugin: Plugin) -> Any:
    """A ``create_agent`` middleware that injects through ``wrap_model_call``."""
    from langchain.agents.middleware import AgentMiddleware, ModelRequest

    def _session(request: ModelRequest) -> str:
        from langgraph.config import get_config

        try:
            config = get_config()
        except RuntimeError:
            config = {}
        return resolve_session(
            framework_session(config.get("metadata"), config.get("configurable")), plugin
        )

    # langchain < 1.1's ModelRequest has a ``system_prompt`` string, later ones a
    # ``system_message`` (and ``system_prompt`` as its text).
    has_system_message = hasattr(ModelRequest, "system_message") or (
        "system_message" in getattr(ModelRequest, "__dataclass_fields__", {})
    )

    def _pending(request: ModelRequest) -> list[BaseMessage]:
        if has_system_message:
            system_message = request.system_message
        else:
            prompt = getattr(request, "system_prompt", None)
            system_message = SystemMessage(content=prompt) if prompt else None
        system = [system_message] if system_message is not None else []
        return [*system, *request.messages]

    def _override(request: ModelRequest, messages: list[BaseMessage]) -> ModelRequest:
        system, rest = _split_system(messages)
        if has_system_message:
            return request.override(system_message=system, messages=rest)  # type: ignore[arg-type]
        prompt = None if system is None else message_text(system)
        overrides: dict[str, Any] = {"system_prompt": prompt, "messages": rest}
        return request.override(**overrides)

    def _leave_alone(request: ModelRequest) -> bool:
        return not plugin.installed or should_skip(None, None)

    class ContextEngineMiddleware(AgentMiddleware):
        """Replaces the model request's messages with the engine's assembled input."""

        def wrap_model_call(self, request: ModelRequest, handler: Callable[..., Any]) -> Any:
            if _leave_alone(request):
                return handler(request)
            sent = inject_sync(plugin, _session(request), _pending(request), request.tools)
            with already_injected():
                return handler(_override(request, sent))

        async def awrap_model_call(
            self, request: ModelRequest, handler: Callable[..., Awaitable[Any]]
        ) -> Any:
            if _leave_alone(request):
                return await handler(request)
            sent = await inject_async(plugin, _session(request), _pending(request), request.tools)
            with already_injected():
                return await handler(_override(request, sent))

    return ContextEngineMiddleware()
