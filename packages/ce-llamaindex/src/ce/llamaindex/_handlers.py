"""The span and event handlers the plugin adds to LlamaIndex's root dispatcher.

The span handler sees every span open (before the method body runs, with the very arguments
the method receives) and close: it resolves each span's session (cheap, no engine call), has
the messages of outermost LLM chat spans rewritten (``_inject``), and records tool runs from
the agent's ``call_tool`` step (or from tools the app calls itself); for a top-level run it
notes the session of the memories the run uses (a reset of one clears that session, see
``_memory``). A sync chat call (``chat`` / ``stream_chat``) is rewritten right there, by the
blocking engine inline; an async one (``achat`` / ``astream_chat``) is left to the async seam
(``_seam``), which awaits the engine inside the span, on the caller's event loop, before the
provider reads the list (the dispatcher calls span handlers synchronously: a handler can only
block). A completion's prompt (a string no handler can rewrite) is passed through the
configured redactor by the completion seam (:meth:`SpanTracker.redact_prompt_sync` /
:meth:`SpanTracker.redact_prompt`). The event handler records LLM calls (usage, the reply,
streaming included) and retrieval hits (not those of an ``ObjectRetriever``: objects, e.g.
an agent's tools, no documents). The dispatcher swallows handler errors, so both
handlers fail open by construction; engine failures are also logged and reported as
``Degraded`` events by the integration kit's guards.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from llama_index.core.base.llms.base import BaseLLM
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.chat_engine.types import StreamingAgentChatResponse
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.chat_engine import StreamChatEndEvent
from llama_index.core.instrumentation.events.exception import ExceptionEvent
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatInProgressEvent,
    LLMChatStartEvent,
    LLMCompletionEndEvent,
)
from llama_index.core.instrumentation.events.query import QueryEndEvent
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent
from llama_index.core.instrumentation.span import BaseSpan, active_span_id
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from llama_index.core.llms.structured_llm import StructuredLLM
from llama_index.core.schema import NodeWithScore
from llama_index.core.tools.types import BaseTool

from ce.core.integration import (
    ToolRun,
    is_suppressed,
    redacted_or_reported,
    redacted_or_reported_sync,
    resolve_scope,
)
from ce.core.pipeline import quotes_document
from ce.llamaindex._convert import message_text, turn_key
from ce.llamaindex._inject import inject_async, inject_sync, redacted_prompt
from ce.llamaindex._record import LlmCall, Tracker, call_args, hits_from_nodes
from ce.llamaindex._scopes import (
    CHAT_METHODS,
    WRITE_METHODS,
    SpanInfo,
    in_object_retrieval,
    in_structured_stream,
    is_tool,
    method_of,
    run_memories,
    span_scope,
)
from ce.llamaindex._seam import ASYNC_CHAT_METHODS, COMPLETION_METHODS, seamed

if TYPE_CHECKING:
    from ce.core.integration import Plugin

__all__ = [
    "EventRecorder",
    "SpanTracker",
    "failure",
]


_PARAMS = ("temperature", "max_tokens", "top_p", "seed")
_CITATION_LABEL = re.compile(r"\ASource \d+:\n")  # a CitationQueryEngine node's label

# fail_closed: the engine error of an LLM span, raised by the dispatcher patch (_plugin.py)
_failure: ContextVar[tuple[str, Exception] | None] = ContextVar("ce_li_failure", default=None)


def failure(span_id: str) -> Exception | None:
    """The engine error stored for ``span_id`` in this context (taken out), if any."""
    stored = _failure.get()
    if stored is None or stored[0] != span_id:
        return None
    _failure.set(None)
    return stored[1]


def _tool_step(arguments: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
    """The tool-call id, tool name and arguments of an agent's ``call_tool`` step."""
    event = arguments.get("ev")
    call_id = getattr(event, "tool_id", None)
    if not (isinstance(call_id, str) and call_id):
        return None
    name = str(getattr(event, "tool_name", "") or "tool")
    return call_id, name, dict(getattr(event, "tool_kwargs", None) or {})


