"""The AutoGen plugin: install / uninstall through the ce.core Plugin template."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, ClassVar

from ce.autogen.package import REQUIREMENTS
from ce.core.integration import InjectMode, Plugin, PluginVersionError

if TYPE_CHECKING:
    from ce.autogen._record import Book
    from ce.autogen._scopes import Runs
    from ce.core.config import RuntimeConfig
    from ce.core.engine import ContextEngine

__all__ = ["AutoGenPlugin", "ag2_installed", "install", "uninstall"]

_AG2_MESSAGE = (
    "ce.autogen supports AutoGen's autogen-agentchat 0.7 (AssistantAgent, teams: what "
    "`pip install pyautogen` installs today, imported as autogen_agentchat); the `autogen` "
    "module here is AG2 (the ag2 / autogen fork with ConversableAgent, what pyautogen < 0.10 "
    "installed), a different API ce.autogen does not hook into. Install autogen-agentchat "
    "(`pip install 'autogen-agentchat>=0.7,<0.8'`) and build your agents with it."
)


def ag2_installed() -> bool:
    """Whether ``import autogen`` gives AG2 (its ``ConversableAgent``), not the Microsoft
    line (which imports as ``autogen_agentchat`` and has no top-level ``autogen``)."""
    module = sys.modules.get("autogen")
    if module is None:
        import importlib.util

        try:
            if importlib.util.find_spec("autogen") is None:
                return False
        except (ImportError, ValueError):
            return False
        try:
            import autogen as module  # type: ignore[import-not-found,no-redef,unused-ignore]
        except Exception:  # a broken AG2 install is still not what the plugin supports
            return True
    return hasattr(module, "ConversableAgent") or hasattr(module, "AssistantAgent")


class AutoGenPlugin(Plugin):
    """Injects the engine's assembled input before every model call of every AutoGen
    ``AssistantAgent`` (every call of its tool loop and its reflection, streamed or not, in
    ``run``, ``run_stream``, ``on_messages`` and in teams: ``RoundRobinGroupChat``,
    ``SelectorGroupChat``, ``Swarm``), and records the runs: each reply with its agent as
    author, its usage and latency; each tool run with AutoGen's call id, status and duration;
    each memory query's hits as ``rag_doc`` evidence; a ``SelectorGroupChat``'s speaker
    selections (usage and output only: their prompt is never rewritten). A reset
    (``agent.on_reset``, ``team.reset()``) clears the session of the object's last run, so the
    next run starts the conversation over.

    Options of :meth:`install`: ``target`` (an agent or a team, or a list of them) limits the
    plugin to those (a team's agents included); ``inject=False`` records only (every call's
    messages, usage and reply are recorded; the model gets the agent's own list, and model
    calls of tool bodies are left alone). Calls inside
    :func:`ce.core.integration.suppressed` are neither rewritten nor recorded.
    """

    name: ClassVar[str] = "autogen"
    requirements: ClassVar[tuple[str, ...]] = REQUIREMENTS

    runs: Runs | None = None
    book: Book | None = None

    def install(self, engine: ContextEngine | None = None, **kwargs: Any) -> AutoGenPlugin:
        """:meth:`ce.core.integration.Plugin.install`, refused with
        :class:`~ce.core.integration.PluginVersionError` when ``import autogen`` is AG2."""
        if not self.installed and ag2_installed():
            raise PluginVersionError(_AG2_MESSAGE)
        return super().install(engine, **kwargs)

    def _install(self, *, target: Any = None, inject: bool = True, **options: Any) -> None:
        if options:
            raise TypeError(f"unknown install options: {sorted(options)}")
        from ce.autogen._patch import Patches
        from ce.autogen._record import Book
        from ce.autogen._scopes import Runs

        targets: list[Any] = []
        if target is not None:
            targets = list(target) if isinstance(target, (list, tuple, set)) else [target]
        runs = Runs(self, targets)
        book = Book()
        Patches(self, runs, book, inject).install(self.ledger)
        if inject:
            from ce.autogen._clients import ClientSeams

            # model calls a tool body makes itself, outside any agent: nested in the tool call
            ClientSeams(self, runs, book, self.ledger).install()
        self.runs, self.book = runs, book
        self.ledger.register(self._forget, "runs in flight")

    def _forget(self) -> None:
        if self.runs is not None:
            self.runs.clear()
        self.runs = self.book = None


def install(
    engine: ContextEngine | None = None,
    *,
    session_id: str | None = None,
    config: RuntimeConfig | None = None,
    mode: InjectMode = "replace",
    fail_closed: bool = False,
    strict: bool = False,
    target: Any = None,
    inject: bool = True,
) -> AutoGenPlugin:
    """Inject the assembled input before every model call of every AutoGen
    ``AssistantAgent`` (built before or after this call; with ``target``, of that agent or
    team only) and record the runs; returns the plugin (``.uninstall()`` puts AutoGen's exact
    original methods back). See :meth:`ce.core.integration.Plugin.install` for the
    arguments; ``inject=False`` records only. Idempotent. Raises
    :class:`~ce.core.integration.PluginVersionError` when ``import autogen`` is AG2."""
    return AutoGenPlugin().install(
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
    AutoGenPlugin().uninstall()
