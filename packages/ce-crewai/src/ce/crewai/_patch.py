"""The kickoff wrappers: each ``Crew.kickoff`` / ``akickoff`` and each ``Agent.kickoff`` /
``kickoff_async`` / ``akickoff`` outside a crew starts a run (its scope, a crew's tasks
recorded pending with their dependencies) for the calls made inside it, and closes the tasks
it leaves open when it ends raising (cancelled, or failed); and the task wrappers:
``Agent.execute_task`` / ``aexecute_task`` mark the task and agent at work.

Why a patch: CrewAI's kickoff events are emitted after the kickoff has begun and carry no
handle the calls inside it could be tied to from a context, so the run is opened around the
kickoff itself. ``Crew.kickoff_async`` runs ``kickoff`` on a thread (covered by it); a
streaming kickoff runs the same kickoff again inside (the run is opened there). An agent's
executor asks for its forced final answer (``max_iter`` reached) naming neither its task nor
its agent, so the task an agent executes is marked around ``execute_task`` for that call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ce.core.integration import guarded, guarded_sync, is_suppressed
from ce.core.schema import Task, TaskStatus
from ce.crewai._convert import task_record
from ce.crewai._scopes import Run, Runs, current_run, current_work

if TYPE_CHECKING:
    from ce.core.integration import Plugin

__all__ = ["Kickoffs", "patched_targets"]


def patched_targets() -> list[tuple[Any, str]]:
    """The ``(owner, attribute)`` pairs an install replaces on CrewAI's own classes (plus
    ``call`` / ``acall`` of every other provider class that defines them)."""
    from crewai import Agent, Crew
    from crewai.knowledge.knowledge import Knowledge
    from crewai.llms.base_llm import BaseLLM
    from crewai.memory.unified_memory import Memory
    from crewai.utilities.reasoning_handler import AgentReasoning

    targets: list[tuple[Any, str]] = [(Crew, "kickoff"), (Crew, "akickoff")]
    targets += [(Agent, name) for name in ("kickoff", "kickoff_async", "akickoff")]
    targets += [(Agent, "execute_task"), (Agent, "aexecute_task")]
    targets += [(Knowledge, "query"), (Knowledge, "aquery")]
    targets += [(Memory, "recall"), (Memory, "arecall")]
    targets += [(AgentReasoning, "handle_agent_reasoning")]
    for cls in _subclasses(BaseLLM):
        targets += [(cls, name) for name in ("call", "acall") if name in vars(cls)]
    return targets


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    subs: list[type] = cls.__subclasses__()
    for sub in subs:
        found += [sub, *_subclasses(sub)]
    return list(dict.fromkeys(found))


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Kickoffs:
    """The kickoff wrappers of one install."""

    def __init__(self, plugin: Plugin, runs: Runs, inject: bool) -> None:
        self.plugin = plugin
        self.runs = runs
        self.inject = inject

    def _passes(self, owner: Any) -> bool:
        if not self.plugin.installed or is_suppressed():
            return True
        if _is_crew(owner) and getattr(owner, "stream", False) is True:
            return True  # the kickoff streams: the run opens in the kickoff it runs inside
        run = current_run.get()
        return run is not None and run.owner == id(owner)  # a kickoff calling its twin

    def _begin(self, owner: Any, loop: asyncio.AbstractEventLoop | None) -> Run:
        return self.runs.begin(owner, _tasks_of(owner), loop)

    def _window_off(self, owner: Any) -> dict[int, bool]:
        """While the engine keeps the budget CrewAI's own summariser must not rewrite the
        engine's input: each agent's ``respect_context_window`` is off during the kickoff."""
        saved: dict[int, bool] = {}
        if self.inject:
            for agent in _agents(owner):
                if hasattr(agent, "respect_context_window"):
                    saved[id(agent)] = bool(agent.respect_context_window)
                    agent.respect_context_window = False
        return saved

    @staticmethod
    def _window_back(owner: Any, saved: dict[int, bool]) -> None:
        for agent in _agents(owner):
            if id(agent) in saved:
                agent.respect_context_window = saved[id(agent)]

    def _pending(
        self, run: Run, owner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[Task]:
        """The crew's tasks as the kickoff starts them, pending: each described as this
        kickoff's ``inputs`` will make it (CrewAI interpolates them only later in the
        kickoff; until then a task reads as the template, or as the previous kickoff, maybe
        another user's, left it)."""
        inputs = _inputs_of(args, kwargs)
        return [
            task_record(run, t, TaskStatus.PENDING, _described(t, inputs)) for t in _tasks_of(owner)
        ]

    def _queue_pending(
        self, run: Run, owner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> threading.Event | None:
        """Queue the kickoff's tasks, pending, on its session (see :meth:`_pending`): written
        with the records its events queue, before the session's next engine call (the first
        model call's ``prepare_call``, whose input then lists them), in one commit with
        them, not in a commit of their own. Returns what is set once they are written (None:
        no tasks), for :meth:`_unwritten`."""
        records = self._pending(run, owner, args, kwargs)
        return self._queue_tasks(run, records) if records else None

    def _close_open(
        self,
        run: Run,
        owner: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        error: BaseException,
    ) -> None:
        """A kickoff that ends raising ``error`` closes the tasks CrewAI reported no end of,
        so the session never lists them as open: cancelled (the kickoff was cancelled, or
        interrupted), else failed with the error (a task it started) or cancelled as not run
        (one it never started). CrewAI sends no event for a task whose kickoff was cancelled
        in flight; an end CrewAI does report, handled later, is recorded after this and
        corrects it. Each task named as :meth:`_pending` named it."""
        tasks = _tasks_of(owner)
        if not tasks:
            return
        inputs = _inputs_of(args, kwargs)
        failed = isinstance(error, Exception)
        reports = run.reports
        with reports.lock:
            reports.ended = True
            records: list[Task] = []
            for task in tasks:
                key = str(task.id)
                if key in reports.finished:
                    continue
                if not failed:
                    status, reason = TaskStatus.CANCELLED, "the kickoff was cancelled"
                elif key in reports.started:
                    status, reason = TaskStatus.FAILED, str(error) or type(error).__name__
                else:
                    status, reason = TaskStatus.CANCELLED, "not run: the kickoff failed"
                described = _described(task, inputs)
                records.append(task_record(run, task, status, described, error=reason))
            if records:
                self._queue_tasks(run, records)

    def _queue_tasks(self, run: Run, records: list[Task]) -> threading.Event:
        """Queue ``records`` on the run's session (written before its next engine call,
        fail-open); returns what is set once they are written."""
        plugin, session_id = self.plugin, run.session_id
        engine = plugin.engine
        written = threading.Event()

        async def deferred() -> None:
            try:
                await guarded(
                    plugin,
                    lambda: engine.upsert_tasks(session_id, records),
                    session_id=session_id,
                    what="upsert_tasks",
                )
            finally:
                written.set()

        engine.defer(session_id, deferred)
        return written

    @staticmethod
    def _unwritten(run: Run, written: threading.Event | None) -> str | None:
        """The session to flush at the end of a kickoff whose tasks are still queued (no
        engine call ran during it: the kickoff failed before its first model call, or made
        none the plugin sees), so a session's queue never holds more than one kickoff."""
        return run.session_id if written is not None and not written.is_set() else None

    def sync(self, original: Callable[..., Any]) -> Callable[..., Any]:
        kickoffs = self

        def kickoff(owner: Any, *args: Any, **kwargs: Any) -> Any:
            if kickoffs._passes(owner) or (not _is_crew(owner) and _in_loop()):
                # an agent's kickoff on a running loop hands over to its kickoff_async
                return original(owner, *args, **kwargs)
            run = kickoffs._begin(owner, None)
            written = kickoffs._queue_pending(run, owner, args, kwargs)
            saved = kickoffs._window_off(owner)
            token = current_run.set(run)
            work = current_work.set(_work_of(owner))
            try:
                return original(owner, *args, **kwargs)
            except BaseException as error:
                kickoffs._close_open(run, owner, args, kwargs, error)
                raise
            finally:
                current_work.reset(work)
                current_run.reset(token)
                kickoffs.runs.end(run)
                kickoffs._window_back(owner, saved)
                session_id = kickoffs._unwritten(run, written)
                if session_id is not None:
                    engine = kickoffs.plugin.engine
                    guarded_sync(
                        kickoffs.plugin,
                        lambda: engine.sync.flush(session_id),
                        session_id=session_id,
                        what="flush",
                    )

        return kickoff

    def asynchronous(self, original: Callable[..., Any]) -> Callable[..., Any]:
        kickoffs = self

        async def akickoff(owner: Any, *args: Any, **kwargs: Any) -> Any:
            if kickoffs._passes(owner):
                return await original(owner, *args, **kwargs)
            run = kickoffs._begin(owner, asyncio.get_running_loop())
            written = kickoffs._queue_pending(run, owner, args, kwargs)
            saved = kickoffs._window_off(owner)
            token = current_run.set(run)
            work = current_work.set(_work_of(owner))
            try:
                return await original(owner, *args, **kwargs)
            except BaseException as error:
                kickoffs._close_open(run, owner, args, kwargs, error)
                raise
            finally:
                current_work.reset(work)
                current_run.reset(token)
                kickoffs.runs.end(run)
                kickoffs._window_back(owner, saved)
                session_id = kickoffs._unwritten(run, written)
                if session_id is not None:
                    engine = kickoffs.plugin.engine
                    await guarded(
                        kickoffs.plugin,
                        lambda: engine.flush(session_id),
                        session_id=session_id,
                        what="flush",
                    )

        return akickoff

    @staticmethod
    def task_sync(original: Callable[..., Any]) -> Callable[..., Any]:
        """``Agent.execute_task``, with the task and the agent marked at work on its context
        (:data:`~ce.crewai._scopes.current_work`)."""

        def execute_task(agent: Any, *args: Any, **kwargs: Any) -> Any:
            token = current_work.set((_task_arg(args, kwargs), agent))
            try:
                return original(agent, *args, **kwargs)
            finally:
                current_work.reset(token)

        return execute_task

    @staticmethod
    def task_async(original: Callable[..., Any]) -> Callable[..., Any]:
        """The coroutine twin of :meth:`task_sync` (``Agent.aexecute_task``)."""

        async def aexecute_task(agent: Any, *args: Any, **kwargs: Any) -> Any:
            token = current_work.set((_task_arg(args, kwargs), agent))
            try:
                return await original(agent, *args, **kwargs)
            finally:
                current_work.reset(token)

        return aexecute_task


def _task_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The task of an ``execute_task(task, context=None, tools=None)`` call."""
    return kwargs["task"] if "task" in kwargs else args[0] if args else None


def _tasks_of(owner: Any) -> list[Any]:
    """The tasks of a crew; none for an agent."""
    return list(getattr(owner, "tasks", None) or []) if _is_crew(owner) else []


def _inputs_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The ``inputs`` of a ``kickoff(inputs=None, ...)`` call."""
    return kwargs.get("inputs", args[0] if args else None)


def _work_of(owner: Any) -> tuple[Any, Any] | None:
    """What a kickoff of ``owner`` is at work on: an agent on its own (no task), or nothing
    yet for a crew (its agents mark their tasks)."""
    return None if _is_crew(owner) else (None, owner)


def _described(task: Any, inputs: Any) -> str:
    """``task``'s description once a kickoff with ``inputs`` interpolated them, as CrewAI
    does: its template (kept after the first interpolation) filled in; with no inputs, the
    description as it stands (CrewAI leaves it so)."""
    description = str(getattr(task, "description", ""))
    if not inputs or not isinstance(inputs, Mapping):
        return description
    template = getattr(task, "_original_description", None) or description
    try:
        from crewai.utilities.string_utils import interpolate_only

        return str(interpolate_only(input_string=template, inputs=dict(inputs)))
    except Exception:  # CrewAI raises for a missing variable: the kickoff will too
        return template


def _is_crew(owner: Any) -> bool:
    return hasattr(owner, "tasks") and hasattr(owner, "agents")


def _agents(owner: Any) -> list[Any]:
    """The agents of a crew, or the agent kicked off on its own."""
    return list(getattr(owner, "agents", None) or []) if _is_crew(owner) else [owner]
