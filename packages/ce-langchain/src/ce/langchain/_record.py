"""LangChain runs -> the engine: a callback handler LangChain adds to every run by itself.

It is registered through ``register_configure_hook`` with a ContextVar whose *default* is the
handler, so every ``CallbackManager.configure`` (every run, in every thread and task) picks it
up without ``callbacks=`` anywhere; LangChain deduplicates it when an app passes it as well.

It also follows every run in flight (chains included) in the plugin's :class:`ScopeTracker`,
which decides the session of each call (see :mod:`ce.langchain._scopes`).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence, ValuesView
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, LLMResult

from ce.core.integration import (
    CLEAR_HISTORY,
    ModelCall,
    ObjectSessions,
    Recorder,
    RetrievalHit,
    ToolRun,
    clear_sessions,
    clear_sessions_sync,
    error_text,
    is_suppressed,
    openai_to_messages,
    record_awaited,
    record_run_ended,
    record_sync,
    resolve_scope,
)
from ce.core.schema import Message
from ce.langchain._convert import ai_to_message, in_conversation, message_text, to_openai
from ce.langchain._inject import should_skip
from ce.langchain._scopes import (
    ScopeTracker,
    explicit_session,
    framework_identity,
    handed_messages,
    in_blocking_call,
    in_hook_node,
    keeps_replies,
    messages_key,
    node_state,
    tool_call_in_flight,
)

if TYPE_CHECKING:
    from langchain_core.documents import Document

    from ce.langchain._plugin import LangChainPlugin

__all__ = [
    "HistoryClears",
    "RecordingHandler",
    "config_session",
    "history_removal",
    "make_abulk_update_state",
    "make_adelete_thread",
    "make_bulk_update_state",
    "make_delete_thread",
    "removed_prefix",
]

_PARAMS = ("temperature", "max_tokens", "max_completion_tokens", "top_p", "seed", "stop")


@dataclass
class _Run:
    kind: str
    session_id: str
    started: float = field(default_factory=time.time)
    perf: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    name: str = ""
    tool_call_id: str = ""
    args: dict[str, Any] | str = ""
    provider: str = ""
    model: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    parent_tool: UUID | None = None
    hits: list[RetrievalHit] = field(default_factory=list)
    structured: bool = False  # a with_structured_output call: its reply is the app's data


def _scalar_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    return {
        str(k): v
        for k, v in metadata.items()
        if isinstance(v, (str, int, float, bool)) and k not in ("source", "uri", "score")
    }


def _hit(document: Document) -> RetrievalHit:
    meta = document.metadata or {}
    uri = meta.get("source") or meta.get("uri") or ""
    score = meta.get("score", meta.get("relevance_score"))
    version = meta.get("version")
    return RetrievalHit(
        content=document.page_content,
        uri=str(uri),
        score=float(score) if isinstance(score, (int, float)) else None,
        doc_id=document.id or (str(meta["id"]) if meta.get("id") is not None else None),
        doc_version=str(version) if version is not None else None,
        metadata=_scalar_metadata(meta),
    )


def _bubbles_up(error: BaseException) -> bool:
    """Whether ``error`` is LangGraph's way of leaving a node early, not a failure: a
    ``GraphBubbleUp`` (an ``interrupt()`` waiting for a human's answer, a ``Command`` for the
    parent graph). Without langgraph imported, no error is one."""
    errors = sys.modules.get("langgraph.errors")
    bubble_up = getattr(errors, "GraphBubbleUp", None)
    return isinstance(bubble_up, type) and isinstance(error, bubble_up)


def _output_text(message: BaseMessage | None, structured: bool) -> str:
    """What a model call answered: the reply's text; for a structured-output call that
    answered with a tool call (``method="function_calling"``), the call's arguments."""
    if message is None:
        return ""
    text = message_text(message)
    if text or not structured or not isinstance(message, AIMessage):
        return text
    return "\n".join(json.dumps(c["args"], ensure_ascii=False) for c in message.tool_calls)


_KEPT_DEPTH = 4  # how deep a keeper run's output is searched for a reply


