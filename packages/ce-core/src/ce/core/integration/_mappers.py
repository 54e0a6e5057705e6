"""Neutral records of what a framework did, their mapping to the schema, and the Recorder
that writes them through the engine."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ce.core.integration._guard import guarded, guarded_sync
from ce.core.pipeline import IngestOptions
from ce.core.schema import (
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    Message,
    ModelUsage,
    ModelUsageStage,
    ModelUsageStatus,
    ProviderKind,
    PutResult,
    SourceKind,
    ToolCall,
    ToolCallStatus,
    ToolProvider,
)
from ce.core.state import parse_tool_arguments

if TYPE_CHECKING:
    from ce.core.engine import ContextEngine
    from ce.core.integration._plugin import Plugin

__all__ = [
    "CLEAR_HISTORY",
    "EvidenceDraft",
    "ModelCall",
    "Recorder",
    "RetrievalHit",
    "ToolRun",
    "clear_sessions",
    "clear_sessions_sync",
    "error_text",
    "evidence_from_hit",
    "llm_output_evidence",
    "model_usage_from_call",
    "provider_of",
    "record_awaited",
    "record_run_ended",
    "record_sync",
    "tool_call_from_run",
    "tool_result_evidence",
    "tool_status",
]

_DIGEST_VALUE_MAX = 1024


def error_text(exc: BaseException) -> str:
    """How an exception is written into a :class:`ToolRun` or :class:`ModelCall`:
    ``"TypeName: message"`` (the type name is what :func:`tool_status` reads)."""
    return f"{type(exc).__name__}: {exc}"


def tool_status(error: str | None) -> ToolCallStatus:
    """The terminal status of a tool run from its error text: none is ``success``; text that
    names a timeout (``TimeoutError``, "timed out") is ``timeout``; a permission error or
    "forbidden" is ``forbidden``; "not found" (``FileNotFoundError``, ``NotFound``...) is
    ``not_found``; anything else ``error``."""
    if error is None:
        return ToolCallStatus.SUCCESS
    text = error.lower()
    if "timeout" in text or "timed out" in text:
        return ToolCallStatus.TIMEOUT
    if "permission" in text or "forbidden" in text:
        return ToolCallStatus.FORBIDDEN
    if "notfound" in text or "not found" in text:
        return ToolCallStatus.NOT_FOUND
    return ToolCallStatus.ERROR


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


@dataclass(frozen=True)
class ToolRun:
    """One finished tool or function run. ``args`` as a dict or the raw argument text;
    ``result`` the text the model gets back; ``error`` (see :func:`error_text`) when it
    failed; ``started_at`` / ``ended_at`` in seconds since the epoch (``time.time()``)."""

    tool_call_id: str
    name: str
    args: dict[str, Any] | str
    result: str | None
    error: str | None
    started_at: float
    ended_at: float
    provider_name: str = ""


@dataclass(frozen=True)
class RetrievalHit:
    """One document a retriever returned; ``score`` becomes the evidence's confidence when
    every score of its retrieval lies in [0, 1] (see :meth:`Recorder.record_retrieval`)."""

    content: str
    uri: str = ""
    score: float | None = None
    doc_id: str | None = None
    doc_version: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelCall:
    """One finished model call. ``call_id`` (the framework's run id) makes recording it
    idempotent; latencies in milliseconds; ``output_text`` is the reply's text; ``error``
    when the call failed."""

    call_id: str
    provider: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: int = 0
    first_token_latency_ms: int | None = None
    output_text: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    stage: ModelUsageStage = ModelUsageStage.OTHER
    error: str | None = None


@dataclass(frozen=True)
class EvidenceDraft:
    """The arguments of one ``engine.ingest_evidence`` call."""

    content: str
    source: EvidenceSource
    evidence_type: EvidenceType
    links: EvidenceLinks | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    options: IngestOptions | None = None


def _small(value: Any) -> Any:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return value if len(text) <= _DIGEST_VALUE_MAX else f"<{len(text)} chars>"


def _args_digest(args: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(args, str):
        parsed, _ = parse_tool_arguments(args)
        if parsed is None:
            return {"raw": _small(args)}
        args = parsed
    return {str(key): _small(value) for key, value in args.items()}


def tool_call_from_run(run: ToolRun, result_evidence_ids: Iterable[str] = ()) -> ToolCall:
    """The :class:`ToolCall` record of ``run``: status from :func:`tool_status`, duration,
    and an arguments digest (values longer than 1 KB replaced by their length)."""
    return ToolCall(
        tool_call_id=run.tool_call_id,
        tool=run.name,
        provider=ToolProvider(kind=ProviderKind.BUILTIN, name=run.provider_name),
        called_at=_iso(run.started_at),
        args_digest=_args_digest(run.args),
        status=tool_status(run.error),
        duration_ms=max(0, round((run.ended_at - run.started_at) * 1000)),
        result_evidence_ids=list(result_evidence_ids),
    )


def tool_result_evidence(run: ToolRun) -> EvidenceDraft:
    """The ``tool_result`` evidence of ``run`` (its result, else its error), linked to its
    tool call."""
    content = run.result if run.result is not None else run.error or ""
    return EvidenceDraft(
        content=content,
        source=EvidenceSource(kind=SourceKind.TOOL, name=run.name),
        evidence_type=EvidenceType.TOOL_RESULT,
        links=EvidenceLinks(tool_call_id=run.tool_call_id),
        metadata={"status": tool_status(run.error).value},
    )


def evidence_from_hit(
    hit: RetrievalHit, tool_call_id: str | None = None, score_is_confidence: bool = True
) -> EvidenceDraft:
    """The ``rag_doc`` evidence of one retrieval hit: source uri, the score (which becomes
    the confidence when it is one, see :class:`~ce.core.pipeline.IngestOptions`; never with
    ``score_is_confidence`` false), doc id and version in the metadata; linked to
    ``tool_call_id`` when a tool retrieved it."""
    metadata = dict(hit.metadata)
    if hit.doc_id is not None:
        metadata["doc_id"] = hit.doc_id
    if hit.doc_version is not None:
        metadata["doc_version"] = hit.doc_version
    if hit.score is not None:
        metadata["score"] = hit.score
    return EvidenceDraft(
        content=hit.content,
        source=EvidenceSource(kind=SourceKind.RAG, uri=hit.uri),
        evidence_type=EvidenceType.RAG_DOC,
        links=EvidenceLinks(tool_call_id=tool_call_id) if tool_call_id else None,
        metadata=metadata,
        options=None if score_is_confidence else IngestOptions(score_is_confidence=False),
    )


def model_usage_from_call(call: ModelCall) -> ModelUsage:
    """The :class:`ModelUsage` of ``call``; its id is ``call.call_id``."""
    return ModelUsage(
        model_usage_id=call.call_id,
        provider=call.provider,
        model=call.model,
        stage=call.stage,
        params=dict(call.params),
        prompt_tokens=call.prompt_tokens,
        completion_tokens=call.completion_tokens,
        total_tokens=call.prompt_tokens + call.completion_tokens,
        first_token_latency_ms=call.first_token_latency_ms,
        latency_ms=call.latency_ms,
        status=ModelUsageStatus.ERROR if call.error else ModelUsageStatus.SUCCESS,
        error=call.error or "",
    )


def llm_output_evidence(call: ModelCall) -> EvidenceDraft | None:
    """The ``llm_output`` evidence of ``call`` (None when it produced no text)."""
    if not call.output_text:
        return None
    return EvidenceDraft(
        content=call.output_text,
        source=EvidenceSource(kind=SourceKind.LLM, name=f"{call.provider}/{call.model}"),
        evidence_type=EvidenceType.LLM_OUTPUT,
        links=EvidenceLinks(model_usage_id=call.call_id),
    )


class Recorder:
    """Writes neutral records into one session through ``engine``. Recording the same run,
    hit or call again changes nothing (the engine deduplicates tool calls and usage by id,
    evidence by source and content). Blocking callers use
    ``engine.sync.run(recorder.record_tool_run(run))``."""

    def __init__(self, engine: ContextEngine, session_id: str) -> None:
        self.engine = engine
        self.session_id = session_id

    async def _ingest(self, draft: EvidenceDraft) -> Evidence:
        return await self.engine.ingest_evidence(
            self.session_id,
            draft.content,
            draft.source,
            draft.evidence_type,
            links=draft.links,
            metadata=draft.metadata,
            options=draft.options,
        )

    async def record_tool_run(self, run: ToolRun, task_id: str | None = None) -> Evidence:
        """Store the run's result as ``tool_result`` evidence and its :class:`ToolCall`
        record pointing at it (attributed to ``task_id`` when given); returns the evidence."""
        evidence = await self._ingest(tool_result_evidence(run))
        record = tool_call_from_run(run, [evidence.evidence_id])
        if task_id is not None:
            record = record.model_copy(update={"task_id": task_id})
        await self.engine.record_tool_call(self.session_id, record)
        return evidence

    async def record_retrieval(
        self, hits: Iterable[RetrievalHit], tool_call_id: str | None = None
    ) -> list[Evidence]:
        """Store one ``rag_doc`` evidence per hit (a hit already stored is not stored
        again); returns them in hit order. The hits' scores are their confidences when all of
        them lie in [0, 1]; when one lies outside (a raw BM25 score, a dot product), none is:
        a weak hit whose raw score happens to be below 1 would otherwise outrank the best."""
        hits = list(hits)
        bounded = all(h.score is None or 0.0 <= h.score <= 1.0 for h in hits)
        return [await self._ingest(evidence_from_hit(hit, tool_call_id, bounded)) for hit in hits]

    async def record_model_call(self, call: ModelCall, reply: Message | None = None) -> ModelUsage:
        """Store the call's ``reply`` (when given, as the assistant message), its
        ``llm_output`` evidence (when it has text) and its :class:`ModelUsage`, in one engine
        write (:meth:`ContextEngine.record_model_call`); returns the usage."""
        draft = llm_output_evidence(call)
        usage = model_usage_from_call(call)
        if reply is not None and reply.message_id is None:
            # named after the call, so writing it again (a retried record) stores it once
            reply = reply.model_copy(update={"message_id": reply_id(call.call_id)})
        await self.engine.record_model_call(
            self.session_id,
            usage,
            reply=reply,
            output=(draft.content, draft.source) if draft is not None else None,
        )
        return usage

    async def cut_history(self, removed: Sequence[Message]) -> PutResult:
        """The app removed ``removed``, the oldest messages of its history, from it (a
        summarizing step that keeps only its latest turns): the session stops sending them
        (:meth:`ContextEngine.cut_history`)."""
        return await self.engine.cut_history(self.session_id, removed)

    async def clear_history(self) -> PutResult:
        """The app cleared its conversation history to start over (a reset): the session
        sends none of the messages it holds so far (:meth:`ContextEngine.clear_history`)."""
        return await self.engine.clear_history(self.session_id)


_flushes: set[asyncio.Task[None]] = set()  # flush tasks in flight (the loop keeps weak refs)


_REPLY_NAMESPACE = uuid.UUID("5d3c8a52-4a0e-4f57-9a43-2f1b6de2a8c1")


def reply_id(call_id: str) -> str:
    """The message id of the reply of model call ``call_id`` (a UUID derived from it)."""
    return str(uuid.uuid5(_REPLY_NAMESPACE, call_id))


async def record_awaited(
    plugin: Plugin,
    session_id: str,
    what: str,
    work: Callable[[Recorder], Coroutine[Any, Any, Any]],
) -> None:
    """From an async framework path: record with ``work`` and a :class:`Recorder` on
    ``plugin.engine``'s session ``session_id``, awaited on the caller's loop, fail-open like
    :func:`~ce.core.integration.guarded` (``what`` names it in the log and the ``Degraded``
    event; raised with ``plugin.fail_closed``). Does nothing when the plugin is not
    installed."""
    if not plugin.installed:
        return
    recorder = Recorder(plugin.engine, session_id)
    await guarded(plugin, lambda: work(recorder), session_id=session_id, what=what)


_PROVIDERS = (
    ("azure", "azure_openai"),
    ("openai", "openai"),
    ("anthropic", "anthropic"),
    ("ollama", "ollama"),
    ("gemini", "gemini"),
    ("google", "google"),
    ("mistral", "mistral"),
    ("bedrock", "bedrock"),
    ("nvidia", "nvidia"),
    ("hugging", "huggingface"),
    ("onnx", "onnx"),
    ("llama_cpp", "llama_cpp"),
)


def provider_of(client: Any) -> str:
    """The provider of a framework's model client or service, from its class name and module
    (``openai``, ``azure_openai``, ``anthropic``, ``ollama``, ...; the class name
    otherwise)."""
    cls = type(client)
    module, name = cls.__module__.lower(), cls.__name__.lower()
    for key, provider in _PROVIDERS:
        if key in name or key in module:
            return provider
    return cls.__name__


def record_sync(
    plugin: Plugin,
    session_id: str,
    what: str,
    work: Callable[[Recorder], Coroutine[Any, Any, Any]],
    *,
    blocking: bool = False,
) -> None:
    """From a framework hook (a callback or event handler): record with ``work`` and a
    :class:`Recorder` on ``plugin.engine``'s session ``session_id``, fail-open like
    :func:`~ce.core.integration.guarded` (``what`` names it in the log and the ``Degraded``
    event). The write joins the session's ordered queue (:meth:`ContextEngine.defer`): from a
    hook on an event loop's thread it is written by a task on that loop once the loop's
    engine calls are done (the hook never blocks the loop; the session's next call writes it
    first if that comes sooner), from a plain thread it is written now, inline.
    ``blocking``: the hook runs inside a blocking framework call (``invoke``, ``chat``,
    ``run``), which holds the thread anyway: it is written now, inline, also on an event
    loop's thread (an app calling the blocking API from async code) — a task queued on the
    loop that call blocks would hold the session while the call's next engine call waits for
    it. With ``plugin.fail_closed`` it is written now and its error raised. Does nothing
    when the plugin is not installed (a hook still running after ``uninstall()``)."""
    if not plugin.installed:
        return
    engine = plugin.engine
    recorder = Recorder(engine, session_id)
    if plugin.fail_closed or blocking:
        guarded_sync(
            plugin, lambda: engine.sync.run(work(recorder)), session_id=session_id, what=what
        )
        return

    async def deferred() -> None:
        await guarded(plugin, lambda: work(recorder), session_id=session_id, what=what)

    engine.defer(session_id, deferred)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        guarded_sync(
            plugin, lambda: engine.sync.flush(session_id), session_id=session_id, what=what
        )
        return
    task = loop.create_task(engine._write_deferred(session_id))
    _flushes.add(task)
    task.add_done_callback(_flushes.discard)


def record_run_ended(
    plugin: Plugin, session_id: str, error: BaseException, *, blocking: bool = False
) -> None:
    """From a framework hook: the app's run (an agent, a graph) raised ``error`` outside a
    model call (a tool's error raised out of it, a cancellation): end the session's run in
    flight (:meth:`ContextEngine.end_run`: ``failed`` with the error, ``aborted`` for a
    cancellation or an exit; a model call that failed ended it already), so the app's next
    call, the turn run again or another question, is read against the conversation as it
    stood. Written as :func:`record_sync` writes (``blocking`` likewise), fail-open. A
    generator closed early is no end of the run."""
    if isinstance(error, GeneratorExit):
        return
    text, cancelled = error_text(error), not isinstance(error, Exception)

    async def end(recorder: Recorder) -> None:
        await recorder.engine.end_run(recorder.session_id, text, cancelled=cancelled)

    record_sync(plugin, session_id, "end run", end, blocking=blocking)


CLEAR_HISTORY = "clear history"
"""How a plugin's clear of a session names itself in the log and the ``Degraded`` event."""


def clear_sessions_sync(
    plugin: Plugin, session_ids: Iterable[str], *, blocking: bool = False
) -> None:
    """The app started a conversation over (a reset, a cleared history, a deleted thread) on
    a sync path: each of ``session_ids`` sends none of what it holds so far
    (:meth:`ContextEngine.clear_history`), written as :func:`record_sync` writes (queued on a
    running loop, now otherwise, or now with ``blocking``), fail-open."""
    for session_id in session_ids:
        record_sync(plugin, session_id, CLEAR_HISTORY, Recorder.clear_history, blocking=blocking)


async def clear_sessions(plugin: Plugin, session_ids: Iterable[str]) -> None:
    """The coroutine twin of :func:`clear_sessions_sync`: each clear awaited on the caller's
    loop (:func:`record_awaited`)."""
    for session_id in session_ids:
        await record_awaited(plugin, session_id, CLEAR_HISTORY, Recorder.clear_history)
