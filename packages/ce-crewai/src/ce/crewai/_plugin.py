"""The CrewAI plugin: install / uninstall through the ce.core Plugin template."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ce.core.integration import InjectMode, Plugin
from ce.crewai.package import REQUIREMENTS

if TYPE_CHECKING:
    from ce.core.config import RuntimeConfig
    from ce.core.engine import ContextEngine

__all__ = ["CrewAIPlugin", "install", "uninstall"]


class CrewAIPlugin(Plugin):
    """Injects the engine's assembled input into every agent LLM request of a crew's
    kickoff (``Crew.kickoff`` / ``Crew.akickoff``; each step of the ReAct text loop and of
    native tool calling; the executor keeps its own history) and records the runs from
    CrewAI's event bus: the kickoff's tasks with their dependencies, status and result
    evidence (task ids scoped per kickoff), each model call's usage with its task, each tool
    run with its task, status and duration. While the engine keeps the budget, each agent's
    ``respect_context_window`` summariser is off for the kickoff.

    Options of :meth:`install`: ``inject=False`` records only.
    """

    name: ClassVar[str] = "crewai"
    requirements: ClassVar[tuple[str, ...]] = REQUIREMENTS

    seams: Any = None

    def _install(self, *, inject: bool = True, **options: Any) -> None:
        if options:
            raise TypeError(f"unknown install options: {sorted(options)}")
        from ce.crewai._seams import Seams
        from crewai import Crew
        from crewai.events import (
            LLMCallCompletedEvent,
            LLMCallStartedEvent,
            TaskCompletedEvent,
            TaskFailedEvent,
            TaskStartedEvent,
            ToolUsageFinishedEvent,
            crewai_event_bus,
        )
        from crewai.llms.base_llm import BaseLLM

        seams = Seams(self, inject)
        ledger = self.ledger
        ledger.wrap(Crew, "kickoff", seams.kickoff_sync)
        ledger.wrap(Crew, "akickoff", seams.kickoff_async)
        ledger.for_subclasses(BaseLLM, lambda cls: seams.wrap_llm_class(ledger, cls))
        handlers = (
            (TaskStartedEvent, seams.on_task_started),
            (TaskCompletedEvent, seams.on_task_completed),
            (TaskFailedEvent, seams.on_task_failed),
            (LLMCallStartedEvent, seams.on_llm_started),
            (LLMCallCompletedEvent, seams.on_llm_completed),
            (ToolUsageFinishedEvent, seams.on_tool_finished),
        )
        for event, handler in handlers:
            crewai_event_bus.on(event)(handler)
            ledger.register(
                lambda e=event, h=handler: crewai_event_bus.off(e, h),
                f"crewai_event_bus handler of {event.__name__}",
            )
        self.seams = seams
        ledger.register(self._forget, "install state")

    def _forget(self) -> None:
        self.seams = None


def install(
    engine: ContextEngine | None = None,
    session_id: str | None = None,
    config: RuntimeConfig | None = None,
    *,
    mode: InjectMode = "replace",
    fail_closed: bool = False,
    strict: bool = False,
    inject: bool = True,
) -> CrewAIPlugin:
    """Inject the assembled input before every agent LLM request of every crew kickoff and
    record the runs; returns the plugin (``.uninstall()`` puts CrewAI's exact original
    methods back and removes its event-bus handlers). See
    :meth:`ce.core.integration.Plugin.install` for the arguments; ``inject=False`` records
    only. Idempotent."""
    return CrewAIPlugin().install(
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
    CrewAIPlugin().uninstall()
