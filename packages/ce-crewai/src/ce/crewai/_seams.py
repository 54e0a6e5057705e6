"""The seams of one install: the kickoff wrapper (which session each task's calls go to),
the LLM request wrapper (the engine's input instead of the executor's messages) and the
event-bus handlers (tasks, model calls, tool runs).

Why these seams: CrewAI's global ``before_llm_call`` hooks are copied into each executor when
it is built and their edits persist in the executor's history, so the request is rewritten
at ``BaseLLM.call`` / ``acall`` instead (every provider class that defines them, those
created later too): the model gets the engine's messages, the executor keeps its own. The
async path awaits the engine inside ``acall``; the sync path calls it from CrewAI's own
thread. Recording runs on the event bus, whose sync handlers run on CrewAI's thread pool.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ce.core.integration import (
    ModelCall,
    Recorder,
    ToolRun,
    guarded,
    guarded_sync,
    model_usage_from_call,
    prepare_openai,
    prepare_openai_sync,
    provider_of,
    resolve_scope,
    tool_call_from_run,
    tool_result_evidence,
)
from ce.core.pipeline import is_react_step
from ce.core.schema import (
    Author,
    AuthorKind,
    EvidenceSource,
    EvidenceType,
    Message,
    ModelInvocation,
    Role,
    SourceKind,
    Task,
    TaskStatus,
)

if TYPE_CHECKING:
    from ce.core.integration import PatchLedger, Plugin

__all__ = ["Kickoff", "Seams"]

_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("ce_crewai_inside", default=False)


@dataclass(frozen=True)
class Kickoff:
    """One ``kickoff`` of a crew: its id (task ids are scoped by it), its session and each
    task's dependencies (its ``context`` tasks; a task without a ``context`` of its own gets
    every earlier task's output, so it depends on them)."""

    kickoff_id: str
    session_id: str
    depends: dict[str, list[str]] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None  # an ``akickoff``'s loop

    def task_id(self, task_id: str) -> str:
        return f"{self.kickoff_id}:{task_id}"


def _task_record(kickoff: Kickoff, task: Any, status: TaskStatus, **extra: Any) -> Task:
    depends = kickoff.depends.get(str(task.id), [])
    name = getattr(task, "name", None) or str(getattr(task, "description", ""))[:80]
    return Task(
        task_id=kickoff.task_id(str(task.id)),
        name=name,
        status=status,
        depends_on=depends,
        **extra,
    )


