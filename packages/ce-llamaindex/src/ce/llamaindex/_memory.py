"""``ContextEngineMemory``: a LlamaIndex ``BaseMemory`` whose history is the engine's session;
the resets of LlamaIndex's own memories, which clear the session they were recorded in; and
a ``Memory``'s flush to its memory blocks, which cuts the flushed messages from that session.

LlamaIndex emits no event when a memory is reset (``chat_engine.reset()`` calls
``memory.reset()``, the documented way to start a new conversation), so at install the plugin
wraps, through its ledger, the ``reset`` / ``areset`` every memory class defines itself (those
created later too): after the memory emptied itself, the engine session its conversation was
recorded in is cleared (:meth:`ce.core.engine.ContextEngine.clear_history`): the next call
starts from what the app passes then. That session is the one the last top-level run using
the memory was in (the span handler notes it per memory object, held weakly), else the
conversation the memory names itself; never another (two users' memories never clear each
other's sessions).

A ``Memory`` with memory blocks moves the messages that outgrow its chat history into its blocks
when a message is put (its flush hands them to each block's ``aput`` with
``from_short_term_memory``) and drops them from the history it returns: the model gets them
once, as the blocks render them in the memory's system message. The session would send them
again as history turns, so the plugin wraps ``Memory.aput`` / ``aput_messages`` (which the sync
``put`` / ``put_messages`` run on an event loop of LlamaIndex's own) and cuts what the put
flushed from the session (:meth:`ce.core.engine.ContextEngine.cut_history`). A ``Memory``
without blocks (or whose blocks refuse flushed messages) only trims: nothing holds what it
drops, and the engine's budget keeps what the session sends within the model's window
instead.
"""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.memory.memory import BaseMemoryBlock, Memory
from llama_index.core.memory.types import BaseMemory
from llama_index.core.storage.chat_store.sql import (  # type: ignore[attr-defined]
    MessageStatus,  # where llama_index.core.memory.memory imports it from
)

from ce.core.engine import ContextEngine
from ce.core.formats import to_openai_messages
from ce.core.integration import (
    CLEAR_HISTORY,
    Recorder,
    assembled_to_openai,
    clear_sessions,
    clear_sessions_sync,
    guarded,
    guarded_sync,
    is_suppressed,
    marking,
    openai_key,
    openai_to_messages,
    record_sync,
    resolve_scope,
)
from ce.core.schema import MessagePart, Role, SessionDocument
from ce.llamaindex._convert import from_openai, to_openai
from ce.llamaindex._plugin import LlamaIndexPlugin
from ce.llamaindex._scopes import explicit_session, in_memory_work, memory_session, method_of

if TYPE_CHECKING:
    from ce.core.integration import PatchLedger
    from ce.llamaindex._scopes import SpanInfo

__all__ = ["ContextEngineMemory", "clear_on_reset", "cut_on_flush"]


