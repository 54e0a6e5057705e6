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
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.messages import BaseMessage, SystemMessage
from langchain_core.prompt_values import ChatPromptValue, PromptValue
from langchain_core.runnables.config import var_child_runnable_config

from ce.core.integration import (
    REDACTION_FAILED,
    Scope,
    emit_failure,
    emit_failure_sync,
    is_suppressed,
    prepare_openai,
    prepare_openai_sync,
)
from ce.langchain._convert import from_openai, message_text, to_openai, tool_schemas
from ce.langchain._scopes import messages_key, parent_run_id

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from ce.langchain._plugin import LangChainPlugin

__all__ = [
    "SKIP_METADATA_KEY",
    "SKIP_TAG",
    "already_injected",
    "call_scope",
    "current_config",
    "inject_async",
    "inject_sync",
    "make_convert_input",
    "make_middleware",
    "new_run_id",
    "should_skip",
]

SKIP_TAG = "ce:skip"
"""A model (or run) tagged with this is left alone: no injection, no recording."""
SKIP_METADATA_KEY = "ce_skip"
"""Metadata key with the same effect as :data:`SKIP_TAG` when true."""

# create_agent runs middleware hooks as graph nodes named "<Middleware>.<hook>"; model calls
# made there (the summarizer's, a tool selector's) are helper calls, not the agent's.
_HELPER_NODE_SUFFIXES = (".before_model", ".after_model", ".before_agent", ".after_agent")

# Set while a middleware / wrapper has already injected: the global patch then stays out.
_injected: ContextVar[bool] = ContextVar("ce_langchain_injected", default=False)
# The messages the patch handed out last in this context. Providers convert their input again
# inside ``_generate`` (langchain-openai's ``_get_request_payload`` does): that second
# conversion of the very same message objects must pass through, not be prepared again.
_handed_out: ContextVar[tuple[BaseMessage, ...]] = ContextVar("ce_langchain_handed_out", default=())


def _run_id_factory() -> Callable[[], UUID]:
    try:  # the run ids LangChain itself generates (uuid7 since langchain-core 1.1)
        from langchain_core.utils.uuid import uuid7
    except ImportError:  # pragma: no cover - older langchain-core
        return uuid.uuid4
    return uuid7


new_run_id: Callable[[], UUID] = _run_id_factory()
"""A run id like the ones LangChain generates."""


@contextmanager
def already_injected() -> Iterator[None]:
    token = _injected.set(True)
    try:
        yield
    finally:
        _injected.reset(token)


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


def call_scope(
    plugin: LangChainPlugin,
    config: Mapping[str, Any] | None,
    tags: Sequence[str],
    metadata: Mapping[str, Any],
    run_id: UUID | None = None,
) -> Scope:
    """The scope of a chat-model call about to run with ``config`` (its parent run is the
    config's callback manager's), registered for the handler under ``run_id``: the same
    scope the call's callbacks are recorded into."""
    return plugin.tracker.for_call(run_id, parent_run_id(config), metadata, tags)


def _redact_messages(plugin: LangChainPlugin, messages: list[BaseMessage]) -> list[BaseMessage]:
    """Copies of ``messages`` with their texts (string contents, text blocks, tool-call
    arguments) through the configured redactor; raises what redaction raised."""
    redactor = plugin.engine.redactor_for(plugin.config)
    if redactor is None:
        return messages

    def text(value: str) -> str:
        return redactor.redact_text(value).redacted_text

    def value(item: Any) -> Any:
        if isinstance(item, str):
            return text(item)
        if isinstance(item, dict):
            return {k: value(v) for k, v in item.items()}
        if isinstance(item, list):
            return [value(v) for v in item]
        return item

    out: list[BaseMessage] = []
    for message in messages:
        content = message.content
        update: dict[str, Any] = {
            "content": text(content)
            if isinstance(content, str)
            else [
                {**b, "text": text(b["text"])}
                if isinstance(b, dict) and isinstance(b.get("text"), str)
                else (text(b) if isinstance(b, str) else b)
                for b in content
            ]
        }
        calls = getattr(message, "tool_calls", None)
        if calls:
            update["tool_calls"] = [{**c, "args": value(c.get("args"))} for c in calls]
        out.append(message.model_copy(update=update))
    return out


def _fallback_sync(
    plugin: LangChainPlugin, session_id: str, messages: list[BaseMessage], exc: Exception
) -> list[BaseMessage]:
    """The app's own messages, redacted, after a failure of the plugin's own conversion."""
    if plugin.fail_closed:
        raise exc
    emit_failure_sync(plugin, session_id, "langchain message conversion", exc)
    try:
        return _redact_messages(plugin, messages)
    except Exception as error:
        emit_failure_sync(plugin, session_id, "redaction", error, REDACTION_FAILED)
        return messages


async def _fallback_async(
    plugin: LangChainPlugin, session_id: str, messages: list[BaseMessage], exc: Exception
) -> list[BaseMessage]:
    if plugin.fail_closed:
        raise exc
    await emit_failure(plugin, session_id, "langchain message conversion", exc)
    try:
        return _redact_messages(plugin, messages)
    except Exception as error:
        await emit_failure(plugin, session_id, "redaction", error, REDACTION_FAILED)
        return messages


