"""The one-line ``install()`` seams: where the global patch hands a chat model the engine's input.

LangChain has no public hook that can change a chat model's input on every call, so the plugin
wraps (in its ``PatchLedger``) the framework's own entry points, each on the face of the engine
that matches it:

- **sync** (``invoke``, ``stream``, ``batch``, sync LangGraph runs): the wrapped
  ``BaseChatModel._convert_input``, the conversion these paths run before any callback fires,
  prepares the call inline through ``engine.sync`` (no thread hop, no event loop);
- **async** (``ainvoke``, ``astream``, ``abatch``, async ``create_agent`` / LangGraph runs): the
  wrapped ``BaseChatModel.ainvoke`` / ``astream`` *await* the engine on the caller's loop, then
  call the original with the assembled :class:`ChatPromptValue`, marked as prepared so the
  conversion patch lets it through. Why there: ``_convert_input`` is synchronous and cannot
  await, and ``ainvoke`` / ``astream`` are the outermost coroutines of every async call that
  see its input, config and bound tools before its run (and its callbacks) start, so the run
  id the call's run takes can still be chosen (the handler records the call into the scope it
  was assembled in).

A subclass that overrides ``ainvoke`` / ``astream`` without calling them still has its input
prepared, by the conversion patch (inline, blocking). ``astream_events(version="v3")`` (beta)
goes through that seam too. Providers convert their input once more inside ``_generate``
(langchain-openai's ``_get_request_payload`` does): the conversion patch recognises that
second conversion of a call already prepared and lets it through.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.messages import BaseMessage
from langchain_core.prompt_values import ChatPromptValue, PromptValue
from langchain_core.runnables.config import ensure_config, var_child_runnable_config

from ce.core.integration import Scope
from ce.langchain._inject import (
    _injected,
    already_injected,
    call_scope,
    inject_async,
    inject_sync,
    new_run_id,
    should_skip,
)
from ce.langchain._scopes import messages_key, parent_run_id, set_blocking

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from ce.langchain._plugin import LangChainPlugin

__all__ = ["make_ainvoke", "make_astream", "make_convert_input"]

# The messages handed out last in this context (a provider converting them again inside its
# ``_generate`` is let through), and the prompt value an async entry point prepared for the
# call it is making (set only while that call runs, one step at a time for a stream).
_handed_out: ContextVar[tuple[BaseMessage, ...]] = ContextVar("ce_langchain_handed_out", default=())
_prepared: ContextVar[PromptValue | None] = ContextVar("ce_langchain_prepared", default=None)
_END = object()  # the end of a stream

# The BaseChatModel methods that convert their input through ``_convert_input`` right after
# ``config = ensure_config(config)`` and pop ``config["run_id"]`` for the call's run later.
_ENTRY_POINTS = frozenset(
    {"invoke", "ainvoke", "stream", "astream", "_chat_model_stream_v3", "_achat_model_stream_v3"}
)


def _caller(model: BaseChatModel) -> tuple[bool, Sequence[Any] | None, dict[str, Any] | None]:
    """Whether the patched ``model._convert_input`` converts for one of ``model``'s entry
    points, and then its bound tools and (ensured) run config.

    ``bind_tools`` binds the tools as the ``tools`` kwarg, which reaches ``invoke`` /
    ``stream`` (and ``_generate`` later) but not ``_convert_input``; they and the ``config``
    dict (whose ``run_id`` the call's run takes) are read from that caller's locals, two
    frames up (the caller of the patched method). Anything unexpected there means no tools
    and no config."""
    frame = sys._getframe(2)
    try:
        if frame.f_code.co_name not in _ENTRY_POINTS or frame.f_locals.get("self") is not model:
            return False, None, None
        kwargs = frame.f_locals.get("kwargs")
        config = frame.f_locals.get("config")
    finally:
        del frame
    return True, _bound_tools(kwargs), config if isinstance(config, dict) else None


def _bound_tools(kwargs: object) -> Sequence[Any] | None:
    tools = kwargs.get("tools") if isinstance(kwargs, dict) else None
    return tools if isinstance(tools, (list, tuple)) and tools else None


def _handed(messages: Sequence[BaseMessage]) -> bool:
    last = _handed_out.get()
    return len(last) == len(messages) and all(a is b for a, b in zip(last, messages, strict=True))


def _scope(
    plugin: LangChainPlugin,
    model: BaseChatModel,
    config: dict[str, Any] | None,
    messages: Sequence[BaseMessage],
) -> tuple[Scope, UUID | None] | None:
    """The scope of a call of ``model`` with the ensured ``config`` (``None``: unknown, the
    current run config stands for it) and the run id it gets (put into ``config``, which
    LangChain pops for the call's run, so the handler records the call into the scope it is
    assembled in); ``None`` when the call is left alone."""
    if config is None:
        config = dict(var_child_runnable_config.get() or {})
        run_id = None
    else:
        run_id = config.get("run_id")
        if run_id is None:
            run_id = config["run_id"] = new_run_id()
    tags = [*(config.get("tags") or []), *(model.tags or [])]
    metadata = {**(config.get("metadata") or {}), **(model.metadata or {})}
    # a config of the call's own replaces the run metadata naming the graph node it runs in:
    # a middleware hook node is found from the call's parent run as well
    if should_skip(tags, metadata) or plugin.tracker.in_hook(parent_run_id(config)):
        return None
    run_id = run_id if isinstance(run_id, UUID) else None
    return call_scope(plugin, config, tags, metadata, run_id, messages), run_id


# whether a chat model class injects its own input (``ce.langchain.wrap``), by class: a
# missing attribute, on a pydantic model or its class, is answered by a ``__getattr__`` that
# raises (microseconds on every call)
_SELF_INJECTING: dict[type, bool] = {}


def _leave_alone(plugin: LangChainPlugin, model: BaseChatModel) -> bool:
    if _injected.get() or not plugin.installed:
        return True
    cls = type(model)
    injects = _SELF_INJECTING.get(cls)
    if injects is None:
        injects = _SELF_INJECTING[cls] = bool(getattr(cls, "_ce_injects", False))
    return injects


def make_convert_input(
    plugin: LangChainPlugin,
) -> Callable[[Callable[[Any, Any], PromptValue]], Callable[[Any, Any], PromptValue]]:
    """The ledger's replacement factory for ``BaseChatModel._convert_input``: the sync seam
    (and the safety net of an async entry point a subclass overrides)."""

    def factory(
        original: Callable[[BaseChatModel, Any], PromptValue],
    ) -> Callable[[BaseChatModel, Any], PromptValue]:
        def _convert_input(self: BaseChatModel, model_input: Any) -> PromptValue:
            value = original(self, model_input)
            if _leave_alone(plugin, self) or model_input is _prepared.get():
                return value
            messages = value.to_messages()
            entry, tools, config = _caller(self)
            if not entry and _handed(messages):
                # a provider converting a prepared call's input again (ChatOpenAI builds its
                # request payload so, in ``ainvoke`` and ``astream`` too): not an entry point,
                # so it says nothing of whether the call blocks; an entry point is a new call
                # even with the very objects handed out last (the app's own ones)
                return value
            set_blocking(True)  # a blocking entry point: its records are written inline
            target = _scope(plugin, self, config, messages)
            if target is None:
                return value
            scope, run_id = target
            sent = inject_sync(plugin, scope.session_id, messages, tools)
            if run_id is None and sent:
                # no run id to find the scope by: the handler finds it by these very messages
                plugin.tracker.remember(messages_key(sent), scope, tuple(sent))
            _handed_out.set(tuple(sent))
            return ChatPromptValue(messages=sent)

        _convert_input.__wrapped__ = original  # type: ignore[attr-defined]
        return _convert_input

    return factory


async def _prepare(
    plugin: LangChainPlugin,
    model: BaseChatModel,
    model_input: Any,
    config: Any,
    kwargs: dict[str, Any],
) -> tuple[ChatPromptValue, dict[str, Any]] | None:
    """The engine's input for an async call of ``model`` (awaited on the caller's loop) and
    the ensured config naming the call's run id; ``None`` to pass the call through."""
    if _leave_alone(plugin, model) or model_input is _prepared.get():
        return None
    set_blocking(False)  # an async entry point: its records are queued on the loop
    try:
        with already_injected():  # the conversion patch stays out of this one
            messages = model._convert_input(model_input).to_messages()
        ensured = dict(ensure_config(config))
    except Exception:  # the original call raises the app's own error for bad input
        return None
    target = _scope(plugin, model, ensured, messages)
    if target is None:
        return None
    sent = await inject_async(plugin, target[0].session_id, messages, _bound_tools(kwargs))
    return ChatPromptValue(messages=sent), ensured


