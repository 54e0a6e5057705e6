"""Semantic Kernel runs -> the engine, through SK's own filters.

Two filters, plain closures (``Kernel.clone()`` deep-copies the filter lists: a bound method
would drag the plugin and its engine into the copy):

- the AUTO_FUNCTION_INVOCATION filter runs around each function call the model asked for: it
  knows SK's call id (``function_call_content.id``), so it records the run (id, name,
  arguments, result, status, duration) and the retrieval hits of a search function, and
  marks the call in flight so a model call inside the function gets a child scope; it does
  the same for a call the app runs itself (``kernel.invoke_function_call`` in its own
  function-calling loop) in a named session;
- the FUNCTION_INVOCATION filter runs around every function: a function's exception passes
  through it (the auto-invocation code turns it into a string result before the AUTO filter
  sees it), so it notes the error status and parses search results; at the top level (no run
  in flight) it starts a run, so the model calls of one ``kernel.invoke_prompt`` share one
  scope (in a named session, a native function's model calls get a child scope of their own:
  they are the function's work, not turns of the conversation).

Every write is awaited on the caller's loop (SK is async), fail-open like the kit's
:func:`ce.core.integration.guarded`: a failed write is logged and reported as a ``Degraded``
event, never raised into the app's call (raised with ``fail_closed=True``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from ce.core.integration import (
    ModelCall,
    Recorder,
    RetrievalHit,
    ToolRun,
    ToolScopeIds,
    error_text,
    is_suppressed,
    provider_of,
)
from ce.core.integration import (
    record_awaited as write,
)
from ce.core.schema import ModelUsageStage
from ce.semantic_kernel._scopes import (
    ToolFrame,
    agent_frame,
    call_site,
    explicit_session,
    internal_kind,
    outer_scope,
    resolve,
    run_scope,
    tool_frame,
)

if TYPE_CHECKING:
    from ce.core.integration import Plugin

__all__ = ["Filters", "hits_from_result", "model_call", "write"]

_URI_KEYS = ("source", "uri", "url", "link", "file_path", "path")
_TEXT_KEYS = ("content", "text", "value", "chunk", "body", "description")
_ID_KEYS = ("id", "key", "doc_id", "document_id")
_SMALL = 512

Filter = Callable[..., Coroutine[Any, Any, None]]
"""An SK filter: ``async def f(context, next)``."""


def model_call(
    service: Any,
    usage: tuple[int, int],
    started: float,
    first_token: float | None,
    text: str,
    stage: ModelUsageStage = ModelUsageStage.OTHER,
    error: BaseException | None = None,
    model: str | None = None,
) -> ModelCall:
    """The neutral record of one finished (or failed) request of ``service``."""
    ended = time.perf_counter()
    return ModelCall(
        call_id=uuid.uuid4().hex,
        provider=provider_of(service),
        model=model or str(getattr(service, "ai_model_id", "") or "unknown"),
        prompt_tokens=usage[0],
        completion_tokens=usage[1],
        latency_ms=round((ended - started) * 1000),
        first_token_latency_ms=(
            round((first_token - started) * 1000) if first_token is not None else None
        ),
        output_text=text,
        stage=stage,
        error=error_text(error) if error is not None else None,
    )


def _small(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= _SMALL
    return isinstance(value, (int, float, bool))


def _hit(item: Any) -> RetrievalHit | None:
    """One search result as a hit: a ``TextSearchResult`` (name, value, link), a
    ``VectorSearchResult`` (record, score) or their JSON."""
    if isinstance(item, str):
        try:
            item = json.loads(item)
        except ValueError:
            return None
    if not isinstance(item, Mapping):
        dumped = getattr(item, "model_dump", None)
        if dumped is None:
            return None
        try:
            item = dumped()
        except Exception:  # not a plain model
            return None
    if not isinstance(item, Mapping):
        return None
    if "record" in item and "score" in item:
        record = item.get("record")
        score = item.get("score")
        if not isinstance(record, Mapping):
            record = {"content": str(record)}
        text = next((str(record[k]) for k in _TEXT_KEYS if record.get(k)), "")
        if not text:
            text = json.dumps(record, default=str, ensure_ascii=False)
        uri = next((str(record[k]) for k in _URI_KEYS if record.get(k)), "")
        doc_id = next((str(record[k]) for k in _ID_KEYS if record.get(k) is not None), None)
        metadata = {
            str(k): v
            for k, v in record.items()
            if _small(v) and k not in _URI_KEYS and k not in _TEXT_KEYS and k not in _ID_KEYS
        }
        return RetrievalHit(
            content=text,
            uri=uri,
            score=float(score) if isinstance(score, (int, float)) else None,
            doc_id=doc_id,
            metadata=metadata,
        )
    if "value" in item and ("link" in item or "name" in item):
        uri = str(item.get("link") or "")
        name = item.get("name")
        metadata = {"name": str(name)} if name else {}
        return RetrievalHit(content=str(item.get("value") or ""), uri=uri, metadata=metadata)
    return None


def hits_from_result(value: Any) -> list[RetrievalHit]:
    """The retrieval hits in a function's result: a list (or one) of text-search or
    vector-search results, as SK's ``create_search_function`` returns them; empty for
    anything else."""
    items = value if isinstance(value, (list, tuple)) else [value]
    hits: list[RetrievalHit] = []
    for item in items:
        hit = _hit(item)
        if hit is None:
            return []  # not a search result list: nothing is retrieval
        hits.append(hit)
    return hits


class Filters:
    """The two filter closures of one install (see the module docstring); ``active()`` says
    whether they act (they pass through once the plugin is uninstalled: a kernel cloned while
    installed keeps them)."""

    def __init__(self, plugin: Plugin, generation: object) -> None:
        self.plugin = plugin
        self.generation = generation
        self.tool_scope_ids = ToolScopeIds(plugin)  # child scopes of function calls, per session
        self.function = self._make_function()
        self.auto = self._make_auto()

    def active(self) -> bool:
        plugin = self.plugin
        return (
            plugin.installed
            and plugin.options.get("_generation") is self.generation
            and not is_suppressed()
        )

    def _make_function(self) -> Filter:
        active, plugin = self.active, self.plugin

        async def ce_function_invocation_filter(
            context: Any, next: Callable[[Any], Awaitable[None]]
        ) -> None:
            if not active():
                await next(context)
                return
            tool = tool_frame.get()
            own = tool is not None and not tool.entered  # the called function, not one it calls
            if tool is not None:
                tool.entered = True
            token = agent_token = None
            scope = None
            arguments = getattr(context, "arguments", None)
            free = tool is None and call_site.get() is None and internal_kind.get() is None
            function = getattr(context, "function", None)
            name = str(getattr(function, "name", "") or "function")
            if free and agent_frame.get() is None and run_scope.get() is None:
                # a top-level kernel.invoke / invoke_prompt: its model calls share one run
                scope = resolve(
                    plugin, run_id=uuid.uuid4().hex, explicit=explicit_session(arguments)
                )
                run = scope
                if scope.named and not getattr(function, "is_prompt", True):
                    # a native function the app runs itself in a named session (a tool of
                    # the app's own function-calling loop, a helper): a model call it makes
                    # is its own work, not a turn of the session's conversation
                    run = scope.child(f"{name}:{uuid.uuid4().hex[:12]}")
                token = run_scope.set(run)
            elif free:
                # a function invoked inside a run or an agent's turn, not by the model (a
                # prompt template calling another prompt function, a native function
                # prompting): its model calls are its own work, a run of its own nested there
                outer = outer_scope(plugin, arguments)
                named = explicit_session(arguments)  # the outer's, passed on by a template
                nested = resolve(
                    plugin,
                    run_id=uuid.uuid4().hex,
                    explicit=None if named in (*outer.lineage, outer.session_id) else named,
                    parent=outer,
                    parent_call_id=f"{name}:{uuid.uuid4().hex[:12]}",
                )
                token, agent_token = run_scope.set(nested), agent_frame.set(None)
            try:
                await next(context)
            except Exception as exc:
                if own and tool is not None and tool.error is None:
                    tool.error = error_text(exc)
                raise
            finally:
                if agent_token is not None:
                    agent_frame.reset(agent_token)
                if token is not None:
                    run_scope.reset(token)
            if (own and tool is not None) or scope is not None:
                result = getattr(context, "result", None)
                value = getattr(result, "value", None)
                try:
                    hits = hits_from_result(value) if value is not None else []
                except Exception:  # an odd result is no retrieval
                    hits = []
                if tool is not None:
                    tool.hits = hits  # recorded with the function call, by the AUTO filter
                elif scope is not None and hits:
                    # a search function the app invoked itself: the app retrieved
                    await write(
                        plugin,
                        scope.session_id,
                        "record retrieval",
                        lambda r: r.record_retrieval(hits),
                    )

        return ce_function_invocation_filter

    def _make_auto(self) -> Filter:
        active, plugin, scope_ids = self.active, self.plugin, self.tool_scope_ids

        async def ce_auto_function_invocation_filter(
            context: Any, next: Callable[[Any], Awaitable[None]]
        ) -> None:
            site = call_site.get()
            call = getattr(context, "function_call_content", None)
            if not active() or call is None or (site is not None and site.internal):
                await next(context)
                return
            if site is not None:
                scope = site.scope
            else:
                # the app runs a function call of its own function-calling loop
                # (``kernel.invoke_function_call`` after a request with ``auto_invoke=False``):
                # in a named session it is that session's function call, as when SK runs it
                scope = outer_scope(plugin, getattr(context, "arguments", None))
                if not scope.named:  # no session holds the request that asked for it
                    await next(context)
                    return
            call_id = str(call.id or uuid.uuid4().hex)
            child_id = scope_ids.take(scope.session_id, call_id)
            frame = ToolFrame(scope, call_id, child_id, agent_frame.get())
            frame_token = tool_frame.set(frame)
            started = time.time()
            try:
                await next(context)
            finally:
                tool_frame.reset(frame_token)
            result = getattr(context, "function_result", None)
            value = getattr(result, "value", None)
            text = "" if value is None else value if isinstance(value, str) else str(value)
            run = ToolRun(
                tool_call_id=frame.call_id,
                name=str(getattr(context.function, "name", None) or call.function_name or ""),
                args=_arguments(call),
                result=None if frame.error else text,
                error=frame.error,
                started_at=started,
                ended_at=time.time(),
                provider_name=str(getattr(context.function, "plugin_name", None) or "")
                or "semantic_kernel",
            )
            hits = frame.hits

            async def work(recorder: Recorder) -> None:
                await recorder.record_tool_run(run)
                if hits:
                    await recorder.record_retrieval(hits, run.tool_call_id)

            await write(plugin, scope.session_id, "record function call", work)

        return ce_auto_function_invocation_filter


def _arguments(call: Any) -> dict[str, Any] | str:
    raw = getattr(call, "arguments", None)
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str) or not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw
    return parsed if isinstance(parsed, dict) else raw