def _schemas(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    schemas = [t for t in tools if isinstance(t, Mapping) and "function" in t]
    return [dict(t) for t in schemas] or None


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class Seams:
    """What the wrappers and handlers of one install do."""

    def __init__(self, plugin: Plugin, inject: bool) -> None:
        self.plugin = plugin
        self.inject = inject
        self._lock = threading.Lock()
        self._tasks: dict[str, Kickoff] = {}  # CrewAI task id -> its current kickoff
        self._started: dict[str, float] = {}  # LLM call id -> start time
        # (CrewAI task id, tool name) -> the ids of the native tool calls the model asked for
        self._call_ids: dict[tuple[str, str], deque[str]] = {}

    # -- kickoff ---------------------------------------------------------------------------

    def begin(
        self, crew: Any, loop: asyncio.AbstractEventLoop | None = None
    ) -> tuple[Kickoff, list[Task], dict[int, bool]]:
        """A new kickoff of ``crew``: its scope, its pending tasks (with dependencies) and
        each agent's ``respect_context_window`` turned off while the engine keeps the
        budget (given back by :meth:`end`)."""
        kickoff_id = uuid.uuid4().hex
        scope = resolve_scope(self.plugin, run_id=kickoff_id)
        tasks = list(getattr(crew, "tasks", None) or [])
        kickoff = Kickoff(kickoff_id, scope.session_id, loop=loop)
        for index, task in enumerate(tasks):
            context = getattr(task, "context", None)
            sources = context if isinstance(context, list) else tasks[:index]
            kickoff.depends[str(task.id)] = [kickoff.task_id(str(t.id)) for t in sources]
        with self._lock:
            for task in tasks:
                self._tasks[str(task.id)] = kickoff
        saved: dict[int, bool] = {}
        if self.inject:
            for agent in getattr(crew, "agents", None) or []:
                saved[id(agent)] = bool(agent.respect_context_window)
                agent.respect_context_window = False
        return kickoff, [_task_record(kickoff, t, TaskStatus.PENDING) for t in tasks], saved

    @staticmethod
    def end(crew: Any, saved: dict[int, bool]) -> None:
        for agent in getattr(crew, "agents", None) or []:
            if id(agent) in saved:
                agent.respect_context_window = saved[id(agent)]

    def kickoff_sync(self, original: Callable[..., Any]) -> Callable[..., Any]:
        seams = self

        def kickoff(crew: Any, *args: Any, **kwargs: Any) -> Any:
            if not seams.plugin.installed:
                return original(crew, *args, **kwargs)
            kickoff, tasks, saved = seams.begin(crew)
            engine = seams.plugin.engine
            guarded_sync(
                seams.plugin,
                lambda: engine.sync.upsert_tasks(kickoff.session_id, tasks),
                session_id=kickoff.session_id,
                what="upsert_tasks",
            )
            try:
                return original(crew, *args, **kwargs)
            finally:
                seams.end(crew, saved)

        return kickoff

    def kickoff_async(self, original: Callable[..., Any]) -> Callable[..., Any]:
        seams = self

        async def akickoff(crew: Any, *args: Any, **kwargs: Any) -> Any:
            if not seams.plugin.installed:
                return await original(crew, *args, **kwargs)
            kickoff, tasks, saved = seams.begin(crew, asyncio.get_running_loop())
            engine = seams.plugin.engine
            await guarded(
                seams.plugin,
                lambda: engine.upsert_tasks(kickoff.session_id, tasks),
                session_id=kickoff.session_id,
                what="upsert_tasks",
            )
            try:
                return await original(crew, *args, **kwargs)
            finally:
                seams.end(crew, saved)

        return akickoff

    def kickoff_of(self, task_id: Any) -> Kickoff | None:
        if task_id is None:
            return None
        with self._lock:
            return self._tasks.get(str(getattr(task_id, "id", task_id)))

    # -- LLM requests ----------------------------------------------------------------------

    def _pending(self, messages: Any) -> list[dict[str, Any]]:
        if isinstance(messages, str):
            return [{"role": "user", "content": messages}]
        return [dict(m) for m in messages]

    def call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        seams = self

        def call(llm: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
            kickoff = seams.kickoff_of(kwargs.get("from_task"))
            if kickoff is None or _inside.get() or not seams.plugin.installed:
                return original(llm, messages, *args, **kwargs)
            sent = seams.prepare_from_thread(
                kickoff,
                seams._pending(messages),
                _schemas(kwargs.get("tools", args[0] if args else None)),
            )
            token = _inside.set(True)
            try:
                chosen = messages if sent is None or not seams.inject else sent
                reply = original(llm, chosen, *args, **kwargs)
                seams.note_tool_calls(kwargs.get("from_task"), reply)
                return reply
            finally:
                _inside.reset(token)

        return call

    def prepare_from_thread(
        self,
        kickoff: Kickoff,
        messages: list[dict[str, Any]],
        schemas: list[dict[str, Any]] | None,
    ) -> list[dict[str, Any]] | None:
        """A sync LLM call's engine input. In an ``akickoff`` CrewAI runs agent steps (and
        their sync ``llm.call``) on worker threads: the engine is then awaited on the
        kickoff's own loop while only this worker thread waits."""
        loop = kickoff.loop
        if loop is not None and loop.is_running() and not _on_loop(loop):
            work = prepare_openai(self.plugin, kickoff.session_id, messages, schemas)
            return asyncio.run_coroutine_threadsafe(work, loop).result()
        return prepare_openai_sync(self.plugin, kickoff.session_id, messages, schemas)

    def acall(self, original: Callable[..., Any]) -> Callable[..., Any]:
        seams = self

        async def acall(llm: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
            kickoff = seams.kickoff_of(kwargs.get("from_task"))
            if kickoff is None or _inside.get() or not seams.plugin.installed:
                return await original(llm, messages, *args, **kwargs)
            sent = await prepare_openai(
                seams.plugin,
                kickoff.session_id,
                seams._pending(messages),
                _schemas(kwargs.get("tools", args[0] if args else None)),
            )
            token = _inside.set(True)
            try:
                chosen = messages if sent is None or not seams.inject else sent
                reply = await original(llm, chosen, *args, **kwargs)
                seams.note_tool_calls(kwargs.get("from_task"), reply)
                return reply
            finally:
                _inside.reset(token)

        return acall

    def note_tool_calls(self, task: Any, reply: Any) -> None:
        """A native reply asking for tools: keep each call's id for the tool run it starts
        (CrewAI's tool events carry none)."""
        if not isinstance(reply, list):
            return
        for call in reply:
            function = getattr(call, "function", None)
            if isinstance(call, Mapping):
                call_id, function = call.get("id"), call.get("function")
            else:
                call_id = getattr(call, "id", None)
            name = (
                function.get("name")
                if isinstance(function, Mapping)
                else getattr(function, "name", None)
            )
            if isinstance(call_id, str) and isinstance(name, str):
                key = (str(task.id), name)
                with self._lock:
                    self._call_ids.setdefault(key, deque()).append(call_id)

    def _tool_call_id(self, event: Any) -> str:
        with self._lock:
            ids = self._call_ids.get((str(event.task_id), event.tool_name))
            if ids:
                return ids.popleft()
        return str(event.started_event_id or event.event_id)

    def wrap_llm_class(self, ledger: PatchLedger, cls: type) -> None:
        """Wrap ``call`` / ``acall`` where ``cls`` defines them itself."""
        if "call" in vars(cls):
            ledger.wrap(cls, "call", self.call)
        if "acall" in vars(cls):
            ledger.wrap(cls, "acall", self.acall)

    # -- event-bus handlers ----------------------------------------------------------------

    def _record(self, kickoff: Kickoff, what: str, work: Callable[[Recorder], Any]) -> None:
        """Queue ``work`` on the session (written before its next engine call, in order,
        fail-open): an event handler runs on CrewAI's thread pool, beside a sync kickoff's
        thread or an async kickoff's loop, and never waits for the engine."""
        plugin = self.plugin
        if not plugin.installed:
            return
        recorder = Recorder(plugin.engine, kickoff.session_id)

        async def deferred() -> None:
            await guarded(plugin, lambda: work(recorder), session_id=kickoff.session_id, what=what)

        plugin.engine.defer(kickoff.session_id, deferred)

    def on_task_started(self, source: Any, event: Any) -> None:
        task = getattr(event, "task", None) or source
        kickoff = self.kickoff_of(getattr(task, "id", None))
        if kickoff is None:
            return
        record = _task_record(kickoff, task, TaskStatus.IN_PROGRESS)

        async def work(recorder: Recorder) -> None:
            await recorder.engine.upsert_tasks(recorder.session_id, [record])

        self._record(kickoff, "record task", work)

    def on_task_completed(self, source: Any, event: Any) -> None:
        task = getattr(event, "task", None) or source
        kickoff = self.kickoff_of(getattr(task, "id", None))
        if kickoff is None:
            return
        output = event.output
        text = str(getattr(output, "raw", "") or "")
        agent = str(getattr(output, "agent", "") or "")

        async def work(recorder: Recorder) -> None:
            ids: list[str] = []
            if text:
                evidence = await recorder.engine.ingest_evidence(
                    recorder.session_id,
                    text,
                    EvidenceSource(kind=SourceKind.LLM, name=agent),
                    EvidenceType.LLM_OUTPUT,
                    metadata={"task_id": kickoff.task_id(str(task.id))},
                )
                ids.append(evidence.evidence_id)
            record = _task_record(kickoff, task, TaskStatus.COMPLETED, result_evidence_ids=ids)
            await recorder.engine.upsert_tasks(recorder.session_id, [record])

        self._record(kickoff, "record task", work)

    def on_task_failed(self, source: Any, event: Any) -> None:
        task = getattr(event, "task", None) or source
        kickoff = self.kickoff_of(getattr(task, "id", None))
        if kickoff is None:
            return
        record = _task_record(kickoff, task, TaskStatus.FAILED, error=str(event.error))

        async def work(recorder: Recorder) -> None:
            await recorder.engine.upsert_tasks(recorder.session_id, [record])

        self._record(kickoff, "record task", work)

    def on_llm_started(self, source: Any, event: Any) -> None:
        with self._lock:
            self._started[event.call_id] = event.timestamp.timestamp()

    def on_llm_completed(self, source: Any, event: Any) -> None:
        with self._lock:
            started = self._started.pop(event.call_id, None)
        kickoff = self.kickoff_of(event.task_id)
        if kickoff is None:
            return
        usage = event.usage or {}
        ended = event.timestamp.timestamp()
        response = event.response
        call = ModelCall(
            call_id=event.call_id,
            provider=provider_of(source),
            model=str(event.model or ""),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            latency_ms=int((ended - started) * 1000) if started is not None else 0,
            output_text=response if isinstance(response, str) else "",
        )
        task_id = kickoff.task_id(str(event.task_id))
        # a final text answer is the agent's message (its executor ends with it: no later
        # request carries it); a tool request or a ReAct step comes back in the next request
        reply = None
        if isinstance(response, str) and response.strip() and not is_react_step(response):
            role = str(getattr(event, "agent_role", "") or "")
            reply = Message(
                role=Role.ASSISTANT,
                content=response,
                author=Author(kind=AuthorKind.AGENT, id=role) if role else None,
                invocation=ModelInvocation(provider=call.provider, model=call.model or "unknown"),
            )

        async def work(recorder: Recorder) -> None:
            usage_record = model_usage_from_call(call).model_copy(update={"task_id": task_id})
            await recorder.engine.record_model_call(recorder.session_id, usage_record, reply=reply)

        self._record(kickoff, "record model call", work)

    def on_tool_finished(self, source: Any, event: Any) -> None:
        kickoff = self.kickoff_of(event.task_id)
        if kickoff is None:
            return
        failure = getattr(event, "failure", None)
        run = ToolRun(
            tool_call_id=self._tool_call_id(event),
            name=event.tool_name,
            args=event.tool_args,
            result=None if failure is not None else str(event.output),
            error=str(failure) if failure is not None else None,
            started_at=event.started_at.timestamp(),
            ended_at=event.finished_at.timestamp(),
        )
        task_id = kickoff.task_id(str(event.task_id))

        async def work(recorder: Recorder) -> None:
            draft = tool_result_evidence(run)
            evidence = await recorder.engine.ingest_evidence(
                recorder.session_id,
                draft.content,
                draft.source,
                draft.evidence_type,
                links=draft.links,
                metadata=draft.metadata,
            )
            record = tool_call_from_run(run, [evidence.evidence_id])
            await recorder.engine.record_tool_call(
                recorder.session_id, record.model_copy(update={"task_id": task_id})
            )

        self._record(kickoff, "record tool run", work)