class ContextEngineMemory(BaseMemory):
    """Chat memory for chat engines and agents that take ``memory=``: what it is given is
    recorded into the engine's session, and what it returns is the session's history as the
    engine assembles it (within the budget, tool calls kept with their results, redacted).

    ``session_id`` names the session (also for the plugin's recording of the runs that use
    this memory). Without one the memory is its own conversation: it generates a session id
    once (``"memory:<uuid>"``, :attr:`conversation_id`) and keeps it for its lifetime, so two
    memories never share history and one memory's runs do. As everywhere, an
    ``instrument_tags`` ``ce_session_id`` or ``with engine.session(...)`` around the run takes
    precedence over the generated id; inside a run the plugin tracks, the memory uses the
    session the plugin resolved for the span it is called in (a memory used by a sub-agent
    inside a tool is in that tool call's child scope). ``engine`` defaults to the installed
    plugin's. Messages put into the memory are recorded at the next ``get``; ``set`` only
    replaces what was not recorded yet, ``reset`` (``chat_engine.reset()``) starts the
    conversation over: the session sends none of the messages it holds (they stay stored).
    The engine's context blocks (evidence, notebook, summary) reach the model through the
    plugin's injection or :func:`ce.llamaindex.wrap`; the memory returns the conversation.
    """

    session_id: str | None = None
    engine: Any = Field(default=None, exclude=True)

    ce_memory: ClassVar[bool] = True  # the plugin reads session_id as a session name

    _pending: list[ChatMessage] = PrivateAttr(default_factory=list)
    _generated: str = PrivateAttr(default_factory=lambda: f"memory:{uuid.uuid4().hex}")
    _session: str | None = PrivateAttr(default=None)  # the session it read or recorded last

    @classmethod
    def class_name(cls) -> str:
        return "ContextEngineMemory"

    @classmethod
    def from_defaults(
        cls,
        engine: ContextEngine | None = None,
        session_id: str | None = None,
        **kwargs: Any,
    ) -> ContextEngineMemory:
        """A memory over ``engine``'s session ``session_id``."""
        if kwargs:
            raise TypeError(f"unknown arguments: {sorted(kwargs)}")
        return cls(engine=engine, session_id=session_id)

    @property
    def conversation_id(self) -> str:
        """The conversation this memory stands for: its ``session_id``, else the id it
        generated for itself."""
        return self.session_id or self._generated

    def _engine_and_session(self) -> tuple[ContextEngine, str]:
        from llama_index.core.instrumentation.dispatcher import (  # type: ignore[attr-defined]
            active_instrument_tags,
        )
        from llama_index.core.instrumentation.span import active_span_id

        plugin = LlamaIndexPlugin()
        engine = self.engine if self.engine is not None else plugin.engine
        tracker = plugin.tracker if plugin.installed else None
        info = tracker.span(active_span_id.get()) if tracker is not None else None
        if info is not None:  # the session the plugin resolved for this span
            self._session = info.session_id
            return engine, info.session_id
        explicit = explicit_session(active_instrument_tags.get()) or self.session_id
        scope = resolve_scope(
            plugin, run_id=self.conversation_id, explicit=explicit, framework=self._generated
        )
        self._session = scope.session_id
        return engine, scope.session_id

    def _to_clear(self) -> tuple[ContextEngine, str]:
        """The engine and the session a reset clears: the one the memory read or recorded
        last, else the one it would use now."""
        last = self._session
        engine, session_id = self._engine_and_session()
        self._session = last or session_id
        return engine, self._session

    def _take_pending(self) -> list[Any]:
        pending, self._pending = self._pending, []
        return openai_to_messages(to_openai(pending))

    @staticmethod
    def _history(sent: list[dict[str, Any]]) -> list[ChatMessage]:
        return from_openai([m for m in sent if m["role"] != "system"], [], [])

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """Record what was put since the last call, and return the assembled history."""
        engine, session_id = self._engine_and_session()
        plugin = LlamaIndexPlugin()
        result = engine.sync.prepare_call(session_id, self._take_pending(), plugin.config)
        return self._history(assembled_to_openai(result.assembled_input))

    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        engine, session_id = self._engine_and_session()
        plugin = LlamaIndexPlugin()
        result = await engine.prepare_call(session_id, self._take_pending(), plugin.config)
        return self._history(assembled_to_openai(result.assembled_input))

    def get_all(self) -> list[ChatMessage]:
        """Every message of the conversation the session holds (system instructions
        excepted; none from before a :meth:`reset`, nor others the app removed); what was put
        since the last ``get`` is not recorded yet."""
        engine, session_id = self._engine_and_session()
        return self._all(engine.sync.get_session(session_id))

    async def aget_all(self) -> list[ChatMessage]:
        engine, session_id = self._engine_and_session()
        return self._all(await engine.get_session(session_id))

    def _all(self, doc: SessionDocument) -> list[ChatMessage]:
        summary = doc.session.summary
        removed = 0 if summary is None else summary.removed_by_app
        parts = [
            MessagePart(
                role=m.role,
                content=m.content,
                tool_calls=m.tool_calls,
                tool_call_id=m.tool_call_id,
                name=m.name,
            )
            for m in doc.session.messages[removed:]
            if m.role is not Role.SYSTEM
        ]
        return self._history(to_openai_messages(parts))

    def put(self, message: ChatMessage) -> None:
        self._pending.append(message)

    async def aput(self, message: ChatMessage) -> None:
        self.put(message)

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        self.put_messages(messages)

    def set(self, messages: list[ChatMessage]) -> None:
        """Record ``messages`` at the next ``get`` (those the session holds are not written
        again)."""
        self._pending = list(messages)

    def reset(self) -> None:
        """Start the conversation over: drop what was put and not recorded yet, and clear the
        session's history (:meth:`~ce.core.engine.ContextEngine.clear_history`, through
        ``engine.sync``): none of the messages it holds is sent again (they stay stored). The
        session is the one the memory read or recorded last (a run's, as the plugin resolved
        it), else the one it would use now. Fail-open: an engine error is logged and reported
        (a ``Degraded`` event), raised only with the plugin's ``fail_closed``. A reset inside
        another memory's reset (a composite memory resetting its parts) clears nothing more."""
        self._pending = []
        if in_memory_work.get():
            return
        guarded_sync(
            LlamaIndexPlugin(),
            self._clear_sync,
            session_id=self._session or self.conversation_id,
            what=CLEAR_HISTORY,
        )

    async def areset(self) -> None:
        """The coroutine twin of :meth:`reset` (the engine awaited)."""
        self._pending = []
        if in_memory_work.get():
            return
        await guarded(
            LlamaIndexPlugin(),
            self._clear,
            session_id=self._session or self.conversation_id,
            what=CLEAR_HISTORY,
        )

    def _clear_sync(self) -> None:
        engine, session_id = self._to_clear()
        engine.sync.clear_history(session_id)

    async def _clear(self) -> None:
        engine, session_id = self._to_clear()
        await engine.clear_history(session_id)


