"""Haystack runs -> the engine: what the plugin's tracer sees, and the Agent's ``after_tool``
hook.

- ``haystack.pipeline.run`` binds the run's frame (its scope: see ``_scopes``);
  ``haystack.component.run`` of a retriever (a component taking a ``query``, a
  ``query_embedding`` or ``queries``) keeps its documents on the run's frame, and one of a
  component that takes the run's documents in and gives documents out (a ranker, a filter, a
  joiner) passes on only what it gives out (:meth:`RunFrame.pass_documents`): the documents it
  dropped never reach the model, so they are not the session's evidence. The run's documents
  are recorded as ``rag_doc`` evidence (source, score, id and metadata) before each model
  call of the run (so a prompt that inlines them sends them once, see ``_inject``) and, those
  no call recorded, when the run ends. A prompt builder's (a component taking a ``template``)
  conversations rendered as text are noted on the frame too (see ``_rendered``).
- ``haystack.agent.step`` / ``.step.llm`` / ``.step.tool`` note the tool calls the model asked
  for and time each tool run; a run started inside a tool (a sub-agent, a pipeline behind a
  ``ComponentTool``) is nested in it. A tool's ``documents`` are ``rag_doc`` evidence linked
  to its call.
- Tool spans carry no call id, so the tool runs themselves are recorded by the Agent's
  ``after_tool`` hook, from the ``ToolCallResult`` of each tool message of the step (the call
  id ``origin.id``, name, arguments, result, ``error``), with the duration the tracer measured.

Every write is fail-open: a failure is logged and reported as a ``Degraded`` event, never
raised into the app's run (raised with ``fail_closed=True``). On an async path (``run_async``)
it is awaited on the caller's loop, or queued on it (:func:`ce.core.integration.record_sync`)
from the sync code Haystack runs there; on a blocking path (the app called ``run``) it is
written inline (:func:`write`), also on an event loop's thread: the app's call blocks that
thread anyway, and a write queued on a loop the app is blocking would hold the session while
the next model call of the same run waits for it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ce.core.integration import (
    SESSION_KEY,
    Recorder,
    ToolRun,
    ToolScopeIds,
    is_suppressed,
    record_awaited,
    record_sync,
)
from ce.haystack._convert import documents_in, gives_documents, hits_from_documents
from ce.haystack._rendered import rendered_conversations
from ce.haystack._scopes import (
    RunFrame,
    StepFrame,
    ToolFrame,
    bound,
    component_name,
    in_component_work,
    in_hook,
    open_run,
    run_frame,
    step_frame,
    tool_frame,
)

if TYPE_CHECKING:
    from ce.core.integration import Plugin, RetrievalHit

__all__ = ["HOOK_TYPE", "SpanObserver", "ToolRunHook", "blocking", "tool_runs", "write"]

logger = logging.getLogger("ce.haystack")

_QUERY_INPUTS = ("query", "query_embedding", "queries")
HOOK_TYPE = "ce.haystack._record.ToolRunHook"
"""The ``type`` the plugin's hook serialises as (``Agent.to_dict`` leaves it out)."""

targeted: ContextVar[bool] = ContextVar("ce_haystack_targeted", default=False)
"""Set inside a run of the pipeline or Agent given to ``install(target=...)``."""
blocking: ContextVar[bool] = ContextVar("ce_haystack_blocking", default=False)
"""Set inside a run the app started through a blocking API (``Pipeline.run``,
``Agent.run``)."""


def write(
    plugin: Plugin,
    session_id: str,
    what: str,
    work: Callable[[Recorder], Any],
    inline: bool | None = None,
) -> None:
    """Record with ``work`` from sync code: inline on a blocking path (``inline``, default:
    the current run's), else queued (:func:`ce.core.integration.record_sync`)."""
    record_sync(
        plugin, session_id, what, work, blocking=blocking.get() if inline is None else inline
    )