def _tool_input(tool: BaseTool, arguments: Mapping[str, Any]) -> tuple[str, Any]:
    """The name and the arguments (as the model gave them) of a tool's own call span."""
    extra = arguments.get("kwargs")
    positional = arguments.get("args")
    args = call_args(
        extra if isinstance(extra, Mapping) else None,
        positional if isinstance(positional, tuple) else None,
    )
    return tool.metadata.get_name(), args


def _open_tool(
    info: SpanInfo, outer: str, call_id: str, name: str, args: Any, *, quiet: bool
) -> None:
    """Mark ``info`` as the run of tool call ``call_id`` made in session ``outer``."""
    info.tool_call_id, info.tool_session = call_id, outer
    info.in_query = info.in_chat_engine = info.answer = info.prompt_call = False
    if quiet:
        return
    now = time.time()
    info.tool = ToolRun(
        tool_call_id=call_id,
        name=name,
        args=args,
        result=None,
        error=None,
        started_at=now,
        ended_at=now,
    )


def _chat_input(arguments: Mapping[str, Any]) -> tuple[list[Any] | None, Any]:
    """The ``messages`` list of a chat span's arguments (``None`` when it is not a list: it
    cannot be rewritten in place) and the request's ``tools``."""
    messages = arguments.get("messages")
    extra = arguments.get("kwargs")
    tools = extra.get("tools") if isinstance(extra, Mapping) else None
    return (messages if isinstance(messages, list) else None), tools


def _put(call: LlmCall, messages: list[Any], sent: list[Any] | None) -> None:
    """Put ``sent`` into the call's list in place (the provider and the chat events read that
    very list); the caller's messages are put back when the call is over."""
    if sent is not None:
        call.original = list(messages)
        call.target = messages
        messages[:] = sent