# -- LlamaIndex's own memories ----------------------------------------------------------------


def clear_on_reset(ledger: PatchLedger) -> None:
    """Wrap, in ``ledger``, ``BaseMemory.areset`` and the ``reset`` / ``areset`` of every
    memory class that defines its own (``ChatMemoryBuffer``'s, ``Memory``'s,
    ``ChatSummaryMemoryBuffer``'s, ``SimpleComposableMemory``'s, ``VectorMemory``'s, an app's;
    classes created later too) with :func:`_clearing`. :class:`ContextEngineMemory` clears in
    its own reset."""
    _wrap_resets(ledger, BaseMemory)
    ledger.for_subclasses(BaseMemory, lambda cls: _wrap_resets(ledger, cls))


def _wrap_resets(ledger: PatchLedger, cls: type) -> None:
    if getattr(cls, "ce_memory", False):
        return
    for name in ("reset", "areset"):
        method = vars(cls).get(name)
        if inspect.isfunction(method) and not getattr(method, "__isabstractmethod__", False):
            ledger.wrap(cls, name, _clearing)


def _clearing(original: Callable[..., Any]) -> Callable[..., Any]:
    """A memory's reset (sync or coroutine, as ``original``): ``original`` runs, then the
    session of the memory's conversation (:func:`_sessions_of`) is cleared: from a sync reset
    through the engine's per-session write queue (:func:`ce.core.integration.record_sync`:
    written now by ``engine.sync`` on a plain thread, queued on an event loop's thread and
    written before the session's next engine call), from an async one awaited on the caller's
    loop. Fail-open (an engine error is logged and reported, the reset stands), raised with the
    plugin's ``fail_closed``; a reset that raised clears nothing. A reset made inside a
    memory's own work (another memory's reset resetting its parts, ``Memory.reset`` running
    ``areset``, ``ChatSummaryMemoryBuffer.get`` rewriting its buffer) clears nothing more."""
    marked = marking(in_memory_work, True)(original)
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def areset(memory: BaseMemory, *args: Any, **kwargs: Any) -> Any:
            if in_memory_work.get():
                return await original(memory, *args, **kwargs)
            result = await marked(memory, *args, **kwargs)
            await clear_sessions(LlamaIndexPlugin(), _sessions_of(memory))
            return result

        return areset

    @functools.wraps(original)
    def reset(memory: BaseMemory, *args: Any, **kwargs: Any) -> Any:
        if in_memory_work.get():
            return original(memory, *args, **kwargs)
        result = marked(memory, *args, **kwargs)
        clear_sessions_sync(LlamaIndexPlugin(), _sessions_of(memory))
        return result

    return reset


