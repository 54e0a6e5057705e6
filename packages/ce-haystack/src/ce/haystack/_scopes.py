"""Which session a Haystack model call, tool run or retrieval belongs to: the kit's rule
(:func:`ce.core.integration.resolve_scope`) applied to Haystack's runs.

A run is one top-level ``Pipeline.run`` / ``run_async``, one ``Agent.run`` / ``run_async``
(outside a pipeline), or one chat generator called on its own. First match wins for it: the
``ce_session_id`` it names explicitly (``Pipeline(metadata={"ce_session_id": ...})``, an
Agent's ``hook_context={"ce_session_id": ...}``), ``with engine.session(...)``,
``install(session_id=...)``, else the run itself (``run:<id>``). Haystack has no conversation
identity of its own. Every component of a pipeline run (an Agent in it included) shares the
run's scope.

A run started while a tool runs (an Agent or a pipeline behind a ``ComponentTool``, an
LLM-backed tool) is nested: it gets the child scope ``<outer session>/<tool call id>``
(``<id>~2``, ... for a call id an earlier run of the session used) and never receives or
changes the outer conversation.

Haystack passes no run object along, so the frames live in context variables, bound by the
plugin's tracer around pipeline runs, agent steps and tool runs and by the Agent wrapper
around agent runs. Tools run in a thread pool with a copy of the context, so they see the
frames of the step that called them.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ce.core.integration import Scope, ToolScopeIds, resolve_scope

if TYPE_CHECKING:
    from ce.core.integration import Plugin, RetrievalHit
    from ce.haystack._rendered import Rendered

__all__ = [
    "HitKey",
    "RunFrame",
    "StepFrame",
    "ToolFrame",
    "bound",
    "component_name",
    "hit_key",
    "hook_run",
    "in_call",
    "in_component_work",
    "in_hook",
    "open_run",
    "run_frame",
    "step_frame",
    "tool_frame",
]


HitKey = tuple[str, str]
"""A retrieved document as the run tells it from another: its source and content."""


def hit_key(hit: RetrievalHit) -> HitKey:
    """``hit`` as the run tells it from another document (its source and content)."""
    return (hit.uri, hit.content)


@dataclass
class RunFrame:
    """One run in flight: its scope, the retrieved documents the run passes on (``hits``: so
    a prompt that inlines them sends them once; see :meth:`pass_documents`) and which of them
    were recorded (``recorded``), the conversations its prompt builders rendered as text
    (``rendered``), the Agent whose model calls these are (a component's name in a pipeline,
    else ``None``), whether that Agent has a system prompt of its own (the first message of
    each of its model calls), and the user messages the run's Agents were asked, by text,
    with the Agent that was asked first (the run's input handed to each of its Agents is
    asked once). The run's Agents share ``hits``, ``recorded``, ``rendered`` and ``asked``."""

    scope: Scope
    hits: list[RetrievalHit] = field(default_factory=list)
    agent: str | None = None
    prompted: bool = False
    asked: dict[str, str] = field(default_factory=dict)
    recorded: set[HitKey] = field(default_factory=set)
    rendered: list[Rendered] = field(default_factory=list)

    def pass_documents(
        self, taken: list[RetrievalHit], given: list[RetrievalHit], retrieves: bool
    ) -> None:
        """A component of the run ended, having taken the documents ``taken`` in (counted
        only for a component with a document output: a ranker, a filter, a joiner, a
        splitter) and given ``given`` out. The run's documents it took in and did not give
        out are dropped (a ranker's ``top_k``, a filter): the model never receives them, so
        they are not the session's evidence. What it gives out is the run's when it
        retrieves (``retrieves``: it takes a query) or took some of the run's documents in,
        in place of the documents it took (a reranker's scores)."""
        current = {hit_key(h): h for h in self.hits}
        took = {hit_key(h) for h in taken} & current.keys()
        if not retrieves and not took:
            return
        gave = {hit_key(h): h for h in given}
        for key in took - gave.keys():
            del current[key]
        current.update(gave)
        self.hits[:] = current.values()

    def unrecorded(self) -> list[RetrievalHit]:
        """The run's documents not recorded yet, now counted as recorded."""
        hits = [h for h in self.hits if hit_key(h) not in self.recorded]
        self.recorded.update(map(hit_key, hits))
        return hits


@dataclass
class StepFrame:
    """One Agent step in flight: the tool calls its model asked for (with their ids, read from
    the reply) and the tool runs the tracer saw, filled from the tool threads."""

    calls: list[Any] = field(default_factory=list)
    tools: list[ToolFrame] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self, tool: ToolFrame) -> str:
        """The id of the first call of this step with ``tool``'s name and arguments that no
        other tool run claimed yet (a generated one when the reply named none)."""
        with self.lock:
            taken = {t.claimed for t in self.tools if t is not tool}
            for call in self.calls:
                if (
                    call.id is not None
                    and str(call.id) not in taken
                    and call.tool_name == tool.name
                    and call.arguments == tool.arguments()
                ):
                    return str(call.id)
        return f"{tool.name}:{uuid.uuid4().hex[:12]}"