def _kept(outputs: Any, reply: AIMessage, keeper: str) -> bool:
    """Whether a keeper run's ``outputs`` (see :func:`~ce.langchain._scopes.keeps_replies`)
    hold ``reply``: a LangGraph node's update (or the updates of its ``Command``s) under
    ``messages`` (the very message, one with its id, or an AI message of its text); a
    ``RunnableWithMessageHistory``'s output anywhere (as a message, or as its text)."""
    text = _text_of(reply)
    if keeper != "node":
        return _holds(outputs, reply, text, 0)
    updates = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    for update in updates:
        if not isinstance(update, Mapping):
            update = getattr(update, "update", None)  # a Command carries its update
        if isinstance(update, Mapping) and _holds(update.get("messages"), reply, text, 1):
            return True
    return False


def _text_of(reply: AIMessage) -> str:
    return message_text(reply).strip()


def _holds(value: Any, reply: AIMessage, text: str, depth: int) -> bool:
    if value is reply:
        return True
    if isinstance(value, BaseMessage):
        same_id = reply.id is not None and value.id == reply.id
        return same_id or (value.type == "ai" and message_text(value).strip() == text)
    if isinstance(value, str):
        return bool(text) and value.strip() == text
    if depth >= _KEPT_DEPTH:
        return False
    items = value.values() if isinstance(value, Mapping) else value
    if isinstance(items, (list, tuple, ValuesView)):
        return any(_holds(item, reply, text, depth + 1) for item in items)
    return False


_REMOVE_ALL = "__remove_all__"  # langgraph.graph.message.REMOVE_ALL_MESSAGES
_CUT_SENT = 16  # the newest messages of a removed prefix the engine looks for


def _written_messages(outputs: Any) -> list[Any]:
    """What a LangGraph node's ``outputs`` (its update, or the updates of its ``Command``s,
    a mapping or ``(key, value)`` pairs) write under ``messages``, in order."""
    updates = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    written: list[Any] = []
    for update in updates:
        if not isinstance(update, Mapping):
            update = getattr(update, "update", None)  # a Command carries its update
        if isinstance(update, Mapping):
            pairs: Sequence[Any] = [("messages", update.get("messages"))]
        elif isinstance(update, (list, tuple)):
            pairs = update
        else:
            continue
        for pair in pairs:
            if isinstance(pair, tuple) and len(pair) == 2 and pair[0] == "messages":
                value = pair[1]
                if value is not None:
                    written.extend(value if isinstance(value, (list, tuple)) else [value])
    return written


def removed_prefix(state: Sequence[Any], outputs: Any) -> list[BaseMessage]:
    """The oldest messages of a LangGraph node's input ``state`` (its ``messages``) that
    the node's ``outputs`` remove (``RemoveMessage``s of their ids: the "add summary of the
    conversation history" how-to removes all but the newest two), when they are the oldest
    ones: none removed after one kept. ``REMOVE_ALL_MESSAGES`` followed by messages of the
    state (re-added) removes those before the first of them, when every one after it is
    re-added; followed by none of them, all of them. Any other removal (a message in the
    middle): none (the engine is told of a prefix only). A summary
    ``SummarizationMiddleware`` put in place of older turns is no turn of the
    conversation, and is left out."""
    written = _written_messages(outputs)
    removals = [m for m in written if isinstance(m, RemoveMessage)]
    if not removals:
        return []
    position = {i: n for n, m in enumerate(state) if isinstance(i := getattr(m, "id", None), str)}
    last_all = max(
        (n for n, m in enumerate(written) if isinstance(m, RemoveMessage) and m.id == _REMOVE_ALL),
        default=None,
    )
    if last_all is not None:
        readded = {
            position[i]
            for m in written[last_all + 1 :]
            if not isinstance(m, RemoveMessage) and (i := getattr(m, "id", None)) in position
        }
        count = min(readded, default=len(state))
        if any(n not in readded for n in range(count, len(state))):
            return []
    else:
        gone = {position[m.id] for m in removals if m.id in position}
        count = len(gone)
        if gone != set(range(count)):
            return []
    return [m for m in state[:count] if isinstance(m, BaseMessage) and in_conversation(m)]