class SpanObserver:
    """What the plugin's tracer does around each span (see the module docstring)."""

    def __init__(self, plugin: Plugin, active: Callable[[], bool]) -> None:
        self.plugin = plugin
        self.active = active
        self.tool_scope_ids = ToolScopeIds(plugin)  # the child scopes of tool runs, per session

    @contextlib.contextmanager
    def __call__(self, span: Any) -> Iterator[None]:
        if not self.active():
            yield
            return
        with contextlib.ExitStack() as stack:
            try:
                self._enter(span, stack)
            except Exception:
                logger.warning(
                    "ce-haystack: reading span %s failed", span.operation_name, exc_info=True
                )
            yield
            try:
                self._exit(span)
            except Exception:
                logger.warning(
                    "ce-haystack: reading span %s failed", span.operation_name, exc_info=True
                )

    def _enter(self, span: Any, stack: contextlib.ExitStack) -> None:
        name, tags = span.operation_name, span.tags
        if name == "haystack.pipeline.run":
            metadata = tags.get("haystack.pipeline.metadata")
            explicit = metadata.get(SESSION_KEY) if isinstance(metadata, Mapping) else None
            outer = run_frame.get()
            frame = open_run(self.plugin, explicit)
            stack.enter_context(bound(run_frame, frame))
            sync = tags.get("haystack.pipeline.execution_mode") == "sync"
            stack.enter_context(bound(blocking, sync))
            if frame is not outer:  # a run of its own (not a pipeline inside the run)
                stack.callback(self._record_left, frame)
        elif name == "haystack.component.run":
            stack.enter_context(bound(component_name, tags.get("haystack.component.name")))
        elif name == "haystack.chat_generator.run":  # a component calls its own generator
            stack.enter_context(bound(in_component_work, component_name.get() or "component"))
        elif name == "haystack.agent.step":
            stack.enter_context(bound(step_frame, StepFrame()))
        elif name == "haystack.agent.hook":
            stack.enter_context(bound(in_hook, str(tags.get("haystack.agent.hook.name") or "hook")))
        elif name == "haystack.agent.step.tool":
            run = run_frame.get()
            if run is not None:
                step = step_frame.get()
                tool = ToolFrame(
                    run.scope,
                    str(tags.get("haystack.tool.name") or ""),
                    tags,
                    step,
                    self.tool_scope_ids,
                )
                if step is not None:
                    with step.lock:
                        step.tools.append(tool)
                span.ce_tool = tool
                stack.enter_context(bound(tool_frame, tool))

    def _exit(self, span: Any) -> None:
        name, tags = span.operation_name, span.tags
        if name == "haystack.agent.step.llm":
            step = step_frame.get()
            output = tags.get("haystack.agent.step.llm.output")
            if step is not None and isinstance(output, Mapping):
                step.calls = [c for r in output.get("replies") or () for c in r.tool_calls]
        elif name == "haystack.agent.step.tool":
            tool = getattr(span, "ce_tool", None)
            if tool is None:
                return
            tool.ended = time.time()
            output = tags.get("haystack.agent.step.tool.output")
            if isinstance(output, Mapping) and output.get("documents"):
                hits = hits_from_documents(output["documents"])
                call_id = tool.call_id
                if hits:
                    write(
                        self.plugin,
                        tool.scope.session_id,
                        "record retrieval",
                        lambda r: r.record_retrieval(hits, call_id),
                    )
        elif name == "haystack.component.run":
            run = run_frame.get()
            if run is not None:
                _component_ended(run, tags)

    def _record_left(self, run: RunFrame) -> None:
        """At the end of a run, record the documents it passed on that no model call of the
        run recorded (a pipeline that retrieves beside an Agent, or only retrieves)."""
        try:
            hits = run.unrecorded()
            if hits:
                write(
                    self.plugin,
                    run.scope.session_id,
                    "record retrieval",
                    lambda r: r.record_retrieval(hits),
                )
        except Exception:
            logger.warning("ce-haystack: recording the run's documents failed", exc_info=True)


