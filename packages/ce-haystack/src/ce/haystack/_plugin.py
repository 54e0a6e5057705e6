"""The Haystack plugin: install / uninstall through the ce.core Plugin template."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ce.core.integration import InjectMode, Plugin
from ce.haystack.package import REQUIREMENTS

if TYPE_CHECKING:
    from ce.core.config import RuntimeConfig
    from ce.core.engine import ContextEngine

__all__ = ["HaystackPlugin", "install", "uninstall"]


class HaystackPlugin(Plugin):
    """Injects the engine's assembled input before every chat-generator call of Haystack (in
    a ``Pipeline``, sync and ``run_async``, each step of an ``Agent``'s tool loop, a generator
    called on its own; streamed or not) and records the runs: each reply, its usage and
    latency; each tool call of an Agent with its call id, status and duration; the documents
    a pipeline passes on (what its retrievers returned, less what a ranker or filter dropped)
    as ``rag_doc`` evidence (sent to the model once, fenced with the evidence id, also when a
    ``ChatPromptBuilder`` inlines them). Earlier turns a ``ChatPromptBuilder`` renders into
    the prompt go once, as the session's messages. Recording goes through a
    tracer chained to the app's own (which keeps receiving its spans) and the Agent's
    ``after_tool`` hook.

    Options of :meth:`install`: ``target`` limits the plugin to one ``Pipeline`` or
    ``Agent`` (its chat generators and Agents, on the instances); ``inject=False`` records
    only. Calls inside :func:`ce.core.integration.suppressed` are neither rewritten nor
    recorded.
    """

    name: ClassVar[str] = "haystack"
    requirements: ClassVar[tuple[str, ...]] = REQUIREMENTS

    patches: Any = None

    def _install(self, *, target: Any = None, inject: bool = True, **options: Any) -> None:
        unknown = {k for k in options if k != "_generation"}
        if unknown:
            raise TypeError(f"unknown install options: {sorted(unknown)}")
        from ce.haystack._patch import Patches

        generation = object()
        self.options["_generation"] = generation
        patches = Patches(self, target, inject, generation)
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
    target: Any = None,
    inject: bool = True,
) -> HaystackPlugin:
    """Inject the assembled input before every chat-generator call of every Haystack
    Pipeline and Agent (built before or after this call; with ``target``, of that Pipeline
    or Agent only) and record the runs; returns the plugin (``.uninstall()`` puts Haystack's
    exact original objects back, the app's tracer included). See
    :meth:`ce.core.integration.Plugin.install` for the arguments; ``inject=False`` records
    only. Idempotent."""
    return HaystackPlugin().install(
        engine,
        session_id=session_id,
        config=config,
        mode=mode,
        fail_closed=fail_closed,
        strict=strict,
        target=target,
        inject=inject,
    )


def uninstall() -> None:
    """Undo :func:`install` (a logged no-op when it is not installed)."""
    HaystackPlugin().uninstall()
