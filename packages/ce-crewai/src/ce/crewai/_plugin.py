"""The CrewAI plugin: install / uninstall through the ce.core Plugin template."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from ce.core.integration import InjectMode, Plugin, marking
from ce.crewai.package import REQUIREMENTS

if TYPE_CHECKING:
    from ce.core.config import RuntimeConfig
    from ce.core.engine import ContextEngine

__all__ = ["CrewAIPlugin", "install", "uninstall"]


class CrewAIPlugin(Plugin):
    """Injects the engine's assembled input into every agent LLM request (each step of the
    ReAct text loop and of native tool calling; the executor keeps its own history) of every
    crew kickoff (``Crew.kickoff``, ``kickoff_async``, ``akickoff``, streaming), every agent
    kicked off outside a crew (``Agent.kickoff``, ``kickoff_async``, ``akickoff``) and every
    direct ``LLM.call`` / ``acall``, and records the runs from CrewAI's event bus: a crew's
    tasks with their dependencies, status and result evidence (task ids scoped per kickoff),
    each model call's usage with its task and an agent's final answer authored by its role,
    each tool run with its id, task, status and duration; and each knowledge or memory hit
    retrieved inside a run as ``rag_doc`` evidence. While the engine keeps the budget,
    the ``respect_context_window`` summariser of each agent of a kickoff is off for it.

    A kickoff is its own scope unless a session is named (``with engine.session(...)``, the
    ``session_id`` of :meth:`install`); a kickoff inside another run, the work a
    hierarchical crew's manager delegates and CrewAI's own model calls inside a run (memory,
    the knowledge query rewrite, planning) get a child scope. Options of :meth:`install`:
    ``inject=False`` records only.
    """

    name: ClassVar[str] = "crewai"
    requirements: ClassVar[tuple[str, ...]] = REQUIREMENTS

    def _install(self, *, inject: bool = True, **options: Any) -> None:
        if options:
            raise TypeError(f"unknown install options: {sorted(options)}")
        import crewai.events as events
        from ce.crewai._inject import Injector
        from ce.crewai._patch import Kickoffs
        from ce.crewai._record import Recorders
        from ce.crewai._scopes import Runs, in_planning
        from crewai import Agent, Crew
        from crewai.events import crewai_event_bus
        from crewai.knowledge.knowledge import Knowledge
        from crewai.llms.base_llm import BaseLLM
        from crewai.memory.unified_memory import Memory
        from crewai.utilities.reasoning_handler import AgentReasoning

        runs = Runs(self)
        kickoffs = Kickoffs(self, runs, inject)
        injector = Injector(self, runs, inject)
        recorders = Recorders(self, runs)
        ledger = self.ledger
        ledger.wrap(Crew, "kickoff", kickoffs.sync)
        ledger.wrap(Crew, "akickoff", kickoffs.asynchronous)
        ledger.wrap(Agent, "kickoff", kickoffs.sync)
        ledger.wrap(Agent, "kickoff_async", kickoffs.asynchronous)
        ledger.wrap(Agent, "akickoff", kickoffs.asynchronous)
        # the task an agent executes, for the model call its executor makes naming neither
        # (the forced final answer once max_iter is reached)
        ledger.wrap(Agent, "execute_task", kickoffs.task_sync)
        ledger.wrap(Agent, "aexecute_task", kickoffs.task_async)
        # knowledge and memory hits: CrewAI's retrieval events carry only the joined text,
        # so the query / recall is wrapped for each hit's content, score and source
        ledger.wrap(Knowledge, "query", recorders.knowledge_query)
        ledger.wrap(Knowledge, "aquery", recorders.knowledge_aquery)
        ledger.wrap(Memory, "recall", recorders.memory_recall)
        ledger.wrap(Memory, "arecall", recorders.memory_arecall)
        # an agent planning its task calls the model with the task and the agent: marked, so
        # those calls are the planner's run, not turns of the task
        ledger.wrap(AgentReasoning, "handle_agent_reasoning", marking(in_planning, True))
        ledger.for_subclasses(BaseLLM, lambda cls: injector.wrap_llm_class(ledger, cls))
        for name, handler in recorders.handlers():
            event = getattr(events, name)
            crewai_event_bus.on(event)(handler)
            ledger.register(
                _unsubscriber(crewai_event_bus, event, handler),
                f"crewai_event_bus handler of {name}",
            )


def _unsubscriber(bus: Any, event: type, handler: Callable[[Any, Any], None]) -> Callable[[], None]:
    """What removes ``handler`` of ``event`` from ``bus`` again."""

    def off() -> None:
        bus.off(event, handler)

    return off


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
    """Inject the assembled input before every agent LLM request of every kickoff (and every
    direct ``LLM.call``) and record the runs; returns the plugin (``.uninstall()`` puts
    CrewAI's exact original methods back and removes its event-bus handlers). See
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
