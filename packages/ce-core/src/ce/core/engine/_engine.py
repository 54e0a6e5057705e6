"""ContextEngine: the facade a host or a framework plugin talks to."""

from __future__ import annotations

import atexit
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from ce.core._drive import checkpoint, engine_turn, idle_turn
from ce.core.config import RedactionConfig, RuntimeConfig
from ce.core.engine._carry import Carry
from ce.core.engine._cut import Removed, cut_point
from ce.core.engine._deferred import DeferredWrites, flush_at_exit, note_pending
from ce.core.engine._prepare import Preparer
from ce.core.engine._session import ReadNewest, SessionEntry, SessionLocks, TailTooShort
from ce.core.engine._turn import select_and_assemble
from ce.core.engine._writes import ACTIVE_RUN, WriteLog
from ce.core.errors import (
    EvidenceNotFoundError,
    InvariantViolationError,
    SessionNotFoundError,
    TurnNotFoundError,
)
from ce.core.events import EventBus, InMemoryEventBus
from ce.core.pipeline import IngestOptions, LlmAdapter, LlmSummarizer, Summarizer
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
    ClearedHistory,
    ContextBlock,
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    Message,
    ModelInvocation,
    ModelUsage,
    ModelUsageStatus,
    PrepareResult,
    PutResult,
    Ref,
    Report,
    Role,
    RunStatus,
    SessionDocument,
    Task,
    ToolCall,
    TurnRecord,
)
from ce.core.state import AgentState, ModelOutput, TaskUsage, usage_by_task
from ce.core.stores import SliceStore, Store, default_store_url, open_store, turn_config
from ce.core.tokens import TiktokenEstimator, TokenEstimator

__all__ = ["ContextEngine", "current_session_id"]

atexit.register(flush_at_exit)

_current_session: ContextVar[str | None] = ContextVar("ce_current_session", default=None)
_T = TypeVar("_T")


def current_session_id() -> str | None:
    """The session set by the innermost ``with engine.session(...)`` in this context."""
    return _current_session.get()


