"""Engine -> LangChain: the engine's assembled input for a chat model's call, on either face of
the engine (:func:`inject_sync` inline through ``engine.sync``, :func:`inject_async` awaited on
the caller's loop), handed back as the app's own message objects where the engine kept them
(:func:`ce.langchain._convert.reconcile`).

The seams that call them: the one-line ``install()`` patches in :mod:`ce.langchain._patch`;
``middleware()`` here, through the official ``create_agent`` seam ``wrap_model_call`` /
``awrap_model_call``, ephemeral like LangChain's ``ContextEditingMiddleware`` (the graph state
keeps the app's own messages); ``wrap()`` in :mod:`ce.langchain._wrap`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.runnables.config import var_child_runnable_config

from ce.core.integration import (
    Recorder,
    Scope,
    ToolRun,
    fail_open,
    fail_open_sync,
    is_suppressed,
    prepare_openai,
    prepare_openai_sync,
    record_sync,
)
from ce.langchain._convert import (
    failed_results,
    fingerprint,
    in_conversation,
    message_text,
    opaque,
    reconcile,
    to_openai,
    tool_schemas,
)
from ce.langchain._scopes import in_blocking_call, in_hook_node, parent_run_id

if TYPE_CHECKING:
    from ce.langchain._plugin import LangChainPlugin

__all__ = [
    "INTERNAL_CALL_KEY",
    "SKIP_METADATA_KEY",
    "SKIP_TAG",
    "ToolOutcomes",
    "already_injected",
    "call_scope",
    "current_config",
    "inject_async",
    "inject_sync",
    "make_middleware",
    "new_run_id",
    "should_skip",
]

SKIP_TAG = "ce:skip"
"""A model (or run) tagged with this is left alone: no injection, no recording."""
SKIP_METADATA_KEY = "ce_skip"
"""Metadata key with the same effect as :data:`SKIP_TAG` when true."""

INTERNAL_CALL_KEY = "lc_internal_call"
"""Metadata key LangChain (``INTERNAL_CALL_METADATA_KEY``, langchain 1.4 on) puts on the model
calls its ``create_agent`` middleware makes for itself (a summarizer's, a tool selector's, a
tool emulator's): such a call is left alone."""
_INTERNAL_SOURCES = frozenset({"summarization", "tool_selection", "tool_emulation"})
# The ``lc_source`` metadata of those calls (the only mark of the summarizer's on the releases
# before the internal-call key).

# Set while a middleware / wrapper has already injected: the global patch then stays out.
_injected: ContextVar[bool] = ContextVar("ce_langchain_injected", default=False)


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
    tags: Sequence[str] | None, metadata: Mapping[str, Any] | None, *, model_call: bool = True
) -> bool:
    """Whether a run is left alone: suppressed context, the skip tag or metadata, or (for a
    ``model_call``) a ``create_agent`` middleware's own model call: marked internal by
    LangChain (:data:`INTERNAL_CALL_KEY`, or the ``lc_source`` of its summarizer, tool
    selector or tool emulator), or made inside a middleware hook node."""
    if is_suppressed():
        return True
    if tags and SKIP_TAG in tags:
        return True
    metadata = metadata or {}
    if metadata.get(SKIP_METADATA_KEY):
        return True
    if not model_call:
        return False
    return (
        bool(metadata.get(INTERNAL_CALL_KEY))
        or metadata.get("lc_source") in _INTERNAL_SOURCES
        or in_hook_node(metadata)
    )


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
    messages: Sequence[Any] = (),
) -> Scope:
    """The scope of a chat-model call with ``messages`` about to run with ``config`` (its
    parent run is the config's callback manager's), registered for the handler under
    ``run_id``: the same scope the call's callbacks are recorded into."""
    return plugin.tracker.for_call(run_id, parent_run_id(config), metadata, tags, messages=messages)


class ToolOutcomes:
    """The tool calls whose outcome the plugin has recorded, by session and ``tool_call_id``,
    and how far each session's calls were read for failed results (:meth:`unread`).
    Bounded: past ``size`` calls it starts over, and a call forgotten is recorded again,
    which changes nothing (a call's first record in a session wins); past ``sessions``
    sessions the oldest one's next call is read whole."""

    def __init__(self, size: int = 8192, sessions: int = 4096) -> None:
        self._size = size
        self._sessions = sessions
        self._calls: set[tuple[str, str]] = set()
        self._read: OrderedDict[str, tuple[int, object]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, session_id: str, tool_call_id: str) -> bool:
        """Note the outcome of ``tool_call_id`` in ``session_id`` as recorded; whether it
        was not noted yet."""
        key = (session_id, tool_call_id)
        with self._lock:
            if key in self._calls:
                return False
            if len(self._calls) >= self._size:
                self._calls.clear()
            self._calls.add(key)
            return True

    def unread(self, session_id: str, messages: Sequence[BaseMessage]) -> Sequence[BaseMessage]:
        """The messages of a call in ``session_id`` its previous call did not pass: those
        after the previous call's when ``messages`` continue them (the previous call's last
        message object in its place: a history the app goes on with), else all of them (a
        history passed for the first time, one the app went back in)."""
        with self._lock:
            held = self._read.pop(session_id, None)
            if messages:
                self._read[session_id] = (len(messages), messages[-1])
                while len(self._read) > self._sessions:
                    self._read.popitem(last=False)
        if held is not None:
            count, last = held
            if count <= len(messages) and messages[count - 1] is last:
                return messages[count:]
        return messages

    def clear(self) -> None:
        with self._lock:
            self._calls.clear()
            self._read.clear()