def inject_sync(
    plugin: LangChainPlugin,
    session_id: str,
    messages: list[BaseMessage],
    tools: Sequence[Any] | None = None,
) -> list[BaseMessage]:
    """The messages the model receives instead of ``messages`` in ``session_id``; the schemas
    of the bound ``tools`` are counted against the budget. Fail-open, never unredacted: when
    the engine or the conversion fails, the app's own ``messages`` come back redacted (as
    they are only when redaction is off or failed too)."""
    try:
        pending = to_openai(messages)
        schemas = tool_schemas(tools)
    except Exception as exc:
        return _fallback_sync(plugin, session_id, messages, exc)
    sent = prepare_openai_sync(plugin, session_id, pending, schemas)
    if sent is None:
        return messages
    try:
        return from_openai(sent)
    except Exception as exc:
        return _fallback_sync(plugin, session_id, messages, exc)


async def inject_async(
    plugin: LangChainPlugin,
    session_id: str,
    messages: list[BaseMessage],
    tools: Sequence[Any] | None = None,
) -> list[BaseMessage]:
    """The coroutine twin of :func:`inject_sync`."""
    try:
        pending = to_openai(messages)
        schemas = tool_schemas(tools)
    except Exception as exc:
        return await _fallback_async(plugin, session_id, messages, exc)
    sent = await prepare_openai(plugin, session_id, pending, schemas)
    if sent is None:
        return messages
    try:
        return from_openai(sent)
    except Exception as exc:
        return await _fallback_async(plugin, session_id, messages, exc)


# The BaseChatModel methods that convert their input through ``_convert_input`` right after
# ``config = ensure_config(config)`` and pop ``config["run_id"]`` for the call's run later.
_ENTRY_POINTS = frozenset(
    {"invoke", "ainvoke", "stream", "astream", "_chat_model_stream_v3", "_achat_model_stream_v3"}
)


def _caller(model: BaseChatModel) -> tuple[Sequence[Any] | None, dict[str, Any] | None]:
    """The bound tools and the (ensured) run config of the call ``model._convert_input`` is
    converting for.

    ``bind_tools`` binds the tools as the ``tools`` kwarg, which reaches ``invoke`` /
    ``ainvoke`` / ``stream`` / ``astream`` (and ``_generate`` later) but not
    ``_convert_input``; they and the ``config`` dict (whose ``run_id`` the call's run takes)
    are read from that caller's locals, two frames up (the caller of the patched method).
    Anything unexpected there means no tools and no config."""
    frame = sys._getframe(2)
    try:
        if frame.f_code.co_name not in _ENTRY_POINTS or frame.f_locals.get("self") is not model:
            return None, None
        kwargs = frame.f_locals.get("kwargs")
        config = frame.f_locals.get("config")
    finally:
        del frame
    tools = kwargs.get("tools") if isinstance(kwargs, dict) else None
    tools = tools if isinstance(tools, (list, tuple)) and tools else None
    return tools, config if isinstance(config, dict) else None


def make_convert_input(
    plugin: LangChainPlugin,
) -> Callable[[Callable[[Any, Any], PromptValue]], Callable[[Any, Any], PromptValue]]:
    """The ledger's replacement factory for ``BaseChatModel._convert_input``.

    The call's scope comes from its run config (the parent run and the metadata); the call
    gets its run id here (put into the caller's ensured config, which LangChain pops for the
    run) so the handler records the call into the scope it was assembled in."""

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
            tools, config = _caller(self)
            if config is None:
                config = dict(var_child_runnable_config.get() or {})
                run_id = None
            else:
                run_id = config.get("run_id")
                if run_id is None:
                    run_id = config["run_id"] = new_run_id()
            tags = [*(config.get("tags") or []), *(self.tags or [])]
            metadata = {**(config.get("metadata") or {}), **(self.metadata or {})}
            if should_skip(tags, metadata):
                return value
            scope = call_scope(
                plugin, config, tags, metadata, run_id if isinstance(run_id, UUID) else None
            )
            sent = inject_sync(plugin, scope.session_id, messages, tools)
            if not isinstance(run_id, UUID) and sent:
                # no run id to find the scope by: the handler finds it by these very messages
                plugin.tracker.remember(messages_key(sent), scope, tuple(sent))
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


def make_middleware(plugin: LangChainPlugin) -> Any:
    """A ``create_agent`` middleware that injects through ``wrap_model_call``, into the scope
    of the model node's run (the one the model call's callbacks are recorded into)."""
    from langchain.agents.middleware import AgentMiddleware, ModelRequest

    def _session(request: ModelRequest) -> str:
        from langgraph.config import get_config

        try:
            config = get_config()
        except RuntimeError:
            config = {}
        tags = list(config.get("tags") or [])
        metadata = dict(config.get("metadata") or {})
        return call_scope(plugin, config, tags, metadata).session_id

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