class SpanTracker(BaseSpanHandler[BaseSpan]):
    """Sessions of spans, injection into LLM chat spans, tool runs."""

    _tracker: Tracker | None = PrivateAttr(default=None)
    _inject: bool = PrivateAttr(default=True)

    @classmethod
    def class_name(cls) -> str:
        return "ContextEngineSpanTracker"

    @property
    def tracker(self) -> Tracker:
        assert self._tracker is not None, "bind() the handler first"
        return self._tracker

    def bind(self, tracker: Tracker, inject: bool) -> SpanTracker:
        self._tracker = tracker
        self._inject = inject
        return self

    def new_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        parent_span_id: str | None = None,
        tags: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> BaseSpan | None:
        tracker = self.tracker
        if not tracker.plugin.installed:
            return None
        plugin = tracker.plugin
        parent_span_id, parent = self._parent(parent_span_id)
        arguments = bound_args.arguments
        method = method_of(id_)
        step = _tool_step(arguments) if method == "call_tool" else None
        own_tool = is_tool(instance, method) and not (parent is not None and parent.tool_pending)
        if step is not None or own_tool:  # a tool run: a nested scope named by its call id
            info = span_scope(plugin, id_, parent_span_id, parent, tags, arguments, instance)
            outer = info.scope
            if step is not None:
                call_id, name, args = step
            else:
                name, args = _tool_input(cast(BaseTool, instance), arguments)  # is_tool
                call_id = tracker.asked_call_id(outer.session_id, name, args) or id_
            info.scope = resolve_scope(
                plugin,
                run_id=info.root,
                explicit=info.named,
                parent=outer,
                parent_call_id=tracker.tool_scope_ids.take(outer.session_id, call_id),
            )
            _open_tool(info, outer.session_id, call_id, name, args, quiet=is_suppressed())
            info.tool_pending = step is not None
        else:
            info = span_scope(plugin, id_, parent_span_id, parent, tags, arguments, instance)
            if is_tool(instance, method):
                info.tool_pending = False  # the tool object of the call_tool step above
        if info.root == id_:  # a top-level run: the session a reset of its memories clears
            tracker.used_memories(run_memories(id_, instance, arguments), info.session_id)
        if info.chat_turn is not None and isinstance(instance, BaseLLM):
            info.chat_turn.model = _llm_identity(instance)[:2]  # the last call makes the answer
        if isinstance(instance, BaseLLM) and getattr(instance, "ce_injects", False):
            info.prompt_handled = True  # wrap(): its completions go through the engine
        if isinstance(instance, BaseLLM) and method in CHAT_METHODS:
            messages = arguments.get("messages")
            if isinstance(messages, list) and (
                parent is None or (parent.call is None and not parent.prompt_call)
            ):
                # a step of a custom workflow prompting from scratch is no turn of the
                # conversation of the run's earlier calls (see RunConversations)
                info.scope = tracker.conversations.place(info.scope, messages, turn_key, id_)
            info.call = self._enter_llm(id_, method, info, parent, instance, arguments)
            if parent is not None:
                parent.chat_inside = True
        elif isinstance(instance, BaseLLM) and method in COMPLETION_METHODS:
            provider, model, params = _llm_identity(instance)
            info.completion = (provider, model, params)
            if parent is not None and parent.completion is not None:
                parent.completion_inside = True
        if isinstance(instance, StreamingAgentChatResponse) and method in WRITE_METHODS:
            info.stream_write = (instance, arguments)  # its end event records the turn
        with tracker.lock:
            tracker.spans[id_] = info
        return None

    def _parent(self, span_id: str | None) -> tuple[str | None, SpanInfo | None]:
        """The id and :class:`SpanInfo` of the parent of a span opening under the active span
        ``span_id``: that span (see :meth:`Tracker.parent`), except while a streaming span's
        stream is read (a ``StructuredLLM``'s chat, a streamed structured prediction:
        :data:`in_structured_stream`): a span opening there outside that span's read (with no
        parent, or under a span of the app's) is part of it, the streaming span its parent."""
        tracker = self.tracker
        parent = tracker.parent(span_id)
        reading = in_structured_stream.get()
        if reading is None or (parent is not None and parent.in_stream == reading):
            return span_id, parent
        stream = tracker.parent(reading)
        return (span_id, parent) if stream is None else (reading, stream)

    def _enter_llm(
        self,
        id_: str,
        method: str,
        info: SpanInfo,
        parent: SpanInfo | None,
        llm: BaseLLM,
        arguments: Mapping[str, Any],
    ) -> LlmCall:
        tracker = self.tracker
        if parent is not None and parent.call is not None:  # nested: part of the outer call
            call = parent.call
        else:
            provider, model, params = _llm_identity(llm)
            call = LlmCall(
                root=id_,
                session_id=info.session_id,
                provider=provider,
                model=model,
                params=params,
                skip=is_suppressed(),
                blocking=method not in ASYNC_CHAT_METHODS,
            )
            if info.nodes and not call.skip:
                self._record_quoted(id_, call, info.nodes, arguments)
            wrapper = getattr(llm, "ce_injects", False)  # wrap(): it injects itself
            if self._inject and not (call.skip or wrapper):
                if method in ASYNC_CHAT_METHODS and seamed(llm, method):
                    call.deferred = arguments  # awaited at the seam: inject_deferred
                else:  # a sync call, or an async method no seam wraps: inline, blocking
                    self._rewrite(id_, call, arguments)
        if isinstance(llm, StructuredLLM):
            call.restating |= {id_}  # its LLM's call inside it is recorded, not its restatement
        with tracker.lock:
            tracker.calls[id_] = call
        return call

    def _record_quoted(
        self, id_: str, call: LlmCall, nodes: Sequence[Any], arguments: Mapping[str, Any]
    ) -> None:
        """Before a model call a query's synthesizer makes (in a session of its own): the
        synthesizer's nodes whose text the call's messages quote and another of its nodes holds
        too (one passage from two sources or indexes), as retrieved evidence of that session,
        written before the call's input is assembled. The engine then sends that text once,
        fenced as evidence with each source, and the prompt's copies as pointers to it. A
        ``CitationQueryEngine``'s nodes are compared without the ``Source <n>:`` label it puts
        before each one (the labels stay in the prompt, before the pointers, so the model's
        citations still name both sources). A prompt whose documents all differ goes as
        LlamaIndex built it."""
        messages, _ = _chat_input(arguments)
        if not messages:
            return
        text = "\n".join(message_text(m) for m in messages if isinstance(m, ChatMessage))
        quoted: dict[str, list[NodeWithScore]] = {}
        for scored in nodes:
            if isinstance(scored, NodeWithScore):
                content = _CITATION_LABEL.sub("", scored.node.get_content()).strip()
                if quotes_document(text, content):  # as the engine will read it
                    quoted.setdefault(content, []).append(scored)
        hits = [
            replace(hit, content=content)
            for content, same in quoted.items()
            if len(same) > 1
            for hit in hits_from_nodes(same)
        ]
        if not hits:
            return
        try:
            self.tracker.write(
                call.session_id,
                "record retrieval",
                lambda r: r.record_retrieval(hits, None),
                blocking=call.blocking,
            )
        except Exception as exc:  # fail_closed: raised into the call by the dispatcher patch
            _failure.set((id_, exc))

    def _rewrite(self, id_: str, call: LlmCall, arguments: Mapping[str, Any]) -> None:
        messages, tools = _chat_input(arguments)
        if messages is None:
            return
        try:
            sent = inject_sync(self.tracker.plugin, call.session_id, messages, tools)
        except Exception as exc:  # fail_closed: raised into the call by the dispatcher patch
            _failure.set((id_, exc))
            return
        _put(call, messages, sent)

    async def inject_deferred(self, llm: BaseLLM) -> None:
        """The async seam's work (``_seam``), run inside the chat span the current context is
        in, before the chat callback and the provider's body: await the engine for the call
        the span handler left to it (none for a nested span, a suppressed call, ``wrap()``'s
        LLM) and rewrite the call's list. With ``fail_closed`` the engine's error is raised
        here, into the call (the model is not called, nor is the call recorded)."""
        tracker = self._tracker
        span_id = active_span_id.get()
        if tracker is None or span_id is None or not tracker.plugin.installed:
            return
        with tracker.lock:
            call = tracker.calls.get(span_id)
            if call is None or call.root != span_id or call.deferred is None:
                return
            arguments, call.deferred = call.deferred, None
        messages, tools = _chat_input(arguments)
        if messages is None:
            return
        try:
            # the loop runs what else is ready first: this call's work does not lengthen the
            # loop step in which LlamaIndex ended the previous call and began this one
            await asyncio.sleep(0)
            sent = await inject_async(tracker.plugin, call.session_id, messages, tools)
        except BaseException:  # fail_closed, or the task cancelled: the model is not called
            call.skip = True
            raise
        with tracker.lock:
            if tracker.calls.get(span_id) is not call:
                return  # uninstalled meanwhile: nobody would put the caller's list back
        _put(call, messages, sent)

    def _prompt_target(self) -> tuple[Plugin, str | None] | None:
        """The plugin and the session (``None``: a span the handler did not record) of the
        completion the seam runs in, when its prompt is to be redacted: not suppressed, not
        inside a completion already handled (marked handled from now on)."""
        tracker = self._tracker
        if tracker is None or not tracker.plugin.installed or is_suppressed():
            return None
        info = tracker.span(active_span_id.get())
        if info is None:
            return tracker.plugin, None
        with tracker.lock:
            if info.prompt_handled:
                return None
            info.prompt_handled = True
        return tracker.plugin, info.session_id

    def redact_prompt_sync(self, llm: BaseLLM, prompt: str) -> str:
        """The completion seam's work (``_seam``), inside the completion's span: the prompt
        the provider receives, through the configured redactor (a failure of the redactor is
        reported and the prompt goes as it is, see
        :func:`ce.core.integration.redacted_or_reported_sync`)."""
        target = self._prompt_target()
        if target is None:
            return prompt
        plugin, session_id = target
        redacted = redacted_or_reported_sync(
            plugin, session_id or "", lambda: redacted_prompt(plugin, prompt)
        )
        return prompt if redacted is None else redacted

    async def redact_prompt(self, llm: BaseLLM, prompt: str) -> str:
        """The coroutine twin of :meth:`redact_prompt_sync` (the failure is reported without
        blocking the loop)."""
        target = self._prompt_target()
        if target is None:
            return prompt
        plugin, session_id = target
        redacted = await redacted_or_reported(
            plugin, session_id or "", lambda: redacted_prompt(plugin, prompt)
        )
        return prompt if redacted is None else redacted

    def _close(
        self,
        id_: str,
        instance: Any,
        result: Any,
        err: BaseException | None,
        arguments: Mapping[str, Any],
    ) -> None:
        tracker = self.tracker
        info = tracker.pop(id_)
        if info is None:
            return
        if err is None:
            self._close_turn(id_, info, instance, result, arguments)
        if info.tool is not None:
            tracker.record_tool(info, getattr(result, "tool_output", result), err)
        call = info.call
        if call is None or call.root != id_:
            return  # a nested chat span leaves with its call (its stream may still run)
        call.root_done = True
        if err is not None:
            if not call.skip:
                tracker.record_failure(call, err)
            tracker.finish_call(call)
        elif isinstance(result, (Generator, AsyncGenerator)):
            call.streaming = True  # the stream's end event finishes the call
        else:
            tracker.finish_call(call)

    def _close_turn(
        self, id_: str, info: SpanInfo, instance: Any, result: Any, arguments: Mapping[str, Any]
    ) -> None:
        """A chat engine's ``chat`` ended: its turn is recorded unless a model call of its
        session carried it; a streamed answer when the response is written to the memory
        (its text: the response's, else the message then put into the memory, where
        llama-index-core fills the response only as the app reads the stream)."""
        tracker = self.tracker
        turn = info.chat_turn
        method = method_of(id_)
        if turn is not None and turn.span_id == id_:
            if isinstance(result, StreamingAgentChatResponse):
                tracker.stream_turn(result, turn)
            else:
                answer = getattr(result, "response", None)
                tracker.record_turn(turn, answer, blocking=method not in ASYNC_CHAT_METHODS)
        elif isinstance(instance, StreamingAgentChatResponse) and method in WRITE_METHODS:
            self.tracker.stream_written(id_, instance, arguments)  # if its end event did not

    def prepare_to_exit_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        result: Any | None = None,
        **kwargs: Any,
    ) -> BaseSpan | None:
        self._close(id_, instance, result, None, bound_args.arguments)
        return None

    def prepare_to_drop_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        err: BaseException | None = None,
        **kwargs: Any,
    ) -> BaseSpan | None:
        self._close(id_, instance, None, err, bound_args.arguments)
        return None