def _sessions_of(memory: BaseMemory) -> list[str]:
    """The session a reset of ``memory`` clears: the one the last top-level run using it was
    recorded in, else the conversation the memory names (:func:`memory_session`: a
    ``Memory``'s ``session_id``, a ``ChatMemoryBuffer``'s own ``chat_store_key``), else none
    (a memory no run used and that names nothing has no session)."""
    tracker = LlamaIndexPlugin().tracker
    used = tracker.memory_session(memory) if tracker is not None else None
    session_id = used or memory_session(memory)
    return [] if session_id is None else [session_id]


# -- a Memory's flush to its memory blocks ----------------------------------------------------

_CUT_SENT = 16  # the newest flushed messages a cut names (the engine looks for those)
_CUT_HISTORY = "cut history"

_flushed: ContextVar[list[list[ChatMessage]] | None] = ContextVar(
    "ce_llamaindex_flushed", default=None
)
"""While a message is put into a ``Memory`` (see :func:`cut_on_flush`): each batch of messages
its flush handed to a memory block that keeps them, once (every block gets the same list)."""

_blocking_put: ContextVar[bool] = ContextVar("ce_llamaindex_blocking_put", default=False)
"""True inside a sync ``Memory.put`` / ``put_messages``: a blocking call, which runs the put
on an event loop of LlamaIndex's own."""


def cut_on_flush(ledger: PatchLedger) -> None:
    """Wrap, in ``ledger``, ``BaseMemoryBlock.aput`` with :func:`_into_block` (a block's own
    work, noting what a flush hands it), ``Memory.aput`` / ``aput_messages`` (which flush)
    with :func:`_cutting`, and the sync ``Memory.put`` / ``put_messages`` (which run those)
    with :data:`_blocking_put` set."""
    ledger.wrap(BaseMemoryBlock, "aput", _into_block)
    for name in ("aput", "aput_messages"):
        ledger.wrap(Memory, name, _cutting)
    for name in ("put", "put_messages"):
        ledger.wrap(Memory, name, marking(_blocking_put, True))


def _into_block(original: Callable[..., Any]) -> Callable[..., Any]:
    """A memory block's ``aput``: ``original`` runs as the memory's own work
    (:data:`~ce.llamaindex._scopes.in_memory_work`: a ``FactExtractionMemoryBlock``'s model
    call is no turn of the conversation); the messages a ``Memory``'s flush gives it
    (``from_short_term_memory``) are noted first when the block keeps them
    (``accept_short_term_memory``)."""
    marked = marking(in_memory_work, True)(original)

    @functools.wraps(original)
    async def aput(block: BaseMemoryBlock[Any], *args: Any, **kwargs: Any) -> Any:
        batches = _flushed.get()
        messages = args[0] if args else kwargs.get("messages")
        flushed = kwargs.get("from_short_term_memory", args[1] if len(args) > 1 else False)
        if (
            batches is not None
            and flushed
            and block.accept_short_term_memory
            and isinstance(messages, list)
            and not any(batch is messages for batch in batches)
        ):
            batches.append(messages)
        return await marked(block, *args, **kwargs)

    return aput


def _cutting(original: Callable[..., Any]) -> Callable[..., Any]:
    """A ``Memory``'s ``aput`` / ``aput_messages`` (given the message or the messages put):
    it collects the batches its flush hands to the memory's blocks (:func:`_into_block`) and,
    once ``original`` returned, cuts them from the session (:func:`_cut_flushed`)."""

    @functools.wraps(original)
    async def aput(memory: Memory, *args: Any, **kwargs: Any) -> Any:
        batches: list[list[ChatMessage]] = []
        token = _flushed.set(batches)
        try:
            result = await original(memory, *args, **kwargs)
        finally:
            _flushed.reset(token)
        if batches:
            put = args[0] if args else kwargs.get("message", kwargs.get("messages"))
            await _cut_flushed(memory, put, [m for batch in batches for m in batch])
        return result

    return aput


