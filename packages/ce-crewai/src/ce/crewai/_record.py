"""CrewAI's event bus -> engine: tasks (status, dependencies, result evidence), model calls
(usage with their task, an agent's final answer as its message) and tool runs, finished or
raised (id, status, error, duration, task).

The bus runs sync handlers on its thread pool, in a copy of the emitting context: a handler
finds its run there (else by the task's id) and queues its writes on the session
(:meth:`ContextEngine.defer`), in order and fail-open, never waiting for the engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ce.core.integration import (
    ModelCall,
    Recorder,
    RetrievalHit,
    ToolRun,
    error_text,
    guarded,
    is_suppressed,
    model_usage_from_call,
    provider_of,
)
from ce.core.pipeline import is_react_step
from ce.core.schema import (
    EvidenceSource,
    EvidenceType,
    Message,
    ModelInvocation,
    Role,
    SourceKind,
    TaskStatus,
)
from ce.crewai._convert import agent_author, caller, task_record
from ce.crewai._scopes import Run, Runs, Target, current_call, current_run

if TYPE_CHECKING:
    from ce.core.integration import Plugin

__all__ = ["Recorders", "knowledge_hits", "memory_hits"]


def _small(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and len(str(value)) <= 256


def knowledge_hits(collection: str, results: Any) -> list[RetrievalHit]:
    """CrewAI knowledge search results (``SearchResult`` dicts: id, content, metadata,
    score) as retrieval hits; the uri is the document's ``source`` / ``uri`` metadata, else
    ``crewai-knowledge:<collection>/<id>`` (``crewai-knowledge:<id>`` without a collection)."""
    hits: list[RetrievalHit] = []
    for result in results or []:
        if not isinstance(result, Mapping) or not result.get("content"):
            continue
        metadata = result.get("metadata") or {}
        doc_id = str(result.get("id") or "") or None
        uri = metadata.get("source") or metadata.get("uri")
        if not isinstance(uri, str) or not uri:
            uri = f"crewai-knowledge:{collection + '/' if collection else ''}{doc_id or ''}"
        score = result.get("score")
        hits.append(
            RetrievalHit(
                content=str(result["content"]),
                uri=uri,
                score=float(score) if isinstance(score, (int, float)) else None,
                doc_id=doc_id,
                metadata={"collection": collection} if collection and _small(collection) else {},
            )
        )
    return hits


def memory_hits(matches: Any) -> list[RetrievalHit]:
    """CrewAI memory recall results (``MemoryMatch``: a record and its relevance score) as
    retrieval hits; the uri is ``crewai-memory:<scope>/<record id>``."""
    hits: list[RetrievalHit] = []
    for match in matches or []:
        record = getattr(match, "record", None)
        content = getattr(record, "content", None)
        if not isinstance(content, str) or not content:
            continue
        scope = str(getattr(record, "scope", "") or "/").rstrip("/")
        record_id = str(getattr(record, "id", "") or "")
        score = getattr(match, "score", None)
        hits.append(
            RetrievalHit(
                content=content,
                uri=f"crewai-memory:{scope}/{record_id}",
                score=float(score) if isinstance(score, (int, float)) else None,
                doc_id=record_id or None,
                metadata={"memory_scope": scope or "/"} if _small(scope or "/") else {},
            )
        )
    return hits


class Recorders:
    """The event-bus handlers of one install."""

    def __init__(self, plugin: Plugin, runs: Runs) -> None:
        self.plugin = plugin
        self.runs = runs
        self._lock = threading.Lock()
        self._started: dict[str, float] = {}  # LLM call id -> start time
        self._tools_started: dict[str, float] = {}  # tool started event id -> start time
        # handlers run on a thread pool: an end may be handled before its start
        self._tools_ended: set[str] = set()  # started event ids whose run ended first
        self._errors_early: dict[str, tuple[Any, Any]] = {}  # the same, for a raised tool

    def handlers(self) -> list[tuple[str, Callable[[Any, Any], None]]]:
        """``(event class name in crewai.events, handler)`` pairs."""
        return [
            ("TaskStartedEvent", self.on_task_started),
            ("TaskCompletedEvent", self.on_task_completed),
            ("TaskFailedEvent", self.on_task_failed),
            ("LLMCallStartedEvent", self.on_llm_started),
            ("LLMCallCompletedEvent", self.on_llm_completed),
            ("ToolUsageStartedEvent", self.on_tool_started),
            ("ToolUsageFinishedEvent", self.on_tool_finished),
            ("ToolUsageErrorEvent", self.on_tool_error),
        ]

    def _queue(self, session_id: str, what: str, work: Callable[[Recorder], Any]) -> None:
        """Queue ``work`` on the session (written before its next engine call, in order,
        fail-open)."""
        plugin = self.plugin
        if not plugin.installed or is_suppressed():
            return
        recorder = Recorder(plugin.engine, session_id)

        async def deferred() -> None:
            await guarded(plugin, lambda: work(recorder), session_id=session_id, what=what)

        plugin.engine.defer(session_id, deferred)

    def _crew_task(self, source: Any, event: Any) -> tuple[Run, Any] | None:
        task = getattr(event, "task", None) or source
        run = self.runs.run_of(task)
        if run is None or str(getattr(task, "id", "")) not in run.tasks:
            return None
        return run, task

    # -- tasks -----------------------------------------------------------------------------

    def on_task_started(self, source: Any, event: Any) -> None:
        """A task in progress; not once its kickoff ended raising (this handler ran late: the
        kickoff closed the task already)."""
        found = self._crew_task(source, event)
        if found is None:
            return
        run, task = found
        record = task_record(run, task, TaskStatus.IN_PROGRESS)

        async def work(recorder: Recorder) -> None:
            await recorder.engine.upsert_tasks(recorder.session_id, [record])

        reports = run.reports
        with reports.lock:
            if reports.ended:
                return
            reports.started.add(str(task.id))
            self._queue(run.session_id, "record task", work)

    def _task_ended(self, run: Run, task: Any, work: Callable[[Recorder], Any]) -> None:
        """Queue the record of a task CrewAI reports ended: after whatever its kickoff
        queued for it when it ended first, which the report corrects."""
        reports = run.reports
        with reports.lock:
            reports.finished.add(str(task.id))
            self._queue(run.session_id, "record task", work)

    def on_task_completed(self, source: Any, event: Any) -> None:
        found = self._crew_task(source, event)
        if found is None:
            return
        run, task = found
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
                    metadata={"task_id": run.task_id(str(task.id))},
                )
                ids.append(evidence.evidence_id)
            record = task_record(run, task, TaskStatus.COMPLETED, result_evidence_ids=ids)
            await recorder.engine.upsert_tasks(recorder.session_id, [record])

        self._task_ended(run, task, work)

    def on_task_failed(self, source: Any, event: Any) -> None:
        found = self._crew_task(source, event)
        if found is None:
            return
        run, task = found
        record = task_record(run, task, TaskStatus.FAILED, error=str(event.error))

        async def work(recorder: Recorder) -> None:
            await recorder.engine.upsert_tasks(recorder.session_id, [record])

        self._task_ended(run, task, work)

    # -- model calls -----------------------------------------------------------------------

    def on_llm_started(self, source: Any, event: Any) -> None:
        with self._lock:
            self._started[event.call_id] = event.timestamp.timestamp()

    def _call_target(self, event: Any) -> Target | None:
        target = current_call.get()
        if target is not None:
            return target
        run = self.runs.run_of(event.task_id)
        if run is None:
            return None
        return self.runs.target(run, event.task_id, getattr(event, "agent_role", None))

    def on_llm_completed(self, source: Any, event: Any) -> None:
        with self._lock:
            started = self._started.pop(event.call_id, None)
        target = self._call_target(event)
        if target is None:
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
        # a final text answer is the agent's message (its executor ends with it: no later
        # request carries it); a tool request or a ReAct step comes back in the next request
        reply = None
        if isinstance(response, str) and response.strip() and not is_react_step(response):
            name = caller(target.role or str(getattr(event, "agent_role", "") or ""))
            reply = Message(
                role=Role.ASSISTANT,
                content=response,
                author=agent_author(name),
                invocation=ModelInvocation(provider=call.provider, model=call.model or "unknown"),
            )
        task_id = target.task_id

        async def work(recorder: Recorder) -> None:
            usage_record = model_usage_from_call(call).model_copy(update={"task_id": task_id})
            await recorder.engine.record_model_call(recorder.session_id, usage_record, reply=reply)

        self._queue(target.session_id, "record model call", work)

    # -- tool runs -------------------------------------------------------------------------

    def on_tool_started(self, source: Any, event: Any) -> None:
        with self._lock:
            if event.event_id in self._tools_ended:
                self._tools_ended.discard(event.event_id)
                return
            early = self._errors_early.pop(event.event_id, None)
            if early is None:
                self._tools_started[event.event_id] = event.timestamp.timestamp()
                return
        self._record_error(*early, started=event.timestamp.timestamp())

    def on_tool_finished(self, source: Any, event: Any) -> None:
        key = event.started_event_id or ""
        with self._lock:  # the event has the run's times: its start is not needed
            if self._tools_started.pop(key, None) is None and key:
                self._tools_ended.add(key)
        failure = getattr(event, "failure", None)
        self._record_tool(
            event,
            result=None if failure is not None else str(event.output),
            error=str(failure) if failure is not None else None,
            started_at=event.started_at.timestamp(),
            ended_at=event.finished_at.timestamp(),
        )

    def on_tool_error(self, source: Any, event: Any) -> None:
        """A tool that raised: CrewAI reports it with this event instead of a finished one
        (the model gets the error text as the tool's result)."""
        key = event.started_event_id or ""
        with self._lock:
            started = self._tools_started.pop(key, None)
            if started is None and key:  # recorded when its start is handled (its duration)
                self._errors_early[key] = (source, event)
                return
        self._record_error(source, event, started=started)

    def _record_error(self, source: Any, event: Any, *, started: float | None) -> None:
        ended = event.timestamp.timestamp()
        error = event.error
        self._record_tool(
            event,
            result=None,
            error=error_text(error) if isinstance(error, BaseException) else str(error),
            started_at=ended if started is None else started,
            ended_at=ended,
        )

    def _record_tool(
        self,
        event: Any,
        *,
        result: str | None,
        error: str | None,
        started_at: float,
        ended_at: float,
    ) -> None:
        """Record the tool run ``event`` ends, under the id of the model's tool call it ran
        (matched by tool and arguments), else of CrewAI's event (the text format)."""
        run = self.runs.run_of(event.task_id)
        if run is None:
            return
        target = self.runs.target(run, event.task_id, getattr(event, "agent_role", None))
        call_id = self.runs.take_call_id(target, event.tool_name, event.tool_args)
        run_record = ToolRun(
            tool_call_id=call_id or str(event.started_event_id or event.event_id),
            name=event.tool_name,
            args=event.tool_args,
            result=result,
            error=error,
            started_at=started_at,
            ended_at=ended_at,
        )
        task_id = target.task_id

        async def work(recorder: Recorder) -> None:
            await recorder.record_tool_run(run_record, task_id)

        self._queue(target.session_id, "record tool run", work)

    # -- knowledge and memory retrieval ---------------------------------------------------

    def record_hits(self, hits: list[RetrievalHit]) -> None:
        """One ``rag_doc`` evidence per hit of a retrieval made inside a run."""
        run = current_run.get()
        if run is None or not hits:
            return

        async def work(recorder: Recorder) -> None:
            await recorder.record_retrieval(hits)

        self._queue(run.session_id, "record knowledge retrieval", work)

    def knowledge_query(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorders = self

        def query(knowledge: Any, *args: Any, **kwargs: Any) -> Any:
            results = original(knowledge, *args, **kwargs)
            recorders.record_hits(knowledge_hits(_collection(knowledge), results))
            return results

        return query

    def knowledge_aquery(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorders = self

        async def aquery(knowledge: Any, *args: Any, **kwargs: Any) -> Any:
            results = await original(knowledge, *args, **kwargs)
            recorders.record_hits(knowledge_hits(_collection(knowledge), results))
            return results

        return aquery

    def memory_recall(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorders = self

        def recall(memory: Any, *args: Any, **kwargs: Any) -> Any:
            matches = original(memory, *args, **kwargs)
            recorders.record_hits(memory_hits(matches))
            return matches

        return recall

    def memory_arecall(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorders = self

        async def arecall(memory: Any, *args: Any, **kwargs: Any) -> Any:
            matches = await original(memory, *args, **kwargs)
            recorders.record_hits(memory_hits(matches))
            return matches

        return arecall


def _collection(knowledge: Any) -> str:
    storage = getattr(knowledge, "storage", None)
    name = getattr(knowledge, "collection_name", None) or getattr(storage, "collection_name", None)
    return str(name or "")