class EventRecorder(BaseEventHandler):
    """LLM chat calls (usage, the reply, first-token latency) and retrieval hits."""

    _tracker: Tracker | None = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        return "ContextEngineEventRecorder"

    @property
    def tracker(self) -> Tracker:
        assert self._tracker is not None, "bind() the handler first"
        return self._tracker

    def bind(self, tracker: Tracker) -> EventRecorder:
        self._tracker = tracker
        return self

    def _call(self, event: BaseEvent) -> LlmCall | None:
        """The call ``event`` belongs to when its span is the call's recorded one (the
        first span of a nested chain that emits LLM events, none of the call's
        ``restating`` spans)."""
        span_id = event.span_id
        if span_id is None:
            return None
        with self.tracker.lock:
            call = self.tracker.calls.get(span_id)
            if call is None or call.skip or span_id in call.restating:
                return None
            if call.events_span is None and isinstance(event, LLMChatStartEvent):
                call.events_span = span_id
            return call if call.events_span == span_id else None

    def _unrecorded(self, event: BaseEvent) -> LlmCall | None:
        """The call ``event`` belongs to when its span is one of the call's ``restating``
        spans and no span of the call recorded a model call (its LLM served the structured
        prediction with a completion, or its stream failed before the model was called)."""
        with self.tracker.lock:
            call = self.tracker.calls.get(event.span_id or "")
        if call is None or call.skip or call.events_span is not None:
            return None
        return call if event.span_id in call.restating else None

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        tracker = self.tracker
        if not tracker.plugin.installed:
            return
        if isinstance(event, (LLMChatStartEvent, LLMChatInProgressEvent, LLMChatEndEvent)):
            call = self._call(event)
            if call is None:
                if isinstance(event, LLMChatEndEvent):
                    unrecorded = self._unrecorded(event)
                    if unrecorded is not None and unrecorded.root_done:
                        tracker.finish_call(unrecorded)  # a stream: over, nothing to record
                return
            if isinstance(event, LLMChatInProgressEvent) and call.first_token is None:
                call.first_token = time.perf_counter()
            elif isinstance(event, LLMChatEndEvent):
                if event.response is not None:
                    tracker.record_reply(call, event.response)
                if call.root_done:
                    tracker.finish_call(call)
        elif isinstance(event, ExceptionEvent):
            with tracker.lock:
                call = tracker.calls.get(event.span_id or "")
            if call is not None and call.events_span != event.span_id:
                call = self._unrecorded(event)
            if call is not None and call.streaming:
                tracker.record_failure(call, event.exception)
                tracker.finish_call(call)
        elif isinstance(event, StreamChatEndEvent):
            # a streamed answer is in the chat engine's memory: its turn is recorded now,
            # before the app's reader sees the stream end (the writer's span closes later)
            info = tracker.span(event.span_id)
            if info is not None and info.stream_write is not None:
                response, arguments = info.stream_write
                tracker.stream_written(event.span_id or "", response, arguments)
        elif isinstance(event, LLMCompletionEndEvent):
            info = tracker.span(event.span_id)
            if (
                info is not None
                and info.completion is not None
                and not info.chat_inside
                and not info.completion_inside
                and not is_suppressed()
            ):
                tracker.record_completion(event.span_id or "", info, event.response)
        elif isinstance(event, RetrievalEndEvent):
            info = tracker.span(event.span_id)
            if (
                info is not None
                and not info.in_query
                and not in_object_retrieval.get()  # objects (an agent's tools), no documents
                and not is_suppressed()
            ):
                tracker.record_hits(info, event.nodes)
        elif isinstance(event, QueryEndEvent):
            info = tracker.span(event.span_id)
            nodes = getattr(event.response, "source_nodes", None)
            if info is not None and nodes and not is_suppressed():
                tracker.record_hits(info, nodes)


def _llm_identity(llm: BaseLLM) -> tuple[str, str, dict[str, Any]]:
    """The provider, model and call parameters an LLM's calls are recorded with (a
    ``StructuredLLM``'s: those of the LLM it wraps, which makes them)."""
    if isinstance(llm, StructuredLLM):
        llm = llm.llm
    params = {k: getattr(llm, k) for k in _PARAMS if getattr(llm, k, None) is not None}
    model = str(getattr(llm, "model", None) or llm.metadata.model_name or "unknown")
    return type(llm).__name__.lower(), model, params