@contextmanager
def _marked(value: ChatPromptValue) -> Iterator[None]:
    """While the original entry point runs (one step of it, for a stream): ``value`` is the
    prepared input the conversion patch lets through, its messages the ones handed out."""
    prepared, handed = _prepared.set(value), _handed_out.set(tuple(value.messages))
    try:
        yield
    finally:
        _handed_out.reset(handed)
        _prepared.reset(prepared)


def make_ainvoke(
    plugin: LangChainPlugin,
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """The ledger's replacement factory for ``BaseChatModel.ainvoke``: awaits the engine,
    then the original with the prepared input."""

    def factory(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def ainvoke(
            self: BaseChatModel,
            input: Any,
            config: Any = None,
            *,
            stop: list[str] | None = None,
            **kwargs: Any,
        ) -> Any:
            prepared = await _prepare(plugin, self, input, config, kwargs)
            if prepared is None:
                return await original(self, input, config, stop=stop, **kwargs)
            value, ensured = prepared
            with _marked(value):
                return await original(self, value, ensured, stop=stop, **kwargs)

        ainvoke.__wrapped__ = original  # type: ignore[attr-defined]
        return ainvoke

    return factory


def make_astream(
    plugin: LangChainPlugin,
) -> Callable[[Callable[..., AsyncIterator[Any]]], Callable[..., AsyncIterator[Any]]]:
    """The ledger's replacement factory for ``BaseChatModel.astream``: awaits the engine
    before the first chunk, then streams the original's chunks for the prepared input (marked
    prepared one step at a time, never across a yield: the consumer may change tasks)."""

    def factory(original: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        async def astream(
            self: BaseChatModel,
            input: Any,
            config: Any = None,
            *,
            stop: list[str] | None = None,
            **kwargs: Any,
        ) -> AsyncIterator[Any]:
            prepared = await _prepare(plugin, self, input, config, kwargs)
            if prepared is None:
                chunks = original(self, input, config, stop=stop, **kwargs)
                value = None
            else:
                value, ensured = prepared
                chunks = original(self, value, ensured, stop=stop, **kwargs)
            try:
                while True:
                    if value is None:
                        chunk = await anext(chunks, _END)
                    else:
                        with _marked(value):
                            chunk = await anext(chunks, _END)
                    if chunk is _END:
                        return
                    yield chunk
            finally:
                await chunks.aclose()  # type: ignore[attr-defined]

        astream.__wrapped__ = original  # type: ignore[attr-defined]
        return astream

    return factory
