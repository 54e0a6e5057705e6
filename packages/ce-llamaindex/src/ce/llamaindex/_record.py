"""LlamaIndex runs -> the engine: what the span and event handlers on the root dispatcher see.

:class:`Tracker` keeps the open spans (parent, scope, the tool call and component they run
in: :mod:`ce.llamaindex._scopes`) and the LLM calls in flight. An LLM chat span nested in
another one (a mock LLM's ``achat`` calling its own ``chat``, a wrapper calling the wrapped
LLM, a ``StructuredLLM``'s chat calling its LLM's through ``structured_predict``) belongs to
the outer call: only the first span of such a chain that emits LLM events is recorded, a
``StructuredLLM``'s excepted (its events restate the reply of the model call inside it,
re-serialised, without usage: that call's are recorded), so a call's usage is counted once.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ce.core.integration import (
    AskedToolCalls,
    ModelCall,
    ObjectSessions,
    Recorder,
    RetrievalHit,
    RunConversations,
    ToolRun,
    ToolScopeIds,
    error_text,
    is_suppressed,
    record_sync,
)
from ce.core.schema import Message, ModelInvocation, Role
from ce.llamaindex._convert import message_text, reply_to_message, turn_key
from ce.llamaindex._scopes import method_of

if TYPE_CHECKING:
    from llama_index.core.base.llms.types import ChatResponse
    from llama_index.core.schema import NodeWithScore

    from ce.core.integration import Plugin
    from ce.llamaindex._scopes import ChatTurn, SpanInfo

__all__ = ["LlmCall", "Tracker", "call_args", "hits_from_nodes", "tokens_of"]

CLOSED_KEPT = 4096
"""How many closed streaming spans (a chat engine's, a ``StructuredLLM``'s) the tracker keeps
for their streams' spans."""

_URI_KEYS = ("source", "uri", "url", "file_path", "file_name")
_METADATA_VALUE_MAX = 512


@dataclass
class LlmCall:
    """One LLM chat call: the outermost chat span and the spans nested in it, and the session
    it is injected from and recorded into (a nested call's is its own child scope's)."""

    root: str
    session_id: str
    provider: str
    model: str
    params: dict[str, Any]
    skip: bool = False
    perf: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    events_span: str | None = None
    streaming: bool = False
    root_done: bool = False
    target: list[Any] | None = None
    original: list[Any] | None = None
    deferred: Mapping[str, Any] | None = None
    """The chat span's arguments, until the async seam injects them."""
    blocking: bool = False
    """A blocking call (``chat``, ``stream_chat``): its records are written inline, also on
    an event loop's thread (see :func:`ce.core.integration.record_sync`)."""
    restating: frozenset[str] = frozenset()
    """The call's ``StructuredLLM`` chat spans: their events restate the reply of the model
    call inside them (the parsed object re-serialised, no usage) and are not recorded."""


def tokens_of(response: ChatResponse) -> tuple[int, int]:
    """Prompt and completion tokens a response reports (0, 0 when it reports none)."""
    from llama_index.core.callbacks.token_counting import get_tokens_from_response

    try:
        prompt, completion = get_tokens_from_response(response)
    except Exception:  # a provider's raw object that is neither a dict nor a model
        prompt, completion = 0, 0
    if not (prompt or completion):
        extra = response.additional_kwargs or {}
        prompt, completion = extra.get("prompt_tokens", 0), extra.get("completion_tokens", 0)
    return int(prompt or 0), int(completion or 0)