def history_removal(
    state: Sequence[Any], outputs: Any
) -> tuple[str, Callable[[Recorder], Coroutine[Any, Any, Any]]] | None:
    """What the engine is told when ``outputs`` (a LangGraph node's, or a state update's)
    remove messages of ``state`` (the thread's ``messages`` before): the conversation
    started over when every message of it is removed (``REMOVE_ALL_MESSAGES`` with none of
    them re-added: the session sends none of what it holds, see
    :meth:`~ce.core.engine.ContextEngine.clear_history`); a cut of its newest removed
    messages, converted as the messages of a model call are, when the oldest ones are (see
    :func:`removed_prefix`); ``None`` otherwise. As ``(what, write)``."""
    removed = removed_prefix(state, outputs)
    if not removed:
        return None
    conversation = [m for m in state if isinstance(m, BaseMessage) and in_conversation(m)]
    if len(removed) == len(conversation):
        return CLEAR_HISTORY, Recorder.clear_history
    newest = list(removed[-_CUT_SENT:])
    return "cut history", lambda recorder: recorder.cut_history(
        openai_to_messages(to_openai(newest))
    )


def config_session(plugin: LangChainPlugin, config: Any) -> str | None:
    """The session a run with ``config`` is scoped to (``ce_session_id``,
    ``engine.session()``, the LangGraph ``thread_id`` or the ``RunnableWithMessageHistory``
    conversation, the ``install()`` session); ``None`` for a config of a subgraph's state (a
    ``checkpoint_ns``) or one that names no conversation (a run of its own)."""
    if not isinstance(config, Mapping):
        return None
    configurable = config.get("configurable") or {}
    metadata = config.get("metadata") or {}
    if not isinstance(configurable, Mapping) or not isinstance(metadata, Mapping):
        return None
    if configurable.get("checkpoint_ns"):
        return None
    scope = resolve_scope(
        plugin,
        run_id=uuid.uuid4().hex,
        explicit=explicit_session(metadata, config.get("tags")),
        framework=framework_identity({**configurable, **metadata}),
    )
    return None if scope.source == "run" else scope.session_id


def _update_values(supersteps: Any) -> list[Any]:
    """The values of a ``bulk_update_state``'s updates (``StateUpdate``s), in order."""
    return [
        getattr(update, "values", None)
        for step in supersteps or ()
        for update in (step if isinstance(step, (list, tuple)) else ())
    ]


def _removes(values: list[Any]) -> bool:
    return any(isinstance(m, RemoveMessage) for m in _written_messages(values))


def make_bulk_update_state(plugin: LangChainPlugin) -> Callable[[Any], Any]:
    """The ledger's replacement factory for LangGraph's ``Pregel.bulk_update_state`` (which
    ``update_state`` calls): an app's update of a thread's state that removes its messages
    (``RemoveMessage(id=REMOVE_ALL_MESSAGES)``: the thread starts over; the oldest ones: a
    cut) tells the engine, as a node's removal does (see :func:`history_removal`); written
    inline, as the update is a blocking call. The update itself is LangGraph's, untouched."""

    def factory(original: Any) -> Any:
        def bulk_update_state(
            self: Any, config: Any, supersteps: Any, *args: Any, **kw: Any
        ) -> Any:
            values = _update_values(supersteps)
            session = config_session(plugin, config) if _removes(values) else None
            state = _thread_messages(self.get_state, config) if session else None
            result = original(self, config, supersteps, *args, **kw)
            removal = history_removal(state, values) if session and state else None
            if session and removal is not None and plugin.installed:
                record_sync(plugin, session, *removal, blocking=True)
            return result

        bulk_update_state.__wrapped__ = original  # type: ignore[attr-defined]
        return bulk_update_state

    return factory


def make_abulk_update_state(plugin: LangChainPlugin) -> Callable[[Any], Any]:
    """The coroutine twin of :func:`make_bulk_update_state` for ``abulk_update_state`` (which
    ``aupdate_state`` calls): the engine is awaited on the caller's event loop."""

    def factory(original: Any) -> Any:
        async def abulk_update_state(
            self: Any, config: Any, supersteps: Any, *args: Any, **kw: Any
        ) -> Any:
            values = _update_values(supersteps)
            session = config_session(plugin, config) if _removes(values) else None
            state = None
            if session:
                try:
                    snapshot = await self.aget_state(config)
                    state = _snapshot_messages(snapshot)
                except Exception:  # no checkpointer, a bad config: LangGraph's update says so
                    state = None
            result = await original(self, config, supersteps, *args, **kw)
            removal = history_removal(state, values) if session and state else None
            if session and removal is not None:
                await record_awaited(plugin, session, *removal)
            return result

        abulk_update_state.__wrapped__ = original  # type: ignore[attr-defined]
        return abulk_update_state

    return factory