def _record_failed_results(
    plugin: LangChainPlugin, session_id: str, messages: Sequence[BaseMessage]
) -> None:
    """Record a failed tool run for each tool message of ``messages`` that LangChain marks as
    failed (:func:`~ce.langchain._convert.failed_results`) and no recorded run answers: a
    call ``HumanInTheLoopMiddleware`` rejected, a call of an unknown tool (no tool ran), one
    of a history the session has not recorded (a stored conversation the app passes). Only
    the messages the session's previous call did not pass are read
    (:meth:`ToolOutcomes.unread`). It is queued before the call is prepared, so the session
    holds the result as the call's failure and the model receives it fenced with
    ``status="error"``."""
    failed = [
        result
        for result in failed_results(plugin.outcomes.unread(session_id, messages))
        if plugin.outcomes.add(session_id, result.tool_call_id)
    ]
    if not failed:
        return
    calls = {
        call["id"]: call
        for message in messages
        if isinstance(message, AIMessage)
        for call in message.tool_calls
        if call.get("id")
    }
    runs: list[ToolRun] = []
    for result in failed:
        call = calls.get(result.tool_call_id)
        text = message_text(result)
        now = time.time()
        runs.append(
            ToolRun(
                tool_call_id=result.tool_call_id,
                name=result.name or (call["name"] if call else "") or "tool",
                args=dict(call["args"]) if call else "",
                result=text,
                error=text,
                started_at=now,
                ended_at=now,
                provider_name="langchain",
            )
        )

    async def record(recorder: Recorder) -> None:
        for run in runs:
            await recorder.record_tool_run(run)

    record_sync(plugin, session_id, "record tool run", record, blocking=in_blocking_call())


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


_CONVERSION = "langchain message conversion"


def inject_sync(
    plugin: LangChainPlugin,
    session_id: str,
    messages: list[BaseMessage],
    tools: Sequence[Any] | None = None,
) -> list[BaseMessage]:
    """The messages the model receives instead of ``messages`` in ``session_id``; the schemas
    of the bound ``tools`` are counted against the budget. A ``SummarizationMiddleware``
    summary is left out (:func:`~ce.langchain._convert.conversation`), but with
    ``mode="augment"``, which sends the app's own history rather than the stored one.
    Fail-open, never unredacted: when the engine or the conversion fails, the app's own
    ``messages`` (a summary included) come back redacted (as they are only when redaction is
    off or failed too)."""
    try:
        own = (
            messages
            if plugin.mode == "augment"
            else plugin.histories.kept(session_id, messages, in_conversation)
        )
        history = plugin.histories.convert(
            session_id, own, to_openai, opaque, fingerprint_of=fingerprint
        )
        pending = to_openai(own) if history is None else history.pending
        schemas = tool_schemas(tools)
        _record_failed_results(plugin, session_id, own)
    except Exception as exc:
        redacted = fail_open_sync(
            plugin, session_id, _CONVERSION, exc, lambda: _redact_messages(plugin, messages)
        )
        return messages if redacted is None else redacted
    sent = prepare_openai_sync(plugin, session_id, pending, schemas, history=history, rewind=True)
    if sent is None:
        return messages
    try:
        return reconcile(own, pending, sent, history)
    except Exception as exc:
        redacted = fail_open_sync(
            plugin, session_id, _CONVERSION, exc, lambda: _redact_messages(plugin, messages)
        )
        return messages if redacted is None else redacted


async def inject_async(
    plugin: LangChainPlugin,
    session_id: str,
    messages: list[BaseMessage],
    tools: Sequence[Any] | None = None,
) -> list[BaseMessage]:
    """The coroutine twin of :func:`inject_sync`."""
    try:
        own = (
            messages
            if plugin.mode == "augment"
            else plugin.histories.kept(session_id, messages, in_conversation)
        )
        history = plugin.histories.convert(
            session_id, own, to_openai, opaque, fingerprint_of=fingerprint
        )
        pending = to_openai(own) if history is None else history.pending
        schemas = tool_schemas(tools)
        _record_failed_results(plugin, session_id, own)
    except Exception as exc:
        redacted = await fail_open(
            plugin, session_id, _CONVERSION, exc, lambda: _redact_messages(plugin, messages)
        )
        return messages if redacted is None else redacted
    sent = await prepare_openai(plugin, session_id, pending, schemas, history=history, rewind=True)
    if sent is None:
        return messages
    try:
        return reconcile(own, pending, sent, history)
    except Exception as exc:
        redacted = await fail_open(
            plugin, session_id, _CONVERSION, exc, lambda: _redact_messages(plugin, messages)
        )
        return messages if redacted is None else redacted


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