async def _cut_flushed(memory: Memory, put: Any, flushed: list[ChatMessage]) -> None:
    """Cut the ``flushed`` messages (:func:`_cut_of`) from the session of ``memory``'s
    conversation: the one the plugin resolved for the span the put runs in (a run's; a tool
    call's child scope for a sub-agent's memory), else the one a reset of the memory clears
    (:func:`_sessions_of`). Written through the session's ordered writes
    (:func:`~ce.core.integration.record_sync`: queued on an event loop, inline inside a sync
    put), fail-open (raised with the plugin's ``fail_closed``)."""
    plugin = LlamaIndexPlugin()
    tracker = plugin.tracker
    if tracker is None or not plugin.installed or is_suppressed():
        return
    from llama_index.core.instrumentation.span import active_span_id

    span_id = active_span_id.get()
    info = tracker.span(span_id)
    session_id = info.session_id if info is not None else next(iter(_sessions_of(memory)), None)
    if session_id is None:
        return
    asked = _unasked(span_id, info)
    cut = await guarded(
        plugin,
        lambda: _cut_of(memory, put, flushed, asked),
        session_id=session_id,
        what=_CUT_HISTORY,
    )
    if cut is not None:
        record_sync(plugin, session_id, _CUT_HISTORY, cut, blocking=_blocking_put.get())


async def _cut_of(
    memory: Memory, put: Any, flushed: list[ChatMessage], asked: bool
) -> Callable[[Recorder], Coroutine[Any, Any, Any]] | None:
    """The write that cuts ``flushed`` from the session (``None``: nothing to cut).

    The engine cuts up to the newest stored message that reads as one of those it is given;
    LlamaIndex messages carry no ids, so a flushed message that reads as one the memory keeps
    (an answer given twice) is left out of them (the newest :data:`_CUT_SENT` of the others,
    converted as the messages of a model call are): the cut never takes a kept turn. A cut
    never reaches the session's newest user message either: when ``put`` (the message or the
    messages put) ends with a question no model call asked yet (``asked``, see
    :func:`_unasked`) and the flush took every user message before it, the session's newest
    one is the previous question, flushed with its turn; the question is then recorded first
    (the model call finds it recorded), so the cut takes that turn too."""
    kept = await memory.aget_all(status=MessageStatus.ACTIVE)
    kept_keys = {openai_key(m) for m in to_openai(kept)}
    removed = [m for m in to_openai(flushed) if openai_key(m) not in kept_keys][-_CUT_SENT:]
    if not removed:
        return None
    last = put[-1] if isinstance(put, list) and put else put
    first = (
        openai_to_messages(to_openai([last]))
        if asked
        and isinstance(last, ChatMessage)
        and last.role is MessageRole.USER
        and sum(m.role is MessageRole.USER for m in kept) == 1
        else []
    )
    cut = openai_to_messages(removed)

    async def write(recorder: Recorder) -> None:
        if first:
            await recorder.engine.record_messages(recorder.session_id, first)
        await recorder.cut_history(cut)

    return write


def _unasked(span_id: str | None, info: SpanInfo | None) -> bool:
    """Whether a question put into a memory in span ``span_id`` is asked by no model call yet:
    in a workflow agent's ``init_run`` (it puts the run's question before the run's first
    call), or in a chat engine's ``chat`` that answers with its own model call and made none
    yet (``SimpleChatEngine`` puts the question first; ``ContextChatEngine`` and
    ``CondensePlusContextChatEngine`` put it with the answer)."""
    if span_id is not None and method_of(span_id) == "init_run":
        return True
    turn = info.chat_turn if info is not None else None
    return turn is not None and not turn.answered and not turn.queried
