"""Which session each CrewAI call belongs to.

A run is one ``Crew.kickoff`` / ``akickoff`` (its tasks, their dependencies), one
``Agent.kickoff`` / ``kickoff_async`` / ``akickoff`` outside a crew, or one direct
``LLM.call`` / ``acall`` made while installed. Its session follows the kit's rule
(:func:`ce.core.integration.resolve_scope`): ``with engine.session(...)``, then the
``session_id`` given to ``install()``, else the run's own scope. A run started inside another
(an agent kicked off from a tool, a crew kicked off inside a crew's run) is nested: a child
scope of the outer run. A model call for a task the crew did not declare (the work a
hierarchical crew's manager delegates to a coworker through its delegation tool) is a
sub-agent called as a tool: it runs in a child scope of the crew's session and never sees or
changes the crew's conversation. So does each task a crew runs alongside another (consecutive
``async_execution`` tasks, which CrewAI starts together): concurrent tasks never see each
other's conversation while it is in flight.

The current run travels in a context variable: CrewAI's event bus runs its sync handlers in
a copy of the emitting context, so a handler sees the run (and the model call) it reports on.
Where CrewAI runs work on a thread of its own without that context, a task's run is found by
the task's id.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ce.core.integration import AskedToolCalls, Scope, resolve_scope

if TYPE_CHECKING:
    from ce.core.integration import Plugin

__all__ = [
    "Run",
    "Runs",
    "Target",
    "TaskReports",
    "concurrent_tasks",
    "current_call",
    "current_run",
    "current_work",
    "in_planning",
]

current_run: contextvars.ContextVar[Run | None] = contextvars.ContextVar(
    "ce_crewai_run", default=None
)
"""The run the code on this context belongs to."""

in_planning: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "ce_crewai_planning", default=False
)
"""True while an agent plans its task (``AgentReasoning.handle_agent_reasoning``:
``Agent(reasoning=True)``, a ``PlanningConfig``): its model calls name the task and the agent,
yet they are the planner's, not turns of the task's conversation."""

current_work: contextvars.ContextVar[tuple[Any, Any] | None] = contextvars.ContextVar(
    "ce_crewai_work", default=None
)
"""``(task, agent)``: the task an agent executes on this context (``Agent.execute_task``),
or ``(None, agent)`` for an agent kicked off on its own. A model call CrewAI makes for that
agent without naming it (the forced final answer once ``max_iter`` is reached) belongs to
its conversation."""

current_call: contextvars.ContextVar[Target | None] = contextvars.ContextVar(
    "ce_crewai_call", default=None
)
"""Where the model call in flight on this context goes (set while CrewAI's own call runs:
a nested call inside it is CrewAI's, not the agent's, and passes through)."""


class TaskReports:
    """What CrewAI reported of a run's tasks: the ids of those it started and of those it
    ended (completed or failed), and whether the kickoff itself ended raising (cancelled, or
    failed), having closed the tasks it left open. ``lock`` is held around a report and the
    write it queues, so each task's records reach the session in the order they were
    decided."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: set[str] = set()
        self.finished: set[str] = set()
        self.ended = False


@dataclass(frozen=True)
class Run:
    """One kickoff (or direct model call): its id (task ids are scoped by it), its scope, the
    object that started it, the crew's own tasks with their dependencies (a task without a
    ``context`` of its own gets every earlier task's output, so it depends on them), those of
    them that run alongside another (:func:`concurrent_tasks`), an async kickoff's loop and
    what CrewAI reported of its tasks (:class:`TaskReports`)."""

    run_id: str
    scope: Scope
    owner: int = 0
    tasks: frozenset[str] = frozenset()
    depends: Mapping[str, list[str]] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None
    concurrent: frozenset[str] = frozenset()
    reports: TaskReports = field(default_factory=TaskReports, compare=False, repr=False)

    @property
    def session_id(self) -> str:
        return self.scope.session_id

    def task_id(self, task_id: str) -> str:
        """A CrewAI task id as the session knows it (scoped by the run)."""
        return f"{self.run_id}:{task_id}"


@dataclass(frozen=True)
class Target:
    """Where one model call or tool run is recorded and assembled: its run, its session, its
    task (scoped) and the role of the agent that made it."""

    run: Run
    session_id: str
    task_id: str | None = None
    role: str | None = None