class ContextEngine(Preparer):
    """Records sessions and assembles the model input before every call.

    ``store``: where sessions live (default: ``$CE_STORE_URL``, else an SQLite file under
    ``./.ce/``). ``config``: the default :class:`RuntimeConfig` of every call that passes none.
    ``llm_adapter`` (or a ``summarizer``) enables rolling summaries; ``llm_adapter`` also block
    summaries (``SummaryConfig.blocks``). Calls for one session are serialized; different
    sessions run concurrently. Every coroutine method has a blocking twin under :attr:`sync`.

    Sessions are cached (``max_cached_sessions``). On a store that reads a session's newest
    records (:class:`~ce.core.stores.SliceStore`: SQLite, PostgreSQL), the first
    ``prepare_turn`` or ``commit_assistant_message`` of a session in a process reads only those
    (more while the budget could keep older ones), so its cost does not grow with the
    history; the other calls read a session whole on first use.

    A write the store refused because another process wrote the session first
    (:class:`VersionConflictError`) is done again on the fresh session. On a store that can
    hold a session for one writer (:class:`~ce.core.stores.WriterStore`: SQLite, PostgreSQL)
    it is done once more holding the session from the read to the commit, and that commit is
    not refused. On other stores ``conflict_retries`` says how often it is redone: the first
    retry is immediate; the later ones wait a short random pause first (at most 10 ms, 20 ms,
    40 ms, … up to 200 ms), and the error reaches the caller after that many retries (0: at
    once).
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
        self._stored_forms: dict[int, dict[str, tuple[str, tuple[str, ...]]]] = {}
        self._summarizer = summarizer or (LlmSummarizer(llm_adapter) if llm_adapter else None)
        self._llm_adapter = llm_adapter
        self._block_jobs = set()
        self._block_lock = threading.Lock()
        self._block_tasks = set()
        self._block_queue = None
        self._entries: OrderedDict[str, SessionEntry] = OrderedDict()
        self._entries_lock = threading.Lock()
        self._max_cached = max_cached_sessions
        self._locks = SessionLocks()
        self._deferred = DeferredWrites()
        self._carried: dict[str, Carry] = {}
        self._contention: dict[str, float] = {}
        self._tails = isinstance(self.store, SliceStore)
        self._tail_sizes: dict[str, tuple[int, int] | None] = {}
        self._snapshots: dict[int, tuple[RuntimeConfig, str, dict[str, Any]]] = {}
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
        await self._drain(session_id)
        doc = await self.store.get_session(session_id)
        if doc is None:
            raise SessionNotFoundError(session_id)
        return doc

    async def list_sessions(self, user_id: str | None = None) -> list[str]:
        """The ids of the stored sessions (of ``user_id``'s when given), after running every
        deferred record."""
        await self.flush()
        return await self.store.list_sessions(user_id)

    async def list_turns(self, session_id: str, limit: int | None = None) -> list[TurnRecord]:
        await self._drain(session_id)
        return await self.store.list_turns(session_id, limit)

    async def get_report(self, session_id: str, turn_id: str | None = None) -> Report:
        """The report of ``turn_id`` (default: the newest turn of the session)."""
        await self._drain(session_id)
        if turn_id is None:
            turns = await self.store.list_turns(session_id, 1)
            if not turns:
                raise SessionNotFoundError(session_id)
            return turns[-1].report
        record = await self.store.get_turn(session_id, turn_id)
        if record is None:
            raise TurnNotFoundError(session_id, turn_id)
        return record.report

    async def get_usage_by_task(self, session_id: str) -> dict[str, TaskUsage]:
        """The session's model usage summed per task (the usage records that name one,
        ``ModelUsage.task_id``; in the order each task first appears): what each task of a
        crew or a plan cost so far, the table ``ce report`` prints beside a turn's report.
        Raises :class:`SessionNotFoundError` for an unknown session."""
        await self._drain(session_id)
        doc = await self.store.get_session(session_id)
        if doc is None:
            raise SessionNotFoundError(session_id)
        return usage_by_task(doc.session.model_usage)

    async def close(self) -> None:
        """Run the deferred records, then close the store the engine opened itself."""
        await self.flush()
        self.sync.close()
        if self._owns_store:
            await self.store.close()

    # -- write-behind -----------------------------------------------------------------------

    def defer(self, session_id: str, work: Callable[[], Awaitable[Any]]) -> None:
        """Queue a record write for ``session_id`` without waiting for it (write-behind):
        ``work()`` (a coroutine of engine writes, e.g. an integration's recording of a model
        call) runs, in the order queued, before the session's next engine call (write or
        read) in this process, on :meth:`flush`, on :meth:`close` and when the interpreter
        exits. What several queued works write is stored in one commit once they ran (when
        that commit fails, it waits for the session's next one). A failing ``work`` is logged and
        does not stop the others. Lets a framework hook record without blocking (no engine
        call, no I/O); a crash loses what was queued and not yet stored."""
        if not session_id:
            raise ValueError("session_id must be a non-empty string")
        self._deferred.add(session_id, work)
        note_pending(self)

    async def _write_deferred(self, session_id: str) -> None:
        """An integration's background write-behind: the deferred records of ``session_id``,
        once the loop's other engine calls are done; unlike :meth:`flush`, not what waits
        for the session's next commit (a prepared input waits for its model call's record)."""
        await idle_turn()
        async with engine_turn():  # one turn for the records and the commit that stores them
            await self._run_deferred(session_id)

    async def flush(self, session_id: str | None = None) -> None:
        """Run the deferred records of ``session_id`` (default: of every session) now, and
        commit the turn records still waiting for their session's next commit. Without a
        ``session_id`` it also waits for the block summaries asked for so far
        (``SummaryConfig.blocks``)."""
        if session_id is None:
            await self._block_summaries_settled()
        if session_id is not None:
            sessions = [session_id]
        else:
            sessions = list(dict.fromkeys([*self._deferred.sessions(), *list(self._carried)]))
        for sid in sessions:
            await self._drain(sid)

    # -- plumbing ---------------------------------------------------------------------------

    # -- host state: instruction, notebook, tasks --------------------------------------------

    async def set_system_instruction(
        self, session_id: str, text: str, runtime_config: RuntimeConfig | None = None
    ) -> PutResult:
        """Set the session's system instruction (the same text again writes nothing)."""
        cfg = self._cfg(runtime_config)

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
            redacted, rules = self._redact_text(text, cfg, call)
            stored = entry.state.set_system_instruction(redacted)
            self._note_redaction(call, f"msg:{stored.message_id}", rules, 1)
            return await self._persist(entry, call)

        return await self._write(session_id, op)

    async def update_notebook(
        self, session_id: str, content: str, runtime_config: RuntimeConfig | None = None
    ) -> PutResult:
        """Replace the session's memory notebook (rendered as a high-priority memory block)."""
        cfg = self._cfg(runtime_config)

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
            entry.state.update_notebook(self._redact_text(content, cfg, call)[0])
            return await self._persist(entry, call)

        return await self._write(session_id, op)

    async def put_context_block(self, session_id: str, block: ContextBlock) -> PutResult:
        """Insert or replace a host context block; its ``refs`` render the cited evidence
        (narrowed by their selectors) fenced with provenance."""

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
            entry.state.put_context_block(block)
            return await self._persist(entry, call)

        return await self._write(session_id, op)

    async def upsert_tasks(self, session_id: str, tasks: Sequence[Task]) -> PutResult:
        """Insert or replace tasks of the session's task list (rendered as a state block)."""

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
            entry.state.upsert_tasks(tasks)
            return await self._persist(entry, call)

        return await self._write(session_id, op)

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

        async def op(entry: SessionEntry, call: WriteLog) -> PrepareResult:
            if not (message.message_id and message.message_id in entry.message_ids):
                self._begin_run(entry.state)
                self._write_user(entry, message, cfg, call)
            return await self._prepare(entry, cfg, call, "turn", None)

        # a message without an id of its own cannot repeat an older one: the call can work
        # on the session's newest records
        return await self._write(session_id, op, tail=message.message_id is None)

    async def prepare_call(
        self,
        session_id: str,
        pending_messages: Sequence[Message],
        runtime_config: RuntimeConfig | None = None,
        tool_schemas: list[dict[str, Any]] | None = None,
        *,
        defer_commit: bool = False,
        rewind: bool = False,
    ) -> PrepareResult:
        """Before EVERY model call (tool loops included): record the framework's pending
        messages that are new, keep the current run's in-flight tool chain whole, count
        ``tool_schemas`` against the budget, and assemble.

        ``rewind``: ``pending_messages`` is the app's whole conversation as it stands (a chat
        app's history, a graph's state): when it went back to an earlier point of the
        session's conversation — it asks its last question again without the answer it got
        (regenerate), replaces a message with an edited one and drops what followed, resumes
        from an earlier state — the session's turns after that point are withdrawn: no
        longer sent (they stay stored; each report accounts for them as removed by the app)
        and no longer matched against what the app passes. Only for a conversation one app
        flow owns: several agents or concurrent requests that each pass their own part of a
        shared session must not set it.

        ``defer_commit``: store what the call records with the session's next commit (the
        recording of this model call's outcome, typically: one commit per model call, not
        two) rather than now. Until then it is held by this process: every engine call sees
        it (reads commit it first), other processes do not, and a process killed before that
        commit loses it; :meth:`flush`, :meth:`close` and a normal interpreter exit commit
        it."""
        cfg = self._cfg(runtime_config)

        async def op(entry: SessionEntry, call: WriteLog) -> PrepareResult:
            misaligned = False  # the history does not end with the newest records read
            try:
                tail_start = await self._tail_start(entry, pending_messages, cfg)
            except TailTooShort as short:
                if not (rewind and short.whole):
                    raise
                tail_start, misaligned = None, True  # going back to a point they hold?
            if rewind and (taken_back := self._rewound_to(entry, pending_messages, cfg)):
                if self._reads_newest(entry):
                    raise ReadNewest()
                if not entry.holds_going_back(taken_back):
                    raise TailTooShort(whole=True)
                entry.state.withdraw_turns(
                    taken_back,
                    held_from=entry.unread.messages,
                    kept_evidences=lambda first: self._still_quoted(
                        entry, pending_messages, cfg, first
                    ),
                )
                entry.match_after_clear()
                entry.indexes.clear()
                tail_start = await self._tail_start(entry, pending_messages, cfg)
            elif misaligned:
                raise TailTooShort(whole=True)
            self._record_pending(entry, pending_messages, cfg, call, tail_start)
            await checkpoint()
            own = self._own_run(entry, pending_messages, cfg)
            if entry.partial and own[0] is None and own[1]:
                raise TailTooShort()  # the run's question is older than what the entry holds
            return await self._prepare(
                entry, cfg, call, "call", tool_schemas, own, defer=defer_commit
            )

        # a framework passes its whole history: a session not read yet is read from its
        # newest records when they line up with the end of that history (see _tail_start)
        return await self._write(session_id, op, tail=True)

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
        if refs is not None:
            assistant_message = assistant_message.model_copy(update={"refs": refs})

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
            if not await self._write_reply(entry, assistant_message, cfg, call):
                return PutResult(success=True, version=entry.version)
            return await self._persist(entry, call)

        # a reply without tool calls can work on the session's newest records (its own id,
        # if any, is looked up in the store); the ids of tool calls need the whole session
        return await self._write(session_id, op, tail=not assistant_message.tool_calls)

    async def record_messages(
        self,
        session_id: str,
        messages: Sequence[Message],
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        """Record turns of the conversation that no model call carried: a chat engine's
        question and the answer it made with calls of their own (a query engine's), which
        hold neither. User and assistant messages without tool calls, stored in order as
        new ones (a message whose ``message_id`` is stored already is skipped), redacted
        like every write; each user message starts a run that its answer completes. Nothing
        is assembled and no turn record is written: no input was prepared."""
        for message in messages:
            if message.role not in (Role.USER, Role.ASSISTANT) or message.tool_calls:
                raise InvariantViolationError(
                    "record_messages takes user and assistant messages without tool calls, "
                    f"got a {message.role.value} message"
                    + (" with tool calls" if message.tool_calls else "")
                )
        cfg = self._cfg(runtime_config)

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
            wrote = False
            for message in messages:
                if message.role is Role.ASSISTANT:
                    self._transition(entry.state, RunStatus.MODEL_RUNNING)
                    wrote = await self._write_reply(entry, message, cfg, call) or wrote
                elif not (message.message_id and message.message_id in entry.message_ids):
                    self._begin_run(entry.state)
                    self._write_user(entry, message, cfg, call)
                    wrote = True
            if not wrote:
                return PutResult(success=True, version=entry.version)
            return await self._persist(entry, call)

        # messages without ids of their own cannot repeat older ones: the newest records do
        return await self._write(session_id, op, tail=all(m.message_id is None for m in messages))

    async def cut_history(
        self,
        session_id: str,
        removed: Sequence[Message],
        *,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        """The app removed the oldest part of its conversation history (``removed``: those
        messages, a prefix of the history it passes; it typically keeps what matters of them
        in a summary of its own prompt): from now on the session's history up to and
        including the newest stored message that is one of ``removed`` is no longer sent, and
        nothing is sent in its place. A message is one of them by its ``message_id`` when the
        session stores it under that id, else by role, text (redacted as it is stored) and
        tool-call ids, as :meth:`prepare_call` recognises a message it was passed before.

        The cut never reaches the session's newest user message nor anything after it (the
        current run, its tool calls in flight), and never splits a tool call from its
        results: it ends before them instead (a ``Degraded`` event with reason
        ``history_cut_shortened`` says so). A cut that matches no stored message does
        nothing, and a cut never moves backwards (one that ends before the session's current
        cut does nothing). The messages stay stored (reports, replay and exports keep them);
        each turn's report accounts for them in one decision, ``"removed by the app"``. A
        rolling summary the engine makes later (``SummaryConfig``) summarizes only messages
        after the cut. One atomic write; returns the session's version (unchanged when
        nothing was cut)."""
        cfg = self._cfg(runtime_config)

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
            index = entry.index(cfg.model_hint, cfg.render.fence_tool_results)
            target = Removed.of(entry, removed, lambda text: self._stored_text(text, cfg))
            cut, notes = cut_point(entry, index, target)
            call.degradations.extend(notes)
            if cut is None or entry.state.cut_history(cut, held_from=entry.unread.messages) is None:
                await self._emit_degradations(session_id, call)
                return PutResult(success=True, version=entry.version)
            return await self._persist(entry, call)

        # the removed messages are among the newest ones (an app keeps a few of its latest
        # turns): the session's newest records first, more when none of them matches
        return await self._write(session_id, op, tail=True)

    async def clear_history(self, session_id: str) -> PutResult:
        """The app cleared its conversation history to start the conversation over (a chat
        engine's or an agent's reset, a "new chat"): from now on no message the session
        holds so far is sent, nor any evidence stored so far (the same content ingested
        again is stored anew and sent), and nothing is sent in their place; the next call
        starts from what the app passes then (messages it held before, passed again, are
        new again). As :meth:`cut_history` of every stored message, the current run's
        included: the messages stay stored (reports, replay and exports keep them), each
        later turn's report accounts for them in one decision, ``"removed by the app"``,
        and a rolling summary the engine makes later summarizes only messages after it. A
        session without messages (or none since the last clear) is left as it is. One atomic
        write on the session's newest records; returns the session's version."""

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
            held, unread = len(entry.doc.session.messages), entry.unread
            cleared = ClearedHistory(
                messages=unread.messages + held, evidences=entry.evidence_total
            )
            if (
                not held
                or entry.state.cut_history(
                    unread.messages + held - 1, held_from=unread.messages, cleared=cleared
                )
                is None
            ):
                return PutResult(success=True, version=entry.version)
            entry.match_after_clear()
            return await self._persist(entry, call)

        return await self._write(session_id, op, tail=True)

    async def end_run(self, session_id: str, error: str, *, cancelled: bool = False) -> PutResult:
        """The app's run in the session ended unfinished outside a model call: a tool's error
        raised out of the agent, the run cancelled. The run in flight ends, ``failed`` with
        ``error`` (``aborted`` when ``cancelled``), so what the app does next (the turn run
        again, another question) is read against the conversation as it stood, as after a
        model call that failed (:meth:`record_model_call` with an error usage). A session
        with no run in flight is left as it is; nothing stored is removed. One write on the
        session's newest records; returns the session's version."""
        if not error:
            raise ValueError("end_run needs the error the run ended with")
        status = RunStatus.ABORTED if cancelled else RunStatus.FAILED

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
            if entry.state.status not in ACTIVE_RUN:
                return PutResult(success=True, version=entry.version)
            self._transition(entry.state, status, error)
            return await self._persist(entry, call)

        return await self._write(session_id, op, tail=True)

    async def commit_assistant_chunk(self, session_id: str, chunk: str, chunk_index: int) -> None:
        """Buffer one streamed chunk (in memory, per session) until the reply is finalized."""
        if chunk_index < 0:
            raise InvariantViolationError("chunk_index must be >= 0")
        async with self._serialized(session_id):
            entry = await self._entry(session_id, tail=True)  # only its chunks are used
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
            entry = await self._entry(session_id, tail=True)
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

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
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

        return await self._write(session_id, op)

    async def record_model_usage(
        self,
        session_id: str,
        model_usage: ModelUsage,
        llm_output_evidence_id: str | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        """Record one model call's usage (idempotent by ``model_usage_id``)."""
        cfg = self._cfg(runtime_config)

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
            if llm_output_evidence_id and llm_output_evidence_id not in entry.doc.evidences:
                raise EvidenceNotFoundError(
                    f"evidence {llm_output_evidence_id!r} is not in session {session_id!r}"
                )
            self._write_usage(entry, model_usage, cfg, call)
            return await self._persist(entry, call)

        return await self._write(session_id, op)

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
        call instead of the three separately. Idempotent like each of them. A process that
        has not read the session reads only its newest records for it, unless the reply
        makes tool calls (their ids are checked against the whole session)."""
        cfg = self._cfg(runtime_config)
        ingestor = self._ingestor(cfg)

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
            if reply is not None:
                await self._write_reply(entry, reply, cfg, call)
            added = None
            if output is not None and output[0]:
                links = EvidenceLinks(model_usage_id=model_usage.model_usage_id)
                _, added = await self._add_evidence(
                    entry, ingestor, output[0], output[1], EvidenceType.LLM_OUTPUT, links
                )
            self._write_usage(entry, model_usage, cfg, call)
            if reply is None and model_usage.status is ModelUsageStatus.ERROR:
                # the call failed: its run ends (what the app does next, a retry or another
                # question, is read against the conversation as it stood)
                self._transition(entry.state, RunStatus.FAILED, model_usage.error or "failed")
            result = await self._persist(entry, call)
            if added is not None:
                await self._emit_ingested(session_id, *added)
            return result

        # without tool calls the reply, its output and its usage can be recorded on the
        # session's newest records: the reply's id and the output's deduplication key are
        # looked up in the store, and a usage id stored before is skipped by the store
        tail = reply is None or not reply.tool_calls
        return await self._write(session_id, op, tail=tail)

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
        ingestor = self._ingestor(cfg)

        async def op(entry: SessionEntry, call: WriteLog) -> Evidence:
            evidence, added = await self._add_evidence(
                entry, ingestor, content, source, evidence_type, links, metadata, options
            )
            if added is not None:
                await self._persist(entry, call)
                await self._emit_ingested(session_id, *added)
            return evidence.model_copy(deep=True)

        # evidence not linked to a tool call can be ingested on the session's newest records
        # (its deduplication key is looked up in the store); a call id needs the whole session
        tail = links is None or not links.tool_call_id
        return await self._write(session_id, op, tail=tail)

    # -- replay -----------------------------------------------------------------------------

    async def replay_turn(
        self, session_id: str, turn_id: str, runtime_config: RuntimeConfig | None = None
    ) -> PrepareResult:
        """Reassemble a past turn from what is stored (the history it saw, its summary and
        tool schemas) under ``runtime_config`` (default: the turn's own config). Writes
        nothing; the same stored turn and config give the same result."""
        await self._drain(session_id)
        record = await self.store.get_turn(session_id, turn_id)
        if record is None:
            raise TurnNotFoundError(session_id, turn_id)
        doc = await self.get_session(session_id)
        cfg = runtime_config or RuntimeConfig.model_validate(
            await turn_config(self.store, session_id, record)
        )
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
            entry.index(cfg.model_hint, cfg.render.fence_tool_results),
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
