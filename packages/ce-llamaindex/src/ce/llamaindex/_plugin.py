"""The LlamaIndex plugin: install / uninstall through the ce.core Plugin template."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ce.core.integration import InjectMode, Plugin, marking
from ce.llamaindex.package import REQUIREMENTS

if TYPE_CHECKING:
    from llama_index.core.llms import LLM

    from ce.core.config import RuntimeConfig
    from ce.core.engine import ContextEngine
    from ce.llamaindex._record import Tracker
    from ce.llamaindex._wrap import ContextEngineLLM

__all__ = ["LlamaIndexPlugin", "install", "uninstall", "wrap"]


def _remove(handlers: list[Any], handler: object) -> None:
    for index, candidate in enumerate(handlers):
        if candidate is handler:
            del handlers[index]
            return


class LlamaIndexPlugin(Plugin):
    """Records every LlamaIndex run and injects the engine's assembled input before every
    LLM chat call (``chat``, ``achat``, ``stream_chat``, ``astream_chat``: FunctionAgent,
    AgentWorkflow and ReActAgent tool loops, chat engines, and direct LLM calls).

    It adds one span handler and one event handler to LlamaIndex's root dispatcher and, to
    await the engine on async calls, wraps every LLM class's ``achat`` / ``astream_chat``, and
    to redact the prompt of completions (``complete``, ``acomplete``, ``stream_complete``,
    ``astream_complete``: a chat engine's condense step), their completion methods (those of
    LLM classes created later too); so that a memory's reset (``chat_engine.reset()``) clears
    the session its conversation was recorded in, every memory class's ``reset`` / ``areset``
    (see :mod:`ce.llamaindex._memory`); so that what a ``Memory`` flushes to its memory blocks
    leaves the session's history too (the model gets it once, in the blocks), ``Memory.aput``
    / ``aput_messages`` / ``put`` / ``put_messages`` and ``BaseMemoryBlock.aput`` (ibid.); so
    that the model call a ``StructuredLLM``'s stream or a streamed structured prediction
    makes as it is read is that call's,
    ``StructuredLLM.stream_chat`` / ``astream_chat`` and the ``stream_structured_predict`` /
    ``astream_structured_predict`` of every LLM class (see :mod:`ce.llamaindex._seam`); so
    that the tools an agent's ``tool_retriever`` picks are no retrieved documents,
    ``ObjectRetriever.retrieve`` / ``aretrieve``; :meth:`uninstall` removes exactly those. With
    ``mode="augment"`` the model receives the app's own messages plus the engine's context (see
    :func:`ce.core.integration.augment_openai`). Option of :meth:`install`: ``inject=False``
    records only (inject with :func:`wrap` instead). Calls inside
    :func:`ce.core.integration.suppressed` are neither rewritten nor recorded.
    """

    name: ClassVar[str] = "llamaindex"
    requirements: ClassVar[tuple[str, ...]] = REQUIREMENTS

    tracker: Tracker | None = None

    def _install(self, *, inject: bool = True, **options: Any) -> None:
        if options:
            raise TypeError(f"unknown install options: {sorted(options)}")
        from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]

        from ce.llamaindex._handlers import EventRecorder, SpanTracker
        from ce.llamaindex._record import Tracker

        root = get_dispatcher()
        tracker = Tracker(self)
        spans = SpanTracker().bind(tracker, inject)
        events = EventRecorder().bind(tracker)
        root.add_span_handler(spans)
        self.ledger.register(lambda: _remove(root.span_handlers, spans), "root span handler")
        root.add_event_handler(events)
        self.ledger.register(lambda: _remove(root.event_handlers, events), "root event handler")
        self.tracker = tracker
        self.ledger.register(self._forget_tracker, "tracker")
        self._mark_memory_work()
        self._mark_object_retrieval()
        from ce.llamaindex._memory import clear_on_reset

        clear_on_reset(self.ledger)  # a memory's reset clears its session
        if inject:
            from ce.llamaindex._seam import Seams

            # async chat calls await the engine inside their span (see _seam: why there);
            # completions get their prompt redacted inside theirs
            Seams(
                self.ledger, spans.inject_deferred, spans.redact_prompt_sync, spans.redact_prompt
            ).install()
        self._mark_structured_reads()
        if self.fail_closed and inject:
            self._raise_from_span_enter()

    def _mark_structured_reads(self) -> None:
        """A ``StructuredLLM``'s stream and an LLM's streamed structured prediction (of every
        LLM class, those created later too) are read with
        :data:`~ce.llamaindex._scopes.in_structured_stream` set to their span's id: the model
        call made as the app reads the stream, after that span closed, is that call's (see
        ``_seam``: the read seam)."""
        from llama_index.core.base.llms.base import BaseLLM
        from llama_index.core.llms.structured_llm import StructuredLLM

        from ce.llamaindex._scopes import in_structured_stream
        from ce.llamaindex._seam import PREDICT_READS, STRUCTURED_READS, mark_reads

        ledger = self.ledger
        mark_reads(ledger, StructuredLLM, in_structured_stream, STRUCTURED_READS)
        ledger.for_subclasses(
            BaseLLM, lambda cls: mark_reads(ledger, cls, in_structured_stream, PREDICT_READS)
        )

    def _mark_memory_work(self) -> None:
        """A memory's own work (``FactExtractionMemoryBlock`` extracting the facts of the
        messages a ``Memory`` flushes to it; ``ChatSummaryMemoryBuffer`` summarising the
        oldest messages when the chat engine reads it, then resetting its buffer;
        ``VectorMemory.set`` resetting its store before it puts the messages) runs with
        :data:`~ce.llamaindex._scopes.in_memory_work` set: LlamaIndex opens no span there
        to tell its model calls from the conversation's, and its resets are no app's. What a
        ``Memory`` flushes to its blocks is cut from the session its conversation is recorded
        in (see :mod:`ce.llamaindex._memory`)."""
        from llama_index.core.memory import ChatSummaryMemoryBuffer, VectorMemory

        from ce.llamaindex._memory import cut_on_flush
        from ce.llamaindex._scopes import in_memory_work

        cut_on_flush(self.ledger)  # a block's aput is marked there too
        self.ledger.wrap(ChatSummaryMemoryBuffer, "get", marking(in_memory_work, True))
        self.ledger.wrap(VectorMemory, "set", marking(in_memory_work, True))

    def _mark_object_retrieval(self) -> None:
        """An ``ObjectRetriever``'s retrieval (an agent's ``tool_retriever`` picking the tools
        of a step) runs with :data:`~ce.llamaindex._scopes.in_object_retrieval` set: the
        retriever inside it emits the usual retrieval events, but its hits are the objects'
        texts (a tool's name, description and schema), never documents of the session."""
        from llama_index.core.objects.base import ObjectRetriever

        from ce.llamaindex._scopes import in_object_retrieval

        self.ledger.wrap(ObjectRetriever, "retrieve", marking(in_object_retrieval, True))
        self.ledger.wrap(ObjectRetriever, "aretrieve", marking(in_object_retrieval, True))

    def _forget_tracker(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
        self.tracker = None

    def _raise_from_span_enter(self) -> None:
        # The dispatcher swallows every error of its handlers, so no handler can stop a
        # call; with fail_closed the engine's error must reach the caller: span_enter (which
        # runs before the LLM method body, outside the wrapper's try) re-raises it. The async
        # seam raises its own error into the call itself.
        from llama_index.core.instrumentation.dispatcher import (  # type: ignore[attr-defined]
            Dispatcher,
        )
        from llama_index.core.instrumentation.span import active_span_id

        from ce.llamaindex._handlers import failure

        def factory(original: Any) -> Any:
            def span_enter(
                self: Dispatcher,
                id_: str,
                bound_args: Any,
                instance: Any = None,
                parent_id: str | None = None,
                tags: dict[str, Any] | None = None,
                **kwargs: Any,
            ) -> None:
                original(
                    self,
                    id_=id_,
                    bound_args=bound_args,
                    instance=instance,
                    parent_id=parent_id,
                    tags=tags,
                    **kwargs,
                )
                error = failure(id_)
                if error is not None:
                    active_span_id.set(parent_id)  # the span never starts: its parent is current
                    raise error

            return span_enter

        self.ledger.wrap(Dispatcher, "span_enter", factory)


def install(
    engine: ContextEngine | None = None,
    *,
    session_id: str | None = None,
    config: RuntimeConfig | None = None,
    mode: InjectMode = "replace",
    fail_closed: bool = False,
    strict: bool = False,
    inject: bool = True,
) -> LlamaIndexPlugin:
    """Record every LlamaIndex run and inject the assembled input before every LLM chat
    call; returns the plugin (``.uninstall()`` restores the root dispatcher's handler lists
    exactly). See :meth:`ce.core.integration.Plugin.install` for the arguments;
    ``inject=False`` records only (inject with :func:`wrap` instead). Idempotent."""
    return LlamaIndexPlugin().install(
        engine,
        session_id=session_id,
        config=config,
        mode=mode,
        fail_closed=fail_closed,
        strict=strict,
        inject=inject,
    )


def uninstall() -> None:
    """Undo :func:`install` (a logged no-op when it is not installed)."""
    LlamaIndexPlugin().uninstall()


def wrap(llm: LLM, engine: ContextEngine | None = None, **install_options: Any) -> ContextEngineLLM:
    """``llm`` as an LLM that receives the engine's assembled input on every chat call
    (``chat``, ``achat``, ``stream_chat``, ``astream_chat``, and the ``*_with_tools`` calls of
    function-calling agents, whose tool schemas count against the budget), for apps that
    prefer an explicit wrapper to the global span handler. Installs the plugin for recording
    (with ``inject=False``) when it is not installed yet; with the global injection installed
    too, a call is injected once."""
    from ce.llamaindex._wrap import ContextEngineLLM

    plugin = LlamaIndexPlugin()
    if not plugin.installed:
        plugin.install(engine, inject=False, **install_options)
    return ContextEngineLLM(inner=llm)