def concurrent_tasks(tasks: list[Any]) -> frozenset[str]:
    """The ids of the ``tasks`` a crew runs alongside another: each run of two or more
    consecutive ``async_execution`` tasks, which CrewAI starts together and awaits before
    the next task that is not async. A lone async task overlaps no other work."""
    found: set[str] = set()
    batch: list[str] = []
    for task in [*tasks, None]:
        if task is not None and getattr(task, "async_execution", False) is True:
            batch.append(str(task.id))
            continue
        if len(batch) > 1:
            found.update(batch)
        batch = []
    return frozenset(found)


def _key(task: Any) -> str | None:
    if task is None:
        return None
    key = getattr(task, "id", task)
    return str(key) if key is not None else None


class Runs:
    """The runs of one install: started, looked up by context or task, and the native tool
    calls each model call asked for (CrewAI's tool events carry no call id)."""

    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin
        self._lock = threading.Lock()
        self._by_task: dict[str, Run] = {}
        self._asked = AskedToolCalls()  # by (run id, session id): the calls not run yet

    def begin(
        self,
        owner: Any = None,
        tasks: list[Any] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Run:
        """A new run started by ``owner`` (a crew with its ``tasks``, an agent, or nothing
        for a direct model call), nested in the current run if there is one."""
        run_id = uuid.uuid4().hex
        parent = current_run.get()
        scope = resolve_scope(
            self.plugin, run_id=run_id, parent=parent.scope if parent is not None else None
        )
        tasks = tasks or []
        depends: dict[str, list[str]] = {}
        for index, task in enumerate(tasks):
            context = getattr(task, "context", None)
            sources = context if isinstance(context, list) else tasks[:index]
            depends[str(task.id)] = [f"{run_id}:{t.id}" for t in sources]
        run = Run(
            run_id,
            scope,
            owner=id(owner) if owner is not None else 0,
            tasks=frozenset(str(t.id) for t in tasks),
            depends=depends,
            loop=loop,
            concurrent=concurrent_tasks(tasks),
        )
        with self._lock:
            for key in run.tasks:
                self._by_task[key] = run
        return run

    def end(self, run: Run) -> None:
        """Forget ``run``'s tasks (what CrewAI reports on them later carries the run in its
        context) and the tool calls it asked for that never ran."""
        with self._lock:
            for key in run.tasks:
                if self._by_task.get(key) is run:
                    del self._by_task[key]
        self._asked.drop(lambda key: isinstance(key, tuple) and key[0] == run.run_id)

    def run_of(self, task: Any) -> Run | None:
        """The run of the current context, else the latest run of ``task``'s crew."""
        run = current_run.get()
        if run is not None:
            return run
        key = _key(task)
        if key is None:
            return None
        with self._lock:
            return self._by_task.get(key)

    def target(self, run: Run, task: Any, role: str | None) -> Target:
        """Where a call of ``task`` (a task object or its id, or None) by the agent ``role``
        in ``run`` goes: the run's session, or a child scope of it for a task the crew did
        not declare (delegated work) and for a task that runs alongside another."""
        key = _key(task)
        task_id = run.task_id(key) if key is not None else None
        if key is not None and run.tasks and (key not in run.tasks or key in run.concurrent):
            scope = resolve_scope(self.plugin, run_id=key, parent=run.scope)
            return Target(run, scope.session_id, task_id, role)
        return Target(run, run.session_id, task_id, role)

    def note_call(self, target: Target, tool: str, call_id: str, args: Any) -> None:
        """Note that the model call of ``target`` asked for ``tool`` with ``args`` as
        ``call_id``, for the tool event of that run (:meth:`take_call_id`)."""
        self._asked.note((target.run.run_id, target.session_id), [(call_id, tool, args)])

    def take_call_id(self, target: Target, tool: str, args: Any) -> str | None:
        """The id of the noted call of ``tool`` in ``target`` that ran with ``args`` (CrewAI
        may run a reply's calls in parallel and finish them in any order): the earliest
        noted with the same arguments, else (arguments that do not parse or match) the
        earliest noted; None when none is waiting (the text format has no call ids)."""
        key = (target.run.run_id, target.session_id)
        return self._asked.take(key, tool, args, fallback=True)
