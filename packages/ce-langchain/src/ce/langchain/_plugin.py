"""The LangChain plugin: install / uninstall through the ce.core Plugin template."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar

from ce.core.integration import InjectMode, Plugin
from ce.langchain.package import REQUIREMENTS

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from ce.core.config import RuntimeConfig
    from ce.core.engine import ContextEngine
    from ce.langchain._inject import ToolOutcomes
    from ce.langchain._record import HistoryClears
    from ce.langchain._scopes import ScopeTracker

__all__ = ["LangChainPlugin", "install", "middleware", "uninstall", "wrap"]


class LangChainPlugin(Plugin):
    """Records every LangChain run and injects the engine's assembled input before every
    chat-model call (``invoke``, ``ainvoke``, ``stream``, ``astream``; tool loops of
    ``create_agent`` and LangGraph graphs included): sync calls through the blocking engine
    (``engine.sync``, inline), async calls awaiting the engine on the caller's event loop.
    The model receives the app's own message objects wherever the engine kept them.

    With ``mode="augment"`` the model receives the app's own messages, the engine's context
    (memory, state, summary, evidence) as one more system message after the app's system
    prompt, and the history trimmed to the budget (see
    :func:`ce.core.integration.augment_openai`).

    Options of :meth:`install`: ``patch=False`` records only and leaves injection to
    :func:`middleware`. Calls are left alone (neither rewritten nor recorded) inside
    :func:`ce.core.integration.suppressed`, for models or runs tagged ``"ce:skip"`` (or with
    metadata ``{"ce_skip": True}``), and for a ``create_agent`` middleware's own model calls
    (a summarizer's, a tool selector's: those LangChain marks internal, and those made in a
    middleware hook node such as ``before_model``).

    Sessions follow :func:`ce.core.integration.resolve_scope`: ``ce_session_id`` metadata,
    ``engine.session()``, the LangGraph ``thread_id`` or the ``RunnableWithMessageHistory``
    session (``configurable["session_id"]`` or its ``history_factory_config`` keys), the
    ``session_id`` given to ``install()``, else the call's own root run (``run:<run id>``).
    A call inside a tool or retriever run gets the child scope ``<outer>/<tool_call_id>``; a
    LangGraph node run beside others in one superstep (its input state holding messages), the
    branch ``<outer>/<node>:<task id>``; a LangGraph run handed messages of its own (a
    ``Send``'s payload, a compiled graph a node asks a question of its own), the child scope
    ``<outer>/<node>:<task or run id>``.
    """

    name: ClassVar[str] = "langchain"
    requirements: ClassVar[tuple[str, ...]] = REQUIREMENTS

    tracker: ScopeTracker
    """The runs in flight and their scopes (while installed)."""
    outcomes: ToolOutcomes
    """The tool calls whose outcome is recorded, by session (while installed)."""
    history_clears: HistoryClears
    """The message histories runs used, whose clear clears their session (while installed)."""

    def _install(self, *, patch: bool = True, **options: Any) -> None:
        if options:
            raise TypeError(f"unknown install options: {sorted(options)}")
        from langchain_core.language_models import BaseChatModel
        from langchain_core.runnables.history import RunnableWithMessageHistory
        from langchain_core.tools import BaseTool
        from langchain_core.tracers import context as tracer_context

        from ce.langchain._inject import ToolOutcomes
        from ce.langchain._patch import make_ainvoke, make_astream, make_convert_input
        from ce.langchain._record import HistoryClears, RecordingHandler
        from ce.langchain._scopes import (
            ScopeTracker,
            make_history_merge,
            make_runner_tick,
            make_tool_arun,
            make_tool_run,
        )

        self.tracker = ScopeTracker(self)
        self.ledger.register(self.tracker.clear, "scope tracker (runs in flight)")
        self.outcomes = ToolOutcomes()
        self.ledger.register(self.outcomes.clear, "tool calls with a recorded outcome")
        # The conversation a RunnableWithMessageHistory's history_factory_config keys name,
        # and the tool_call_id of a starting tool run (older langchain-core does not pass it
        # to on_tool_start): both needed to scope the calls under them.
        self.history_clears = HistoryClears(self)  # a cleared history clears its session
        self.ledger.register(self.history_clears.clear, "message histories and their sessions")
        self.ledger.wrap(
            RunnableWithMessageHistory,
            "_merge_configs",
            make_history_merge(self.history_clears.seen),
        )
        self.ledger.wrap(BaseTool, "run", make_tool_run)
        self.ledger.wrap(BaseTool, "arun", make_tool_arun)
        try:  # LangGraph is optional
            from langgraph.checkpoint.base import BaseCheckpointSaver
            from langgraph.pregel import Pregel
        except ImportError:
            pass
        else:
            # An app's state update that removes a thread's messages, and a checkpointer's
            # deletion of a thread (the app's ways to start a thread over): LangGraph runs no
            # callback for either, and each saver class implements its own deletion.
            from ce.langchain._record import (
                make_abulk_update_state,
                make_adelete_thread,
                make_bulk_update_state,
                make_delete_thread,
            )

            self.ledger.wrap(Pregel, "bulk_update_state", make_bulk_update_state(self))
            self.ledger.wrap(Pregel, "abulk_update_state", make_abulk_update_state(self))
            deletes = (
                ("delete_thread", make_delete_thread(self)),
                ("adelete_thread", make_adelete_thread(self)),
            )

            def wrap_deletes(saver: type) -> None:
                for name, make in deletes:
                    if name in vars(saver):
                        self.ledger.wrap(saver, name, make)

            self.ledger.for_subclasses(BaseCheckpointSaver, wrap_deletes)
            try:  # LangGraph's private runner of a superstep's tasks
                from langgraph.pregel._runner import PregelRunner
            except ImportError:
                pass
            else:
                # The tasks of a superstep, known before any of them starts: a node that runs
                # beside others is a branch of its own (see ScopeTracker.run_beside).
                tick = make_runner_tick(self.tracker.run_beside)
                self.ledger.wrap(PregelRunner, "tick", tick)
                self.ledger.wrap(PregelRunner, "atick", tick)
        handler = RecordingHandler(self, self.tracker)
        # A ContextVar with a default: every thread and task sees the handler, no set() needed.
        var: ContextVar[Any] = ContextVar("ce_langchain_handler", default=handler)
        tracer_context.register_configure_hook(var, True)
        hooks = tracer_context._configure_hooks
        entry = hooks[-1]
        assert entry[0] is var

        def unregister() -> None:
            # LangChain has no unregister: take our entry out of its hook list again.
            for index, hook in enumerate(hooks):
                if hook[0] is var:
                    del hooks[index]
                    break

        self.ledger.register(unregister, "langchain configure hook (RecordingHandler)")
        if patch:
            # No public hook can change a chat model's input on every call: the sync paths
            # are prepared inline in the one conversion invoke / stream go through; ainvoke /
            # astream await the engine first and hand that conversion the prepared input
            # (the seams and why: ce.langchain._patch).
            self.ledger.wrap(BaseChatModel, "_convert_input", make_convert_input(self))
            self.ledger.wrap(BaseChatModel, "ainvoke", make_ainvoke(self))
            self.ledger.wrap(BaseChatModel, "astream", make_astream(self))


def install(
    engine: ContextEngine | None = None,
    *,
    session_id: str | None = None,
    config: RuntimeConfig | None = None,
    mode: InjectMode = "replace",
    fail_closed: bool = False,
    strict: bool = False,
    patch: bool = True,
) -> LangChainPlugin:
    """Record every LangChain run and inject the assembled input before every chat-model
    call; returns the plugin (``.uninstall()`` restores LangChain exactly). See
    :meth:`ce.core.integration.Plugin.install` for the arguments; ``patch=False`` records
    only (inject with :func:`middleware` instead). Idempotent."""
    return LangChainPlugin().install(
        engine,
        session_id=session_id,
        config=config,
        mode=mode,
        fail_closed=fail_closed,
        strict=strict,
        patch=patch,
    )


def uninstall() -> None:
    """Undo :func:`install` (a logged no-op when it is not installed)."""
    LangChainPlugin().uninstall()


def middleware(engine: ContextEngine | None = None, **install_options: Any) -> Any:
    """A ``create_agent`` middleware (``middleware=[ce.langchain.middleware()]``) injecting
    the assembled input through LangChain's official ``wrap_model_call`` seam. Installs the
    plugin for recording (with ``patch=False``) when it is not installed yet; when the global
    patch is installed too, a call is injected once."""
    from ce.langchain._inject import make_middleware

    plugin = LangChainPlugin()
    if not plugin.installed:
        plugin.install(engine, patch=False, **install_options)
    return make_middleware(plugin)


def wrap(
    model: BaseChatModel, engine: ContextEngine | None = None, **install_options: Any
) -> BaseChatModel:
    """``model`` as a chat model that receives the engine's assembled input on every call
    (``invoke``, ``ainvoke``, ``stream``, ``astream``; ``bind_tools`` works and the bound
    tools' schemas are counted against the budget), for LCEL / LangGraph apps that prefer an
    explicit wrapper to the global patch. Installs the plugin for recording (with
    ``patch=False``) when it is not installed yet; with the global patch installed too, a
    call is injected once."""
    from ce.langchain._wrap import ContextEngineChatModel

    plugin = LangChainPlugin()
    if not plugin.installed:
        plugin.install(engine, patch=False, **install_options)
    return ContextEngineChatModel(inner=model)