def _small(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= _METADATA_VALUE_MAX
    return isinstance(value, (int, float, bool))


def hits_from_nodes(nodes: Sequence[NodeWithScore]) -> list[RetrievalHit]:
    """Retrieved nodes as neutral hits: the source uri from the node's metadata (``source``,
    ``uri``, ``url``, ``file_path`` or ``file_name``), the score, the source document's id,
    and the node's small scalar metadata (with its ``node_id`` and ``ref_doc_id``)."""
    hits: list[RetrievalHit] = []
    for scored in nodes:
        node = scored.node
        meta = dict(node.metadata or {})
        uri = next((str(meta[k]) for k in _URI_KEYS if meta.get(k)), "")
        metadata = {str(k): v for k, v in meta.items() if _small(v) and k not in _URI_KEYS}
        metadata["node_id"] = node.node_id
        if node.ref_doc_id:
            metadata["ref_doc_id"] = node.ref_doc_id
        version = meta.get("version")
        hits.append(
            RetrievalHit(
                content=node.get_content(),
                uri=uri,
                score=float(scored.score) if scored.score is not None else None,
                doc_id=node.ref_doc_id or node.node_id,
                doc_version=str(version) if version is not None else None,
                metadata=metadata,
            )
        )
    return hits


def _tool_output(output: Any) -> tuple[str, str | None]:
    """The text of a ToolOutput and its error (the exception, else the text when it is an
    error)."""
    text = str(getattr(output, "content", output))
    if not getattr(output, "is_error", False):
        return text, None
    exception = getattr(output, "exception", None)
    return text, error_text(exception) if isinstance(exception, BaseException) else text


class Tracker:
    """State shared by the plugin's span and event handlers, and the engine writes."""

    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin
        self.spans: dict[str, SpanInfo] = {}
        self.closed: OrderedDict[str, SpanInfo] = OrderedDict()
        self.calls: dict[str, LlmCall] = {}
        self._asked = AskedToolCalls()  # by session: the calls of its latest reply
        self.tool_scope_ids = ToolScopeIds(plugin)  # the child scopes of tool runs, per session
        self.conversations = RunConversations()  # of the scopes nothing names
        # streamed chat-engine answers not written to the memory yet: the turn of each
        self._streamed: dict[int, tuple[weakref.ref[Any], ChatTurn]] = {}
        # LlamaIndex memories (by id, held weakly): the session of the last top-level run of each
        self.memories = ObjectSessions()  # the sessions of the runs that used each memory
        self.lock = threading.Lock()

    # -- bookkeeping ------------------------------------------------------------------------

    def span(self, span_id: str | None) -> SpanInfo | None:
        """The open span ``span_id``."""
        if span_id is None:
            return None
        with self.lock:
            return self.spans.get(span_id)

    def parent(self, span_id: str | None) -> SpanInfo | None:
        """The span ``span_id`` for a child opening: open, or a streaming span closed
        recently, a chat engine's or a ``StructuredLLM``'s (the stream it returned is read
        after its span closed; the spans of that read are its children). Other closed spans
        are not parents: LlamaIndex versions that leave a finished run's span active in the
        caller's context would otherwise make later calls its children."""
        if span_id is None:
            return None
        with self.lock:
            return self.spans.get(span_id) or self.closed.get(span_id)

    def pop(self, span_id: str) -> SpanInfo | None:
        """Close the span ``span_id``; a streaming span (a chat engine's, a
        ``StructuredLLM``'s) is kept among the last :data:`CLOSED_KEPT` for the spans of its
        stream."""
        with self.lock:
            info = self.spans.pop(span_id, None)
            if info is not None and info.streams:
                self.closed[span_id] = info
                while len(self.closed) > CLOSED_KEPT:
                    self.closed.popitem(last=False)
            return info

    def write(
        self,
        session_id: str,
        what: str,
        work: Callable[[Recorder], Coroutine[Any, Any, Any]],
        blocking: bool = False,
    ) -> None:
        record_sync(self.plugin, session_id, what, work, blocking=blocking)

    def asked_call_id(self, session_id: str, name: str, args: Any) -> str | None:
        """The id of the first call of the session's latest model reply with this tool name
        and arguments that no tool run has claimed yet (for tools the app calls itself,
        outside an agent's ``call_tool`` step)."""
        return self._asked.take(session_id, name, args, fallback=False)

    # -- memories ---------------------------------------------------------------------------

    def used_memories(self, memories: Sequence[Any], session_id: str) -> None:
        """Note ``session_id`` as the session of the top-level run that uses ``memories`` (a
        memory is held weakly: one the app drops is forgotten)."""
        for memory in memories:
            with contextlib.suppress(TypeError):  # a memory that cannot be held weakly
                self.memories.note(memory, session_id)

    def memory_session(self, memory: Any) -> str | None:
        """The session of the last top-level run that used ``memory`` (``None``: no run the
        plugin tracked used it)."""
        sessions = self.memories.sessions(memory)
        return sessions[-1] if sessions else None

    # -- LLM calls --------------------------------------------------------------------------

    @staticmethod
    def restore(call: LlmCall) -> None:
        """Put the caller's list back as it was before the rewrite."""
        if call.target is not None and call.original is not None:
            call.target[:] = call.original
            call.target = call.original = None

    def close(self) -> None:
        """Put back every list still rewritten (streams not consumed to their end) and
        forget all state: the plugin is being uninstalled."""
        with self.lock:
            calls = list({id(c): c for c in self.calls.values()}.values())
            self.calls.clear()
            self.spans.clear()
            self.closed.clear()
        self.memories.clear()
        self._asked.clear()
        self.tool_scope_ids.clear()
        self.conversations.clear()
        for call in calls:
            self.restore(call)

    def finish_call(self, call: LlmCall) -> None:
        self.restore(call)
        with self.lock:
            for span_id in [s for s, c in self.calls.items() if c is call]:
                del self.calls[span_id]

    def record_reply(self, call: LlmCall, response: ChatResponse) -> None:
        ended = time.perf_counter()
        prompt, completion = tokens_of(response)
        message = response.message
        self.conversations.replied(call.session_id, turn_key(message))
        model_call = ModelCall(
            call_id=call.root,
            provider=call.provider,
            model=call.model,
            prompt_tokens=prompt,
            completion_tokens=completion,
            latency_ms=round((ended - call.perf) * 1000),
            first_token_latency_ms=(
                round((call.first_token - call.perf) * 1000)
                if call.streaming and call.first_token is not None
                else None
            ),
            output_text=message_text(message),
            params=call.params,
        )
        reply = reply_to_message(message, call.provider, call.model)
        self._asked.note(  # the calls of the session's latest reply, for asked_call_id
            call.session_id,
            [(c.tool_call_id, c.name, c.arguments) for c in reply.tool_calls or ()],
            replace=True,
        )

        self.write(
            call.session_id,
            "record model call",
            lambda r: r.record_model_call(model_call, reply),
            call.blocking,
        )

    def record_completion(self, span_id: str, info: SpanInfo, response: Any) -> None:
        """A completion's usage and output (a chat engine's condense step, an app's
        ``llm.complete``), in the session of its span (a nested scope inside a chat engine):
        recorded like a chat call, without a reply message."""
        if response is None or info.completion is None:
            return
        provider, model, params = info.completion
        prompt, completion = tokens_of(response)
        model_call = ModelCall(
            call_id=span_id,
            provider=provider,
            model=model,
            prompt_tokens=prompt,
            completion_tokens=completion,
            output_text=str(getattr(response, "text", "") or ""),
            params=params,
        )
        self.write(info.session_id, "record completion", lambda r: r.record_model_call(model_call))

    # -- chat-engine turns ---------------------------------------------------------------

    def record_turn(self, turn: ChatTurn, answer: Any, blocking: bool) -> None:
        """The question and ``answer`` of a chat engine's ``chat`` that no model call of its
        session carried (each call was a component: a condense step, a query engine's
        synthesizer), as a turn of that session, so the conversation is recorded as the
        chat engine's memory holds it."""
        if turn.answered or not isinstance(answer, str) or not answer or is_suppressed():
            return
        provider, model = turn.model or ("unknown", "unknown")
        messages = [
            Message(role=Role.USER, content=turn.question),
            Message(
                role=Role.ASSISTANT,
                content=answer,
                invocation=ModelInvocation(provider=provider, model=model),
            ),
        ]
        self.write(
            turn.session_id,
            "record chat turn",
            lambda r: r.engine.record_messages(r.session_id, messages),
            blocking,
        )

    def stream_turn(self, response: Any, turn: ChatTurn) -> None:
        """Keep ``turn`` for the streamed ``response`` a chat engine returned: its answer is
        known when the response is written to the memory (:meth:`streamed_turn`), maybe on
        another thread, after the chat span closed."""
        if turn.answered:
            return
        key = id(response)

        def gone(ref: weakref.ref[Any]) -> None:
            # no lock: the collector may run this inside a block that holds it (a
            # non-reentrant lock would never be granted); it runs while the response is
            # freed, before another object can get its id
            held = self._streamed.get(key)
            if held is not None and held[0] is ref:
                self._streamed.pop(key, None)

        with self.lock:
            self._streamed[key] = (weakref.ref(response, gone), turn)

    def stream_written(self, span_id: str, response: Any, arguments: Mapping[str, Any]) -> None:
        """The streamed chat-engine ``response`` was written to the memory (the writer's end
        event, else its span ``span_id`` closing; ``arguments``: the span's): its turn (see
        :meth:`stream_turn`) is recorded, once. Its answer is the response's text, else the
        message then put into the memory (llama-index-core fills the response only as the app
        reads the stream)."""
        streamed = self.streamed_turn(response)
        if streamed is None:
            return
        answer = getattr(response, "response", None) or _last_answer(arguments.get("memory"))
        # the sync writer runs on a thread of its own
        self.record_turn(
            streamed, answer, blocking=method_of(span_id) == "write_response_to_history"
        )

    def streamed_turn(self, response: Any) -> ChatTurn | None:
        """The turn of a streamed chat-engine ``response`` (taken out), if any."""
        with self.lock:
            held = self._streamed.get(id(response))
            if held is None or held[0]() is not response:
                return None
            del self._streamed[id(response)]
            return held[1]

    def record_failure(self, call: LlmCall, error: BaseException | str) -> None:
        text = error if isinstance(error, str) else error_text(error)
        model_call = ModelCall(
            call_id=call.root,
            provider=call.provider,
            model=call.model,
            prompt_tokens=0,
            completion_tokens=0,
            latency_ms=round((time.perf_counter() - call.perf) * 1000),
            params=call.params,
            error=text,
        )
        self.write(
            call.session_id,
            "record model call",
            lambda r: r.record_model_call(model_call),
            call.blocking,
        )

    # -- tools and retrieval ----------------------------------------------------------------

    def record_tool(self, info: SpanInfo, output: Any, error: BaseException | None) -> None:
        started = info.tool
        if started is None:
            return
        result: str | None
        failure: str | None
        if error is not None:
            result, failure = None, error_text(error)
        else:
            result, failure = _tool_output(output)
        run = ToolRun(
            tool_call_id=started.tool_call_id,
            name=started.name,
            args=started.args,
            result=result,
            error=failure,
            started_at=started.started_at,
            ended_at=time.time(),
            provider_name="llamaindex",
        )
        session_id = info.tool_session or info.session_id  # where the tool call was made
        self.write(session_id, "record tool run", lambda r: r.record_tool_run(run))

    def record_hits(self, info: SpanInfo, nodes: Sequence[NodeWithScore]) -> None:
        hits = hits_from_nodes(nodes)
        if hits:  # inside a tool run: evidence of the tool call, in the session that made it
            self.write(
                info.tool_session or info.session_id,
                "record retrieval",
                lambda r: r.record_retrieval(hits, info.tool_call_id),
            )


def call_args(kwargs: Mapping[str, Any] | None, args: Sequence[Any] | None) -> dict[str, Any] | str:
    """A tool's arguments as the model gave them: the keyword arguments, else the one
    positional input."""
    if kwargs:
        return dict(kwargs)
    if args:
        first = args[0]
        return dict(first) if isinstance(first, Mapping) else str(first)
    return {}


def _last_answer(memory: Any) -> str | None:
    """The text of the newest assistant message a chat engine's ``memory`` holds."""
    getter = getattr(memory, "get_all", None)
    if not callable(getter):
        return None
    try:
        held = getter()
    except Exception:  # a memory that cannot be read here: the turn is not recorded
        return None
    for message in reversed(held or ()):
        if getattr(getattr(message, "role", None), "value", None) == "assistant":
            return message_text(message)
    return None