class ToolFrame:
    """A tool run of an Agent step in flight: the scope of the run that called it, its name,
    its timing, and its call id (claimed from the step's reply once the tool's arguments are
    known)."""

    def __init__(
        self,
        scope: Scope,
        name: str,
        tags: dict[str, Any],
        step: StepFrame | None,
        scope_ids: ToolScopeIds,
    ) -> None:
        self.scope = scope
        self.name = name
        self.started = time.time()
        self.ended: float | None = None
        self.claimed: str | None = None
        self._tags = tags
        self._step = step
        self._scope_ids = scope_ids
        self._child: str | None = None

    def arguments(self) -> Any:
        return self._tags.get("haystack.agent.step.tool.input")

    @property
    def call_id(self) -> str:
        if self.claimed is None:
            self.claimed = (
                self._step.claim(self)
                if self._step is not None
                else f"{self.name}:{uuid.uuid4().hex[:12]}"
            )
        return self.claimed

    @property
    def child_id(self) -> str:
        """The id naming the child scope of the runs nested in this tool run: its call id,
        or ``<id>~2``, ... when an earlier run of the session used that id (a model may
        answer ``call_0`` in every turn)."""
        if self._child is None:
            self._child = self._scope_ids.take(self.scope.session_id, self.call_id)
        return self._child


run_frame: ContextVar[RunFrame | None] = ContextVar("ce_haystack_run", default=None)
step_frame: ContextVar[StepFrame | None] = ContextVar("ce_haystack_step", default=None)
tool_frame: ContextVar[ToolFrame | None] = ContextVar("ce_haystack_tool", default=None)
component_name: ContextVar[str | None] = ContextVar("ce_haystack_component", default=None)
"""The name of the pipeline component running (an Agent's name in its pipeline)."""
in_hook: ContextVar[str | None] = ContextVar("ce_haystack_in_hook", default=None)
"""The name of the Agent hook running (its ``haystack.agent.hook`` span): a model call made
there (a ``CompactionHook``'s ``SummarizationCompactor``) is the hook's work (see
:func:`hook_run`)."""
in_component_work: ContextVar[str | None] = ContextVar("ce_haystack_component_work", default=None)
"""The name of the pipeline component whose own work a chat generator runs for (Haystack's
``haystack.chat_generator.run`` span: a router, a ranker, an extractor, a query expander calls
its generator and keeps the reply to itself): a model call made there is a run of its own (see
:func:`hook_run`), never a turn of the pipeline's conversation."""
in_call: ContextVar[bool] = ContextVar("ce_haystack_in_call", default=False)
"""Set while a wrapped chat generator runs: a generator it calls (a fallback's, a
subclass's ``super().run``) passes through."""


@contextlib.contextmanager
def bound(var: ContextVar[Any], value: Any) -> Iterator[None]:
    """``var`` set to ``value`` for the block (a reset from another context is ignored)."""
    token = var.set(value)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            var.reset(token)


def open_run(
    plugin: Plugin, explicit: object = None, agent: str | None = None, prompted: bool = False
) -> RunFrame:
    """The frame of a run starting now: nested in the tool run in flight, else the enclosing
    run's own frame (unless ``explicit`` names another session), else a new top-level run.
    ``agent``, ``prompted``: see :class:`RunFrame`."""
    tool = tool_frame.get()
    outer = run_frame.get()
    if tool is not None:
        scope = resolve_scope(
            plugin,
            run_id=uuid.uuid4().hex,
            explicit=explicit,
            parent=tool.scope,
            parent_call_id=tool.child_id,
        )
        return RunFrame(scope, agent=agent or tool.name, prompted=prompted)
    if outer is not None:
        named = explicit if isinstance(explicit, (str, int)) and explicit != "" else None
        if named is None or str(named) == outer.scope.session_id:
            if agent is None or (outer.agent, outer.prompted) == (agent, prompted):
                return outer
            return _with_agent(outer, agent, prompted)
        return RunFrame(Scope(str(named), "explicit"), agent=agent, prompted=prompted)
    scope = resolve_scope(plugin, run_id=uuid.uuid4().hex, explicit=explicit)
    return RunFrame(scope, agent=agent, prompted=prompted)


def hook_run(plugin: Plugin, outer: RunFrame, hook: str) -> RunFrame:
    """The frame of a model call an Agent's hook makes (a ``CompactionHook`` summarising the
    Agent's older messages with its own generator), or a component makes for its own work (an
    ``LLMMessagesRouter`` classifying the messages, an ``LLMRanker``): that work's, a run of
    its own in the child scope ``<session>/<hook or component>-<id>``, never a turn of the
    conversation."""
    scope = resolve_scope(
        plugin,
        run_id=uuid.uuid4().hex,
        parent=outer.scope,
        parent_call_id=f"{hook}-{uuid.uuid4().hex[:12]}",
    )
    return RunFrame(scope)


def _with_agent(outer: RunFrame, agent: str, prompted: bool) -> RunFrame:
    """The enclosing run's frame as seen by one of its Agents (the retrieved documents, the
    conversations rendered and the questions asked are shared)."""
    frame = RunFrame(outer.scope, agent=agent, prompted=prompted)
    frame.hits = outer.hits
    frame.asked = outer.asked
    frame.recorded = outer.recorded
    frame.rendered = outer.rendered
    return frame
