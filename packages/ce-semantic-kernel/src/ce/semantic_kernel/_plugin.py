"""The Semantic Kernel plugin: install / uninstall through the ce.core Plugin template."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ce.core.integration import InjectMode, Plugin
from ce.semantic_kernel.package import REQUIREMENTS

if TYPE_CHECKING:
    from ce.core.config import RuntimeConfig
    from ce.core.engine import ContextEngine

__all__ = ["SemanticKernelPlugin", "install", "uninstall"]


class SemanticKernelPlugin(Plugin):
    """Injects the engine's assembled input before every chat-completion request of Semantic
    Kernel (each round of the auto-function-calling loop, streamed or not:
    ``kernel.invoke_prompt`` / ``invoke`` / ``invoke_stream``, a chat service's
    ``get_chat_message_content(s)`` and ``get_streaming_chat_message_content(s)``,
    ``ChatCompletionAgent.get_response`` / ``invoke`` / ``invoke_stream``) and records the
    runs: each reply (with its agent as author), its usage and latency; each function the model
    called with SK's call id, status and duration; a search function's hits as ``rag_doc``
    evidence with source and score. SK's internal model calls (the summarization reducer, an
    ``AgentGroupChat``'s kernel-function strategies) are recorded in a child scope, never
    rewritten. Deleting a ``ChatHistoryAgentThread`` or clearing a ``ChatHistory`` the app
    sent clears the sessions their requests were recorded in (``engine.clear_history``): the
    next request starts from what the app passes then.

    Options of :meth:`install`: ``kernel`` limits the plugin to that kernel and its clones
    (calls made with it: its prompt functions, its agents, service calls given
    ``kernel=``); ``inject=False`` records only. Calls inside
    :func:`ce.core.integration.suppressed` are neither rewritten nor recorded.
    """

    name: ClassVar[str] = "semantic_kernel"
    requirements: ClassVar[tuple[str, ...]] = REQUIREMENTS

    patches: Any = None

    def _install(self, *, kernel: Any = None, inject: bool = True, **options: Any) -> None:
        unknown = {k for k in options if k != "_generation"}
        if unknown:
            raise TypeError(f"unknown install options: {sorted(unknown)}")
        from ce.semantic_kernel._patch import Patches

        generation = object()
        self.options["_generation"] = generation
        patches = Patches(self, kernel, inject, generation)
        patches.install(self.ledger)
        self.patches = patches
        self.ledger.register(self._forget, "install state")

    def _forget(self) -> None:
        self.patches = None
        self.options.pop("_generation", None)


def install(
    engine: ContextEngine | None = None,
    session_id: str | None = None,
    config: RuntimeConfig | None = None,
    *,
    mode: InjectMode = "replace",
    fail_closed: bool = False,
    strict: bool = False,
    kernel: Any = None,
    inject: bool = True,
) -> SemanticKernelPlugin:
    """Inject the assembled input before every chat-completion request of every Semantic
    Kernel kernel (built before or after this call; with ``kernel``, of that kernel and its
    clones only) and record the runs; returns the plugin (``.uninstall()`` puts SK's exact
    original methods back and removes the filters and instance wrappers it added). See
    :meth:`ce.core.integration.Plugin.install` for the arguments; ``inject=False`` records
    only. Idempotent."""
    return SemanticKernelPlugin().install(
        engine,
        session_id=session_id,
        config=config,
        mode=mode,
        fail_closed=fail_closed,
        strict=strict,
        kernel=kernel,
        inject=inject,
    )


def uninstall() -> None:
    """Undo :func:`install` (a logged no-op when it is not installed)."""
    SemanticKernelPlugin().uninstall()