def make_delete_thread(plugin: LangChainPlugin) -> Callable[[Any], Any]:
    """The ledger's replacement factory for a LangGraph checkpointer's ``delete_thread``
    (each saver class implements its own; see the plugin's install): once the thread's
    checkpoints are deleted, the session a run of that thread is scoped to is cleared
    (:meth:`~ce.core.engine.ContextEngine.clear_history`), so the thread id used again starts
    a new conversation, as it does in LangGraph. Written through the session's write queue."""

    def factory(original: Any) -> Any:
        def delete_thread(self: Any, thread_id: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, thread_id, *args, **kwargs)
            clear_sessions_sync(plugin, _thread_sessions(plugin, thread_id))
            return result

        delete_thread.__wrapped__ = original  # type: ignore[attr-defined]
        return delete_thread

    return factory


def make_adelete_thread(plugin: LangChainPlugin) -> Callable[[Any], Any]:
    """The coroutine twin of :func:`make_delete_thread` for ``adelete_thread`` (the engine
    awaited on the caller's loop)."""

    def factory(original: Any) -> Any:
        async def adelete_thread(self: Any, thread_id: Any, *args: Any, **kwargs: Any) -> Any:
            result = await original(self, thread_id, *args, **kwargs)
            await clear_sessions(plugin, _thread_sessions(plugin, thread_id))
            return result

        adelete_thread.__wrapped__ = original  # type: ignore[attr-defined]
        return adelete_thread

    return factory


def _thread_sessions(plugin: LangChainPlugin, thread_id: Any) -> list[str]:
    if not plugin.installed or is_suppressed():
        return []
    session_id = config_session(plugin, {"configurable": {"thread_id": thread_id}})
    return [] if session_id is None else [session_id]


