"""ContextEngine: the facade a host or a framework plugin talks to (seed 004 §6.7)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from ce.core._drive import inline, settle
from ce.core.config import RedactionConfig, RuntimeConfig
from ce.core.engine._session import SessionEntry, SessionLocks
from ce.core.engine._turn import Selection, select_and_assemble
from ce.core.engine._writes import HistoryWriter, WriteLog
from ce.core.errors import (
    BudgetExceededError,
    EvidenceNotFoundError,
    InvariantViolationError,
    SessionNotFoundError,
    SummarizerError,
    TurnNotFoundError,
    VersionConflictError,
)
from ce.core.events import Event, EventBus, InMemoryEventBus
from ce.core.pipeline import (
    EvidenceIngestor,
    IngestOptions,
    LlmAdapter,
    LlmSummarizer,
    Summarizer,
    should_summarize,
    summary_range_end,
)
from ce.core.primitives import (
    Clock,
    Hasher,
    IdGenerator,
    Sha256Hasher,
    SystemClock,
    UuidV4Generator,
    parse_iso,
)
from ce.core.redaction import RegexRedactor
from ce.core.schema import (
    ContextBlock,
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    Message,
    ModelInvocation,
    ModelUsage,
    ModelUsageStage,
    PrepareResult,
    PutResult,
    Ref,
    Report,
    Role,
    RunStatus,
    SessionDocument,
    SourceKind,
    Task,
    ToolCall,
    TurnRecord,
)
from ce.core.state import AgentState, ModelOutput
from ce.core.stores import SessionChanges, Store, default_store_url, open_store
from ce.core.tokens import TiktokenEstimator, TokenEstimator

__all__ = ["ContextEngine", "current_session_id"]

_current_session: ContextVar[str | None] = ContextVar("ce_current_session", default=None)
_T = TypeVar("_T")


def current_session_id() -> str | None:
    """The session set by the innermost ``with engine.session(...)`` in this context."""
    return _current_session.get()


class ContextEngine(HistoryWriter):
    """Records sessions and assembles the model input before every call.

    ``store``: where sessions live (default: ``$CE_STORE_URL``, else an SQLite file under
    ``./.ce/``). ``config``: the default :class:`RuntimeConfig` of every call that passes none.
    ``llm_adapter`` (or a ``summarizer``) enables rolling summaries. Calls for one session are
    serialized; different sessions run concurrently. Every coroutine method has a blocking twin
    under :attr:`sync`.

    ``conflict_retries``: how often a write the store refused because another process wrote
    the session first (:class:`VersionConflictError`) is redone on the fresh session. The
    first retry is immediate (seed 004 §18.2: retry once); the later ones wait a short random
    pause first (at most 10 ms, 20 ms, 40 ms, … up to 200 ms), so many workers writing one
    session at once do not lose a write that a plugin has no way to redo. The error reaches
    the caller after that many retries (0: at once).
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        config: RuntimeConfig | None = None,
        event_bus: EventBus | None = None,
        clock: Clock | None = None,
        id_generator: IdGenerator | None = None,
        hasher: Hasher | None = None,
        token_estimator: TokenEstimator | None = None,
        redactor: RegexRedactor | None = None,
        llm_adapter: LlmAdapter | None = None,
        summarizer: Summarizer | None = None,
        max_cached_sessions: int = 1024,
        conflict_retries: int = 4,
    ) -> None:
        if conflict_retries < 0:
            raise ValueError(f"conflict_retries must be >= 0, got {conflict_retries}")
        self.conflict_retries = conflict_retries
        self._owns_store = store is None
        self.store: Store = store or open_store(default_store_url())
        self.config = config or RuntimeConfig()
        self.events: EventBus = event_bus or InMemoryEventBus()
        self.clock: Clock = clock or SystemClock()
        self.ids: IdGenerator = id_generator or UuidV4Generator()
        self.hasher: Hasher = hasher or Sha256Hasher()
        self._tokenizer_notes: list[tuple[str, str]] = []
        self.estimator: TokenEstimator = token_estimator or TiktokenEstimator(
            on_degraded=lambda reason, detail: self._tokenizer_notes.append((reason, detail))
        )
        self._redactor = redactor
        self._redactors: dict[RedactionConfig, RegexRedactor] = {}
        self._stored_forms: dict[int, dict[str, str]] = {}
        self._summarizer = summarizer or (LlmSummarizer(llm_adapter) if llm_adapter else None)
        self._entries: OrderedDict[str, SessionEntry] = OrderedDict()
        self._max_cached = max_cached_sessions
        self._locks = SessionLocks()
        from ce.core.engine._sync import SyncEngine

        self.sync = SyncEngine(self)

    # -- sessions ---------------------------------------------------------------------------

    @contextmanager
    def session(self, session_id: str) -> Iterator[str]:
        """Make ``session_id`` the current session of this context (thread / task)."""
        if not session_id:
            raise ValueError("session_id must be a non-empty string")
        token = _current_session.set(session_id)
        try:
            yield session_id
        finally:
            _current_session.reset(token)

    async def get_session(self, session_id: str) -> SessionDocument:
        doc = await self.store.get_session(session_id)
        if doc is None:
            raise SessionNotFoundError(session_id)
        return doc

    async def list_turns(self, session_id: str, limit: int | None = None) -> list[TurnRecord]:
        return await self.store.list_turns(session_id, limit)

    async def get_report(self, session_id: str, turn_id: str | None = None) -> Report:
        """The report of ``turn_id`` (default: the newest turn of the session)."""
        if turn_id is None:
            turns = await self.store.list_turns(session_id, 1)
            if not turns:
                raise SessionNotFoundError(session_id)
            return turns[-1].report
        record = await self.store.get_turn(session_id, turn_id)
        if record is None:
            raise TurnNotFoundError(session_id, turn_id)
        return record.report

    async def close(self) -> None:
        self.sync.close()
        if self._owns_store:
            await self.store.close()

    # -- plumbing ---------------------------------------------------------------------------

    def _cfg(self, runtime_config: RuntimeConfig | None) -> RuntimeConfig:
        return runtime_config or self.config

    def _estimator_for(self, model_hint: str | None) -> TokenEstimator:
        return self.estimator

    async def _emit(
        self, event_type: str, session_id: str, turn_id: str | None, **payload: Any
    ) -> None:
        bus = self.events
        if isinstance(bus, InMemoryEventBus) and not bus.has_handlers():
            return
        emitted = bus.emit(
            Event(
                event_type=event_type,
                session_id=session_id,
                turn_id=turn_id,
                tool_call_id=payload.pop("tool_call_id", None),
                model_usage_id=payload.pop("model_usage_id", None),
                ts=self.clock.now_iso(),
                payload=payload,
            )
        )
        # the in-memory bus settles async handlers itself; another bus may need a loop
        await (emitted if isinstance(bus, InMemoryEventBus) else settle(emitted))

    async def _entry(self, session_id: str) -> SessionEntry:
        """The cached entry of the session, brought up to the stored version: a stale entry
        absorbs only what other writers stored since (when the store can read that), so a
        turn costs what is new, not the whole history."""
        entry = self._entries.get(session_id)
        if entry is None:
            update = await self.store.read_since(session_id)
        else:
            update = await self.store.read_since(session_id, entry.version, entry.epoch)
            current = entry.version == 0 if update is None else not update.complete
            if current:
                if update is not None and update.version != entry.version:
                    entry.catch_up(update)
                self._entries.move_to_end(session_id)
                return entry
        state = AgentState(session_id, clock=self.clock, id_generator=self.ids)
        version, epoch = 0, ""
        if update is not None:
            state.absorb(update.changes)
            version, epoch = update.version, update.epoch
        entry = SessionEntry(session_id, state, version, self._estimator_for, epoch)
        self._entries[session_id] = entry
        self._entries.move_to_end(session_id)
        while len(self._entries) > self._max_cached:
            self._entries.popitem(last=False)
        await self._emit("SessionLoaded", session_id, None, version=version)
        return entry

    @asynccontextmanager
    async def _serialized(self, session_id: str) -> AsyncIterator[None]:
        if not session_id:
            raise ValueError("session_id must be a non-empty string")
        async with self._locks.hold(session_id):
            yield

    async def _attempt(
        self, session_id: str, call: WriteLog, op: Callable[[SessionEntry], Awaitable[_T]]
    ) -> _T:
        """Run ``op`` on the session; on a version conflict read the session again and redo
        it, up to ``conflict_retries`` times (see the class docstring)."""
        retry = 0
        while True:
            entry = await self._entry(session_id)
            try:
                return await op(entry)
            except VersionConflictError as exc:
                # the cached state holds the refused writes: read the session afresh
                self._entries.pop(session_id, None)
                call.errors.append(("version_conflict", str(exc)))
                await self._emit(
                    "Error", session_id, call.turn_id, reason="version_conflict", detail=str(exc)
                )
                retry += 1
                if retry > self.conflict_retries:
                    raise
                if retry > 1:
                    pause = random.uniform(0, min(0.2, 0.0025 * 2**retry))
                    if inline():
                        time.sleep(pause)
                    else:
                        await asyncio.sleep(pause)
            except BaseException:
                # the cached state may hold writes that never reached the store
                self._entries.pop(session_id, None)
                raise

    async def _persist(
        self, entry: SessionEntry, call: WriteLog, turn: TurnRecord | None = None
    ) -> PutResult:
        changes: SessionChanges = entry.state.take_changes()
        if turn is not None:
            changes.turns.append(turn)
        result = await self.store.commit(entry.session_id, changes, expected_version=entry.version)
        entry.version = result.version
        if result.epoch is not None:
            entry.epoch = result.epoch
        for reason, detail in call.degradations[call.degradations_emitted :]:
            await self._emit(
                "Degraded", entry.session_id, call.turn_id, reason=reason, detail=detail
            )
        call.degradations_emitted = len(call.degradations)
        for message in call.new_messages:
            await self._emit(
                "MessageAppended",
                entry.session_id,
                call.turn_id,
                message_id=message.message_id,
                role=message.role.value,
            )
        await self._emit("Persisted", entry.session_id, call.turn_id, version=result.version)
        return result

    # -- host state: instruction, notebook, tasks --------------------------------------------

    async def set_system_instruction(
        self, session_id: str, text: str, runtime_config: RuntimeConfig | None = None
    ) -> PutResult:
        """Set the session's system instruction (the same text again writes nothing)."""
        cfg = self._cfg(runtime_config)
        call = WriteLog(self.ids.generate())

        async def op(entry: SessionEntry) -> PutResult:
            redacted, rules = self._redact_text(text, cfg, call)
            stored = entry.state.set_system_instruction(redacted)
            self._note_redaction(call, f"msg:{stored.message_id}", rules, 1)
            return await self._persist(entry, call)

        async with self._serialized(session_id):
            return await self._attempt(session_id, call, op)

    async def update_notebook(
        self, session_id: str, content: str, runtime_config: RuntimeConfig | None = None
    ) -> PutResult:
        """Replace the session's memory notebook (rendered as a high-priority memory block)."""
        cfg = self._cfg(runtime_config)
        call = WriteLog(self.ids.generate())

        async def op(entry: SessionEntry) -> PutResult:
            entry.state.update_notebook(self._redact_text(content, cfg, call)[0])
            return await self._persist(entry, call)

        async with self._serialized(session_id):
            return await self._attempt(session_id, call, op)

    async def put_context_block(self, session_id: str, block: ContextBlock) -> PutResult:
        """Insert or replace a host context block; its ``refs`` render the cited evidence
        (narrowed by their selectors) fenced with provenance."""
        call = WriteLog(self.ids.generate())

        async def op(entry: SessionEntry) -> PutResult:
            entry.state.put_context_block(block)
            return await self._persist(entry, call)

        async with self._serialized(session_id):
            return await self._attempt(session_id, call, op)

    async def upsert_tasks(self, session_id: str, tasks: Sequence[Task]) -> PutResult:
        """Insert or replace tasks of the session's task list (rendered as a state block)."""
        call = WriteLog(self.ids.generate())

        async def op(entry: SessionEntry) -> PutResult:
            entry.state.upsert_tasks(tasks)
            return await self._persist(entry, call)

        async with self._serialized(session_id):
            return await self._attempt(session_id, call, op)

    # -- phase A: prepare -------------------------------------------------------------------

    async def prepare_turn(
        self,
        session_id: str,
        user_message: Message | str,
        runtime_config: RuntimeConfig | None = None,
    ) -> PrepareResult:
        """Record a new user message and assemble the model input for it. A message whose
        ``message_id`` is already stored is not written again: a retried call (its answer
        lost) assembles the input again and stores one more turn record."""
        cfg = self._cfg(runtime_config)
        message = (
            Message(role=Role.USER, content=user_message)
            if isinstance(user_message, str)
            else user_message
        )
        if message.role is not Role.USER:
            raise InvariantViolationError("prepare_turn takes a user message")
        call = WriteLog(self.ids.generate())

        async def op(entry: SessionEntry) -> PrepareResult:
            if not (message.message_id and message.message_id in entry.message_ids):
                self._begin_run(entry.state)
                self._write_user(entry, message, cfg, call)
            return await self._prepare(entry, cfg, call, "turn", None)

        async with self._serialized(session_id):
            return await self._attempt(session_id, call, op)

    async def prepare_call(
        self,
        session_id: str,
        pending_messages: Sequence[Message],
        runtime_config: RuntimeConfig | None = None,
        tool_schemas: list[dict[str, Any]] | None = None,
    ) -> PrepareResult:
        """Before EVERY model call (tool loops included): record the framework's pending
        messages that are new, keep the current run's in-flight tool chain whole, count
        ``tool_schemas`` against the budget, and assemble."""
        cfg = self._cfg(runtime_config)
        call = WriteLog(self.ids.generate())

        async def op(entry: SessionEntry) -> PrepareResult:
            self._record_pending(entry, pending_messages, cfg, call)
            return await self._prepare(entry, cfg, call, "call", tool_schemas)

        async with self._serialized(session_id):
            return await self._attempt(session_id, call, op)

    async def _prepare(
        self,
        entry: SessionEntry,
        cfg: RuntimeConfig,
        call: WriteLog,
        kind: str,
        tool_schemas: list[dict[str, Any]] | None,
    ) -> PrepareResult:
        await self._maybe_summarize(entry, cfg, call)
        index = entry.index(cfg.model_hint)
        now = self.clock.now_iso()
        try:
            selection = await select_and_assemble(
                index, entry.doc, cfg, now=parse_iso(now), tool_schemas=tool_schemas
            )
        except BudgetExceededError as exc:
            await self._emit(
                "Error",
                entry.session_id,
                call.turn_id,
                reason="must_exceeded_budget",
                detail=str(exc),
            )
            raise
        call.errors.extend(index.drain_errors())
        call.degradations.extend(selection.degradations)
        call.degradations.extend(self._tokenizer_notes)
        self._tokenizer_notes.clear()
        report = self._report(call, selection)
        self._transition(entry.state, RunStatus.MODEL_RUNNING)
        turn = None
        if cfg.observability.include_reports_in_store:
            turn = TurnRecord(
                turn_id=call.turn_id,
                kind="turn" if kind == "turn" else "call",
                at=now,
                message_count=len(entry.doc.session.messages),
                evidence_count=len(entry.doc.evidences),
                summary=entry.doc.session.summary,
                config=_config_snapshot(cfg),
                tool_schemas=list(tool_schemas or []),
                report=report,
            )
        result = await self._persist(entry, call, turn)
        await self._emit_turn_events(entry.session_id, call, selection)
        return PrepareResult(
            assembled_input=selection.assembled, report=report, session_version=result.version
        )

    def _report(self, call: WriteLog, selection: Selection) -> Report:
        return Report(
            turn_id=call.turn_id,
            new_evidence_ids=list(call.new_evidence_ids),
            new_block_ids=[
                f"msg:{m.message_id}" for m in call.new_messages if m.role is not Role.TOOL
            ],
            prune_decisions=selection.decisions,
            redactions=list(call.redactions),
            token_budget=selection.budget,
            token_used=selection.assembled.total_tokens,
            degradations=[f"{reason}: {detail}" for reason, detail in call.degradations],
            errors=[f"{reason}: {detail}" for reason, detail in call.errors],
        )

    async def _emit_turn_events(
        self, session_id: str, call: WriteLog, selection: Selection
    ) -> None:
        turn = call.turn_id
        for reason, detail in call.errors:
            if reason != "version_conflict":  # emitted when it happened
                await self._emit("Error", session_id, turn, reason=reason, detail=detail)
        await self._emit("BlocksDerived", session_id, turn, candidates=selection.candidate_count)
        dropped = [d for d in selection.decisions if d.action == "dropped"]
        await self._emit(
            "PruneCompleted",
            session_id,
            turn,
            kept=sum(d.block_count for d in selection.decisions if d.action != "dropped"),
            dropped=sum(d.block_count for d in dropped),
            reasons=sorted({d.reason for d in dropped}),
        )
        await self._emit(
            "Assembled",
            session_id,
            turn,
            parts=len(selection.assembled.parts),
            total_tokens=selection.assembled.total_tokens,
            budget=selection.budget,
        )

    async def _maybe_summarize(
        self, entry: SessionEntry, cfg: RuntimeConfig, call: WriteLog
    ) -> None:
        if self._summarizer is None or not cfg.summary.enabled:
            return
        index = entry.index(cfg.model_hint)
        doc = entry.doc
        messages = doc.session.messages
        summary = doc.session.summary
        start = summary.message_index_range.to_index + 1 if summary else 0
        tail = (
            index.groups[index.last_user_group].position
            if index.last_user_group is not None
            else len(messages)
        )
        stop = min(len(messages) - cfg.summary.preserve_recent_messages, tail)
        first = index.first_group_after(start - 1)
        last = index.first_group_after(stop - 1)
        if stop <= start or not should_summarize(
            stop - start, index.group_tokens(first, last), cfg.summary
        ):
            return
        end = summary_range_end(messages, start, stop)
        if end is None:
            return
        # the engine's own model call: no plugin may rewrite, record or re-enter it
        from ce.core.integration import suppressed

        try:
            with suppressed():
                draft = await settle(
                    self._summarizer.summarize(
                        messages, summary, cfg.summary, start=start, to_index=end
                    )
                )
        except SummarizerError as exc:
            call.degradations.append(("summarize_failed", str(exc)))
            return
        absorbed = sorted(
            {ref.evidence_id for m in messages[start : end + 1] for ref in m.refs or ()}
            | {
                eid
                for record in doc.session.tool_state.tool_calls
                for eid in record.result_evidence_ids
            }
            & set(doc.evidences)
        )
        usage = entry.state.record_model_usage(
            ModelUsage(
                model_usage_id=self.ids.generate(),
                provider=draft.response.provider or "summarizer",
                model=draft.response.model,
                stage=ModelUsageStage.SUMMARIZE,
                prompt_tokens=draft.response.prompt_tokens,
                completion_tokens=draft.response.completion_tokens,
                total_tokens=draft.response.total_tokens,
                latency_ms=draft.response.latency_ms,
            )
        )
        text, _ = self._redact_text(draft.content, cfg, call)
        evidence = entry.state.add_evidence(
            Evidence(
                evidence_id=self.ids.generate(),
                type=EvidenceType.LLM_OUTPUT,
                source=EvidenceSource(kind=SourceKind.LLM, name="summarizer"),
                content=text,
                links=EvidenceLinks(model_usage_id=usage.model_usage_id),
                created_at=self.clock.now_iso(),
            )
        )
        entry.state.set_summary(
            text,
            from_index=0,
            to_index=end,
            evidence_ids=[*absorbed, evidence.evidence_id],
        )
        call.new_evidence_ids.append(evidence.evidence_id)
        await self._emit(
            "SummaryGenerated",
            entry.session_id,
            call.turn_id,
            to_index=end,
            model_usage_id=usage.model_usage_id,
        )

    # -- phase B: the reply -----------------------------------------------------------------

    async def commit_assistant_message(
        self,
        session_id: str,
        assistant_message: Message | ModelOutput,
        refs: list[Ref] | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        """Record the model's reply. A message whose ``message_id`` is already stored is not
        written again (the current version is returned)."""
        cfg = self._cfg(runtime_config)
        call = WriteLog(self.ids.generate())
        if refs is not None:
            assistant_message = assistant_message.model_copy(update={"refs": refs})

        async def op(entry: SessionEntry) -> PutResult:
            if not self._write_reply(entry, assistant_message, cfg, call):
                return PutResult(success=True, version=entry.version)
            return await self._persist(entry, call)

        async with self._serialized(session_id):
            return await self._attempt(session_id, call, op)

    async def commit_assistant_chunk(self, session_id: str, chunk: str, chunk_index: int) -> None:
        """Buffer one streamed chunk (in memory, per session) until the reply is finalized."""
        if chunk_index < 0:
            raise InvariantViolationError("chunk_index must be >= 0")
        async with self._serialized(session_id):
            entry = await self._entry(session_id)
            if entry.chunks.get(chunk_index, chunk) != chunk:
                raise InvariantViolationError(f"chunk {chunk_index} arrived twice with other text")
            entry.chunks[chunk_index] = chunk
        await self._emit("AssistantChunkReceived", session_id, None, chunk_index=chunk_index)

    async def finalize_assistant_message(
        self,
        session_id: str,
        refs: list[Ref] | None = None,
        *,
        invocation: ModelInvocation | None = None,
        message_id: str | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        """Join the buffered chunks in index order and commit them as the reply."""
        async with self._serialized(session_id):
            entry = await self._entry(session_id)
            chunks, entry.chunks = entry.chunks, {}
        if not chunks:
            raise InvariantViolationError("no chunks were committed for this session")
        missing = sorted(set(range(max(chunks) + 1)) - set(chunks))
        if missing:
            raise InvariantViolationError(f"chunks {missing} are missing")
        text = "".join(chunks[i] for i in range(len(chunks)))
        result = await self.commit_assistant_message(
            session_id,
            Message(
                role=Role.ASSISTANT,
                content=text,
                invocation=invocation,
                message_id=message_id,
                refs=refs,
            ),
            runtime_config=runtime_config,
        )
        await self._emit("AssistantMessageFinalized", session_id, None, chars=len(text))
        return result

    # -- phase C: tools, usage, evidence ----------------------------------------------------

    async def record_tool_call(
        self,
        session_id: str,
        tool_call: ToolCall,
        result_evidence_ids: list[str] | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        """Record one tool run (idempotent by ``tool_call_id``); its ``args_digest`` is
        redacted before it is stored."""
        cfg = self._cfg(runtime_config)
        call = WriteLog(self.ids.generate())

        async def op(entry: SessionEntry) -> PutResult:
            digest, rules = self._redact_value(dict(tool_call.args_digest), cfg, call)
            ids = list(
                dict.fromkeys([*tool_call.result_evidence_ids, *(result_evidence_ids or [])])
            )
            record = tool_call.model_copy(
                update={
                    "args_digest": digest,
                    "result_evidence_ids": ids,
                    "tool_call_id": entry.stored_call_id(tool_call.tool_call_id),
                }
            )
            entry.state.record_tool_call(record)
            self._note_redaction(call, f"tool:{tool_call.tool_call_id}", rules, len(rules))
            await self._emit(
                "ToolCallCompleted",
                session_id,
                None,
                tool_call_id=tool_call.tool_call_id,
                status=tool_call.status.value,
                duration_ms=tool_call.duration_ms,
            )
            return await self._persist(entry, call)

        async with self._serialized(session_id):
            return await self._attempt(session_id, call, op)

    async def record_model_usage(
        self,
        session_id: str,
        model_usage: ModelUsage,
        llm_output_evidence_id: str | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        """Record one model call's usage (idempotent by ``model_usage_id``)."""
        cfg = self._cfg(runtime_config)
        call = WriteLog(self.ids.generate())

        async def op(entry: SessionEntry) -> PutResult:
            if llm_output_evidence_id and llm_output_evidence_id not in entry.doc.evidences:
                raise EvidenceNotFoundError(
                    f"evidence {llm_output_evidence_id!r} is not in session {session_id!r}"
                )
            self._write_usage(entry, model_usage, cfg, call)
            return await self._persist(entry, call)

        async with self._serialized(session_id):
            return await self._attempt(session_id, call, op)

    async def record_model_call(
        self,
        session_id: str,
        model_usage: ModelUsage,
        *,
        reply: Message | ModelOutput | None = None,
        output: tuple[str, EvidenceSource] | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        """Record what one model call produced in one atomic write: its ``reply`` (as
        :meth:`commit_assistant_message` does; skipped when its ``message_id`` is stored), its
        text ``output`` as ``llm_output`` evidence linked to the usage (content, source;
        redacted and deduplicated as :meth:`ingest_evidence` does) and its usage (as
        :meth:`record_model_usage` does). Integrations call this once at the end of a model
        call instead of the three separately. Idempotent like each of them."""
        cfg = self._cfg(runtime_config)
        call = WriteLog(self.ids.generate())
        ingestor = self._ingestor(cfg)

        async def op(entry: SessionEntry) -> PutResult:
            if reply is not None:
                self._write_reply(entry, reply, cfg, call)
            added = None
            if output is not None and output[0]:
                links = EvidenceLinks(model_usage_id=model_usage.model_usage_id)
                _, added = await self._add_evidence(
                    entry, ingestor, output[0], output[1], EvidenceType.LLM_OUTPUT, links
                )
            self._write_usage(entry, model_usage, cfg, call)
            result = await self._persist(entry, call)
            if added is not None:
                await self._emit_ingested(session_id, *added)
            return result

        async with self._serialized(session_id):
            return await self._attempt(session_id, call, op)

    def _write_reply(
        self, entry: SessionEntry, reply: Message | ModelOutput, cfg: RuntimeConfig, call: WriteLog
    ) -> bool:
        """Add the model's reply and move the run on (tools running, or completed); False
        when a reply with its ``message_id`` is stored already (nothing written)."""
        if reply.message_id and reply.message_id in entry.message_ids:
            text = reply.content if isinstance(reply, Message) else reply.text
            probe = Message(role=Role.ASSISTANT, content=text, message_id=reply.message_id)
            held = self._unless_held(entry, probe, cfg, call)
            if held is None:
                return False
            reply = reply.model_copy(update={"message_id": None, "meta": reply.meta | held.meta})
        stored = self._write_assistant(entry, reply, cfg, call)
        status = RunStatus.TOOL_RUNNING if stored.tool_calls else RunStatus.COMPLETED
        self._transition(entry.state, status)
        return True

    def _write_usage(
        self, entry: SessionEntry, usage: ModelUsage, cfg: RuntimeConfig, call: WriteLog
    ) -> None:
        """Add a usage record (its ``params`` redacted; a stored ``model_usage_id`` is
        skipped by the state)."""
        params, _ = self._redact_value(dict(usage.params), cfg, call)
        entry.state.record_model_usage(usage.model_copy(update={"params": params}))

    async def ingest_evidence(
        self,
        session_id: str,
        content: str,
        source: EvidenceSource,
        evidence_type: EvidenceType,
        links: EvidenceLinks | None = None,
        metadata: dict[str, Any] | None = None,
        options: IngestOptions | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> Evidence:
        """Store ``content`` as evidence: redacted, deduplicated (the same hit ingested twice
        is one evidence: the stored one is returned), with its confidence and links."""
        cfg = self._cfg(runtime_config)
        call = WriteLog(self.ids.generate())
        ingestor = self._ingestor(cfg)

        async def op(entry: SessionEntry) -> Evidence:
            evidence, added = await self._add_evidence(
                entry, ingestor, content, source, evidence_type, links, metadata, options
            )
            if added is not None:
                await self._persist(entry, call)
                await self._emit_ingested(session_id, *added)
            return evidence

        async with self._serialized(session_id):
            return await self._attempt(session_id, call, op)

    def _ingestor(self, cfg: RuntimeConfig) -> EvidenceIngestor:
        return EvidenceIngestor(
            self._redactor_for(cfg),
            self.hasher,
            self.ids,
            self.clock,
            dual_store=cfg.redaction.mode == "dual_store",
        )

    async def _add_evidence(
        self,
        entry: SessionEntry,
        ingestor: EvidenceIngestor,
        content: str,
        source: EvidenceSource,
        evidence_type: EvidenceType,
        links: EvidenceLinks | None = None,
        metadata: dict[str, Any] | None = None,
        options: IngestOptions | None = None,
    ) -> tuple[Evidence, tuple[Evidence, bool] | None]:
        """Add one evidence to the entry's state (not persisted yet): the evidence, and the
        ``(evidence, redacted)`` to announce once persisted — None when the same content was
        stored before (that stored evidence is returned)."""
        if links is not None and links.tool_call_id:
            stored_id = entry.stored_call_id(links.tool_call_id)
            if stored_id != links.tool_call_id:
                links = links.model_copy(update={"tool_call_id": stored_id})
        prepared = ingestor.prepare(content, source, evidence_type, links, metadata, options)
        for reason, detail in prepared.degradations:
            await self._emit("Degraded", entry.session_id, None, reason=reason, detail=detail)
        if prepared.dedup_key is not None:
            existing = entry.dedup.get(prepared.dedup_key)
            if existing is not None and existing in entry.doc.evidences:
                return entry.doc.evidences[existing].model_copy(deep=True), None
        stored = entry.state.add_evidence(prepared.evidence)
        if prepared.original is not None:
            entry.state.add_evidence(prepared.original)
        if prepared.dedup_key is not None:
            entry.dedup[prepared.dedup_key] = stored.evidence_id
        return stored, (stored, prepared.redaction is not None)

    async def _emit_ingested(self, session_id: str, evidence: Evidence, redacted: bool) -> None:
        await self._emit(
            "EvidenceIngested",
            session_id,
            None,
            evidence_id=evidence.evidence_id,
            type=evidence.type.value,
            redacted=redacted,
        )

    # -- replay -----------------------------------------------------------------------------

    async def replay_turn(
        self, session_id: str, turn_id: str, runtime_config: RuntimeConfig | None = None
    ) -> PrepareResult:
        """Reassemble a past turn from what is stored (the history it saw, its summary and
        tool schemas) under ``runtime_config`` (default: the turn's own config). Writes
        nothing; the same stored turn and config give the same result."""
        record = await self.store.get_turn(session_id, turn_id)
        if record is None:
            raise TurnNotFoundError(session_id, turn_id)
        doc = await self.get_session(session_id)
        cfg = runtime_config or RuntimeConfig.model_validate(record.config)
        session = doc.session.model_copy(
            update={
                "messages": doc.session.messages[: record.message_count],
                "summary": record.summary,
            }
        )
        evidences = dict(list(doc.evidences.items())[: record.evidence_count])
        past = doc.model_copy(update={"session": session, "evidences": evidences})
        entry = SessionEntry(
            session_id,
            AgentState.from_document(past, clock=self.clock, copy=False),
            0,
            self._estimator_for,
        )
        selection = await select_and_assemble(
            entry.index(cfg.model_hint),
            entry.doc,
            cfg,
            now=parse_iso(record.at),
            tool_schemas=record.tool_schemas,
        )
        report = Report(
            turn_id=record.turn_id,
            prune_decisions=selection.decisions,
            token_budget=selection.budget,
            token_used=selection.assembled.total_tokens,
            degradations=[f"{r}: {d}" for r, d in selection.degradations],
        )
        return PrepareResult(assembled_input=selection.assembled, report=report)


def _config_snapshot(cfg: RuntimeConfig) -> dict[str, Any]:
    """The config as stored with a turn; literal redaction dictionaries are sensitive strings,
    so the snapshot keeps only that they were there."""
    data = cfg.model_dump(mode="json")
    rules = data.get("redaction", {}).get("rules")
    if rules and rules.get("dictionaries"):
        rules["dictionaries"] = [f"<{len(rules['dictionaries'])} redacted entries>"]
    return data