def _component_ended(run: RunFrame, tags: Mapping[str, Any]) -> None:
    """What a pipeline component's span tells the run: the documents it passes on (see
    :meth:`RunFrame.pass_documents`) and, for a prompt builder (a component taking a
    ``template``), the conversations it rendered (see ``_rendered``)."""
    spec = tags.get("haystack.component.input_spec")
    inputs = tags.get("haystack.component.input")
    output = tags.get("haystack.component.output")
    if not isinstance(spec, Mapping) or not isinstance(output, Mapping):
        return
    if "template" in spec and isinstance(inputs, Mapping):
        run.rendered.extend(rendered_conversations(inputs))
    taken: list[RetrievalHit] = []
    if isinstance(inputs, Mapping) and gives_documents(
        tags.get("haystack.component.output_spec"), output
    ):
        taken = hits_from_documents(documents_in(inputs.values()))
    given = hits_from_documents(documents_in(output.values()))
    run.pass_documents(taken, given, any(k in spec for k in _QUERY_INPUTS))


def _result_text(result: Any) -> str:
    """A tool's result as text: a string, or the text parts of a list joined (its pictures
    and files go with the tool message, whose parts the engine stores)."""
    from haystack.dataclasses import FileContent, ImageContent

    if isinstance(result, str):
        return result
    if isinstance(result, list):
        return "\n".join(
            str(getattr(part, "text", part))
            for part in result
            if not isinstance(part, (ImageContent, FileContent))
        )
    return str(result)


def tool_runs(state: Any) -> list[ToolRun]:
    """The tool runs of the Agent step that just ended: one per tool message after the
    step's assistant message, with the tracer's timing where it saw the run."""
    messages = list(state.data.get("messages") or ())
    results = []
    for message in reversed(messages):
        result = message.tool_call_result
        if result is None:
            break
        results.append(result)
    step = step_frame.get()
    timing = {t.claimed: t for t in (step.tools if step is not None else ()) if t.claimed}
    now = time.time()
    runs = []
    for result in reversed(results):
        origin = result.origin
        call_id = str(origin.id) if origin.id is not None else f"{origin.tool_name}:{id(result)}"
        text = _result_text(result.result)
        seen = timing.get(call_id)
        started = seen.started if seen is not None else now
        ended = seen.ended if seen is not None and seen.ended is not None else now
        runs.append(
            ToolRun(
                tool_call_id=call_id,
                name=origin.tool_name,
                args=dict(origin.arguments or {}),
                result=None if result.error else text,
                error=text if result.error else None,
                started_at=started,
                ended_at=ended,
                provider_name="haystack",
            )
        )
    return runs


class ToolRunHook:
    """The Agent ``after_tool`` hook recording the step's tool runs (see the module
    docstring). It changes nothing in the Agent's ``State``."""

    def __init__(self, plugin: Plugin, active: Callable[[], bool]) -> None:
        self.plugin = plugin
        self.active = active

    def _work(self, state: Any) -> tuple[str, Callable[[Recorder], Any]] | None:
        if not self.active() or is_suppressed():
            return None
        run = run_frame.get()
        if run is None:
            return None
        runs = tool_runs(state)
        if not runs:
            return None

        async def work(recorder: Recorder) -> None:
            for tool_run in runs:
                await recorder.record_tool_run(tool_run)

        return run.scope.session_id, work

    def run(self, state: Any) -> None:
        try:
            found = self._work(state)
        except Exception:
            logger.warning("ce-haystack: reading the tool results failed", exc_info=True)
            return
        if found is not None:  # the sync hook runs in a blocking Agent.run
            write(self.plugin, found[0], "record tool runs", found[1], inline=True)

    async def run_async(self, state: Any) -> None:
        try:
            found = self._work(state)
        except Exception:
            logger.warning("ce-haystack: reading the tool results failed", exc_info=True)
            return
        if found is not None:
            await record_awaited(self.plugin, found[0], "record tool runs", found[1])

    def to_dict(self) -> dict[str, Any]:
        """What ``Agent.to_dict`` would write (the plugin's ``to_dict`` wrapper leaves it
        out)."""
        return {"type": HOOK_TYPE, "init_parameters": {}}