class HistoryClears:
    """A ``RunnableWithMessageHistory`` app clears a conversation's history to start it over
    (``history.clear()`` / ``aclear()``): the session that conversation's runs were recorded
    in is cleared too (:meth:`~ce.core.engine.ContextEngine.clear_history`), so its next call
    starts from what the history then holds. LangChain has no hook for it: the ``clear`` /
    ``aclear`` of each history class a run uses are wrapped through the ledger the first
    time a run uses one (:meth:`seen`, called as the run merges its config), and each
    history object's sessions are remembered weakly (:class:`ObjectSessions`): a history no
    run used clears nothing, and one user's clear never touches another's session."""

    def __init__(self, plugin: LangChainPlugin) -> None:
        self.plugin = plugin
        self.used = ObjectSessions()
        self._wrapped: set[tuple[type, str]] = set()  # (owner, method) wrapped
        self._classes: set[type] = set()  # history classes whose methods are wrapped
        self._lock = threading.Lock()

    def seen(self, history: Any, config: Any) -> None:
        """A run is about to use ``history`` with ``config`` (merged by
        ``RunnableWithMessageHistory``)."""
        session_id = config_session(self.plugin, config)
        if session_id is None or not self.plugin.installed:
            return
        with contextlib.suppress(TypeError):  # a history that cannot be held weakly
            self.used.note(history, session_id)
        self._wrap(type(history))

    def _wrap(self, cls: type) -> None:
        if cls in self._classes:  # every run after the first of its class: nothing to do
            return
        from langchain_core.chat_history import BaseChatMessageHistory

        with self._lock:
            self._classes.add(cls)
        for name, make in (("clear", self._make_clear), ("aclear", self._make_aclear)):
            owner = next((c for c in cls.__mro__ if name in vars(c)), None)
            # the base class's aclear runs clear in an executor: that clear is wrapped
            if owner is None or owner is BaseChatMessageHistory:
                continue
            with self._lock:
                if (owner, name) in self._wrapped:
                    continue
                self._wrapped.add((owner, name))
                self.plugin.ledger.wrap(owner, name, make)

    def _make_clear(self, original: Callable[..., Any]) -> Callable[..., Any]:
        clears = self

        def clear(history: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(history, *args, **kwargs)
            clear_sessions_sync(clears.plugin, clears.used.take(history) or ())
            return result

        clear.__wrapped__ = original  # type: ignore[attr-defined]
        return clear

    def _make_aclear(self, original: Callable[..., Any]) -> Callable[..., Any]:
        clears = self

        async def aclear(history: Any, *args: Any, **kwargs: Any) -> Any:
            result = await original(history, *args, **kwargs)
            await clear_sessions(clears.plugin, clears.used.take(history) or ())
            return result

        aclear.__wrapped__ = original  # type: ignore[attr-defined]
        return aclear

    def clear(self) -> None:
        with self._lock:
            self._wrapped.clear()
            self._classes.clear()
        self.used.clear()


def _thread_messages(get_state: Callable[[Any], Any], config: Any) -> list[Any] | None:
    try:
        return _snapshot_messages(get_state(config))
    except Exception:  # no checkpointer, a bad config: LangGraph's update says so
        return None


def _snapshot_messages(snapshot: Any) -> list[Any] | None:
    values = getattr(snapshot, "values", None)
    messages = values.get("messages") if isinstance(values, Mapping) else None
    return messages if isinstance(messages, list) else None


def _recording(
    call: ModelCall, reply: Message, keep: bool
) -> Callable[[Recorder], Coroutine[Any, Any, Any]]:
    """The write of a held call: with its reply as a turn when ``keep``, else without."""
    return lambda recorder: recorder.record_model_call(call, reply if keep else None)


@dataclass
class _Held:
    """A text reply made inside a keeper run, recorded when that run ends."""

    session_id: str
    call: ModelCall
    reply: Message
    original: AIMessage
    keeper: str  # the keeper run's kind (see keeps_replies)


class RecordingHandler(BaseCallbackHandler):
    """Records chat-model calls (usage, latency, first-token latency, the reply), tool runs
    (LangChain's ``tool_call_id``, status, duration) and retriever hits (as ``rag_doc``
    evidence linked to the tool that retrieved them) into the session of each call's scope,
    and follows every run's scope in ``tracker`` (runs left alone are followed too: calls
    nested in them may not be)."""

    raise_error = False
    # Called on the run's own thread, in async runs too (not on an executor thread): every
    # hook is cheap (a tracker entry, a record queued with record_sync, whose write then runs
    # as a task on the run's event loop), so an async run never hops threads nor blocks.
    run_inline = True

    def __init__(self, plugin: LangChainPlugin, tracker: ScopeTracker) -> None:
        self.plugin = plugin
        self.tracker = tracker
        self._runs: dict[UUID, _Run] = {}
        self._held: dict[UUID, list[_Held]] = {}  # by keeper run: replies it decides on
        self._lock = threading.Lock()

    # -- bookkeeping ------------------------------------------------------------------------

    def _start(self, run_id: UUID, run: _Run) -> None:
        with self._lock:
            self._runs[run_id] = run

    def _pop(self, run_id: UUID) -> _Run | None:
        self.tracker.end(run_id)
        with self._lock:
            return self._runs.pop(run_id, None)

    def _write(
        self, session_id: str, what: str, work: Callable[[Recorder], Coroutine[Any, Any, Any]]
    ) -> None:
        record_sync(self.plugin, session_id, what, work, blocking=in_blocking_call())

    # -- chains: followed for their scope only --------------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = kwargs.get("name")
        state = node_state(inputs, metadata, name)
        keeper = keeps_replies(name, state, metadata)
        # a node's own run: its input messages, in case its output removes the oldest ones
        held = (
            inputs.get("messages")
            if keeper == "node"
            and not in_hook_node(metadata)  # a middleware's hook: its documented behaviour
            and not should_skip(tags, metadata, model_call=False)
            else None
        )
        self.tracker.start(
            run_id,
            parent_run_id,
            "chain",
            metadata,
            tags,
            state=state,
            keeper=keeper,
            inputs=held if isinstance(held, list) else None,
            handed=handed_messages(inputs, metadata),
        )

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        node = self.tracker.pop(run_id)
        self._decide(run_id, outputs)
        if node is not None and node.inputs and not node.hook and self.plugin.installed:
            removal = history_removal(node.inputs, outputs)
            if removal is not None:  # the thread's session stops sending them too
                self._write(node.joins or node.scope.session_id, *removal)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        node = self.tracker.pop(run_id)
        self._decide(run_id, None)
        if node is not None and node.parent is None and self.plugin.installed:
            self._ended_unfinished(node.scope.session_id, error)

    def _ended_unfinished(self, session_id: str, error: BaseException) -> None:
        """The app's top-level run (an agent, a graph, a chain) raised: the session's run in
        flight ends (:func:`~ce.core.integration.record_run_ended`), unless LangGraph left a
        node early (an interrupt, a ``Command`` for the parent graph: no failure)."""
        if not _bubbles_up(error):
            record_run_ended(self.plugin, session_id, error, blocking=in_blocking_call())

    def _decide(self, run_id: UUID, outputs: Any) -> None:
        """Record the replies held for keeper run ``run_id``, which ended with ``outputs``
        (``None``: it failed): each as a turn when the output holds it, else as its call's
        output only (usage and ``llm_output`` evidence). A ``RunnableWithMessageHistory``
        adds its run's output to the history, the last reply: of the replies its output
        holds, only the last one made is kept (a chain may also return the question it
        rewrote)."""
        with self._lock:
            held = self._held.pop(run_id, None)
        if not held:
            return
        kept = [outputs is not None and _kept(outputs, h.original, h.keeper) for h in held]
        if held[0].keeper == "history" and any(kept):
            last = max(i for i, k in enumerate(kept) if k)
            kept = [i == last for i in range(len(held))]
        for item, keep in zip(held, kept, strict=True):
            self._write(
                item.session_id, "record model call", _recording(item.call, item.reply, keep)
            )

    # -- chat models ------------------------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[Any]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        first = messages[0] if messages else []
        key = messages_key(first) if first else None
        scope = self.tracker.start(
            run_id, parent_run_id, "model", metadata, tags, pending_key=key, messages=first
        )
        if not self.plugin.installed or should_skip(tags, metadata):
            return
        metadata = metadata or {}
        invocation = kwargs.get("invocation_params") or {}
        model = metadata.get("ls_model_name") or invocation.get("model") or ""
        model = model or invocation.get("model_name") or (serialized or {}).get("name") or ""
        self._start(
            run_id,
            _Run(
                kind="model",
                session_id=scope.session_id,
                provider=str(metadata.get("ls_provider") or invocation.get("_type") or ""),
                model=str(model),
                params={k: invocation[k] for k in _PARAMS if invocation.get(k) is not None},
                structured=bool((kwargs.get("options") or {}).get("ls_structured_output_format")),
            ),
        )

    def on_llm_new_token(self, token: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is not None and run.first_token is None:
                run.first_token = time.perf_counter()

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            peeked = self._runs.get(run_id)
        keeper = (
            self.tracker.keeper_of(run_id, peeked.session_id)
            if peeked is not None and peeked.kind == "model"
            else None
        )
        run = self._pop(run_id)
        if run is None or run.kind != "model":
            return
        generation = response.generations[0][0] if response.generations else None
        message = generation.message if isinstance(generation, ChatGeneration) else None
        if message is not None:
            self.tracker.replied(run.session_id, message)
        usage: Mapping[str, Any] = (
            message.usage_metadata if isinstance(message, AIMessage) else None
        ) or {}
        ended = time.perf_counter()
        call = ModelCall(
            call_id=str(run_id),
            provider=run.provider,
            model=run.model,
            prompt_tokens=int(usage.get("input_tokens", 0)),
            completion_tokens=int(usage.get("output_tokens", 0)),
            latency_ms=round((ended - run.perf) * 1000),
            first_token_latency_ms=(
                round((run.first_token - run.perf) * 1000) if run.first_token is not None else None
            ),
            output_text=_output_text(message, run.structured),
            params=run.params,
        )
        # A with_structured_output call answers the app, not the conversation: its output
        # parser turns the reply into the app's data, and LangChain keeps no such reply in a
        # chat history. Stored as the call's output (evidence), never as a turn, so the
        # app's next call on the same messages (a router's, a grader's) is not answered
        # already, nor does it hold a tool call without its result.
        reply = (
            ai_to_message(message, run.provider, run.model)
            if isinstance(message, AIMessage) and not run.structured
            else None
        )
        if keeper is not None and reply is not None and not reply.tool_calls:
            # a text reply inside a keeper run joins the conversation if that run keeps it
            assert isinstance(message, AIMessage)  # reply is made from one
            with self._lock:
                self._held.setdefault(keeper[0], []).append(
                    _Held(run.session_id, call, reply, message, keeper[1])
                )
            return
        self._write(run.session_id, "record model call", lambda r: r.record_model_call(call, reply))

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._pop(run_id)
        if run is None or run.kind != "model":
            return
        call = ModelCall(
            call_id=str(run_id),
            provider=run.provider,
            model=run.model,
            latency_ms=round((time.perf_counter() - run.perf) * 1000),
            params=run.params,
            error=error_text(error),
        )
        self._write(run.session_id, "record model call", lambda r: r.record_model_call(call))

    # -- tools ------------------------------------------------------------------------------

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        tool_call_id = str(kwargs.get("tool_call_id") or tool_call_in_flight() or run_id)
        scope = self.tracker.start(
            run_id, parent_run_id, "tool", metadata, tags, call_id=tool_call_id
        )
        if not self.plugin.installed or should_skip(tags, metadata, model_call=False):
            return
        self._start(
            run_id,
            _Run(
                kind="tool",
                session_id=scope.session_id,
                name=str((serialized or {}).get("name") or kwargs.get("name") or "tool"),
                tool_call_id=tool_call_id,
                args=dict(inputs) if isinstance(inputs, dict) else input_str,
            ),
        )

    def _finish_tool(self, run_id: UUID, result: str | None, error: str | None) -> None:
        run = self._pop(run_id)
        if run is None or run.kind != "tool":
            return
        hits = run.hits
        tool_run = ToolRun(
            tool_call_id=run.tool_call_id,
            name=run.name,
            args=run.args,
            result=result,
            error=error,
            started_at=run.started,
            ended_at=time.time(),
            provider_name="langchain",
        )
        self.plugin.outcomes.add(run.session_id, run.tool_call_id)
        self._write(run.session_id, "record tool run", lambda r: r.record_tool_run(tool_run))
        if hits:
            # retrieval hits inside this tool run: linked to the call id known only now
            # (older langchain-core passes no tool_call_id to on_tool_start)
            self._write(
                run.session_id,
                "record retrieval",
                lambda r: r.record_retrieval(hits, tool_run.tool_call_id),
            )

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if isinstance(output, ToolMessage):
            text = message_text(output)
            with self._lock:
                run = self._runs.get(run_id)
                if run is not None and output.tool_call_id:
                    run.tool_call_id = output.tool_call_id
            self._finish_tool(run_id, text, text if output.status == "error" else None)
        else:
            self._finish_tool(run_id, output if isinstance(output, str) else str(output), None)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """A tool that raised is recorded as a failed run; one that LangGraph interrupted
        (``interrupt()``, see :func:`_bubbles_up`) is not recorded at all: it runs again
        when the graph resumes, and that run records the outcome."""
        if _bubbles_up(error):
            self._pop(run_id)
            return
        self._finish_tool(run_id, None, error_text(error))

    # -- retrievers -------------------------------------------------------------------------

    def on_retriever_start(
        self,
        serialized: dict[str, Any],
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        scope = self.tracker.start(run_id, parent_run_id, "retriever", metadata, tags)
        if not self.plugin.installed or should_skip(tags, metadata, model_call=False):
            return
        parent_tool = None
        if parent_run_id is not None:
            with self._lock:
                parent = self._runs.get(parent_run_id)
            if parent is not None and parent.kind == "tool":
                parent_tool = parent_run_id
        self._start(
            run_id,
            _Run(
                kind="retriever",
                session_id=scope.session_id,
                parent_tool=parent_tool,
            ),
        )

    def on_retriever_end(
        self, documents: Sequence[Document], *, run_id: UUID, **kwargs: Any
    ) -> None:
        run = self._pop(run_id)
        if run is None or run.kind != "retriever":
            return
        hits = [_hit(d) for d in documents]
        if run.parent_tool is not None:
            with self._lock:
                parent = self._runs.get(run.parent_tool)
                if parent is not None:
                    parent.hits.extend(hits)
                    return
        self._write(run.session_id, "record retrieval", lambda r: r.record_retrieval(hits))

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._pop(run_id)
