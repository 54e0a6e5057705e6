"""AgentState: the per-session aggregate and the only write path into a session document."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, TypeVar

from ce.core.errors import InvariantViolationError
from ce.core.primitives import Clock, IdGenerator, SystemClock, UuidV4Generator
from ce.core.schema import (
    SCHEMA_VERSION,
    Author,
    ContentPart,
    LodSections,
    Message,
    ModelUsage,
    ModelUsageStage,
    ModelUsageStatus,
    ProviderKind,
    Ref,
    Role,
    RunState,
    RunStatus,
    Section,
    Session,
    SessionDocument,
    Summary,
    Task,
    ToolCall,
    ToolCallRequest,
    ToolProvider,
    load_document,
)
from ce.core.state._changes import ChangeBuffer
from ce.core.state._checks import normalize_content, validate_meta
from ce.core.state._host_state import HostStateWriters
from ce.core.state._record_writers import RecordWriters
from ce.core.state._records import ModelOutput, ToolResult
from ce.core.state._runs import check_transition
from ce.core.state._tool_calls import args_digest, normalize_tool_call
from ce.core.stores.base import SessionChanges

__all__ = ["AgentState"]

_R = TypeVar("_R")

_MAX_ID_ATTEMPTS = 10_000


class AgentState(RecordWriters, HostStateWriters):
    """The per-session aggregate over a :class:`~ce.core.schema.SessionDocument`.

    It is the ONLY write path into a session document, and every write is a semantic,
    append-only method: nothing in this API edits or deletes a stored message, tool call or
    usage record (the notebook block, the task list, the summary and the run state are
    current-value records and are replaced). Writers validate everything before they change
    anything, so a write that raises leaves the state exactly as it was. They stamp ``at`` /
    ``called_at`` from the injected clock and give messages without an id one from the
    injected id generator.

    Invariants enforced (violations raise :class:`~ce.core.errors.InvariantViolationError`):

    * model inputs and system instructions are not blank; a model output has text or tool
      calls and carries its invocation (non-empty provider and model);
    * tool call ids are unique in the session; a tool result answers a pending call (declared
      by an assistant message, not answered yet), and each call gets at most one result;
    * message ids are unique (generated ids never repeat an id of the document);
    * metadata keys are snake_case and each value's JSON is at most 2048 bytes;
    * run status changes follow :data:`RUN_TRANSITIONS`
      (:class:`~ce.core.errors.InvalidTransitionError` otherwise).

    Read accessors return copies, so they cannot be used to change the state. Two states are
    equal when their documents are equal; ``AgentState.from_document(state.document)`` equals
    ``state``. Not thread-safe: the engine serializes access per session.
    """

    _doc: SessionDocument
    _clock: Clock
    _ids: IdGenerator
    _changes: ChangeBuffer
    _declared: dict[str, ToolCallRequest]
    _answered: set[str]
    _open: dict[str, ToolCallRequest]
    _used_ids: set[str]
    _recorded_calls: dict[str, ToolCall]
    _live_returns: bool

    def __init__(
        self,
        session_id: str,
        *,
        clock: Clock | None = None,
        id_generator: IdGenerator | None = None,
        live_returns: bool = False,
    ) -> None:
        """A new, empty session ``session_id`` (status ``idle``). With ``live_returns`` the
        writers return the records they stored, not copies of them: for an owner that only
        reads what they return and never hands it on (the engine), which saves a deep copy
        per record written."""
        if not isinstance(session_id, str) or not session_id:
            raise InvariantViolationError("session_id must be a non-empty string")
        doc = SessionDocument(schema_version=SCHEMA_VERSION, session=Session(session_id=session_id))
        self._attach(doc, clock, id_generator)
        self._live_returns = live_returns

    @classmethod
    def from_document(
        cls,
        doc: SessionDocument | Mapping[str, Any],
        *,
        clock: Clock | None = None,
        id_generator: IdGenerator | None = None,
        copy: bool = True,
        live_returns: bool = False,
    ) -> AgentState:
        """Rebuild the state of a stored document (a model, or a dict validated and migrated
        by :func:`~ce.core.schema.load_document`). The document is copied unless ``copy`` is
        False, which hands it over: the caller must not touch it afterwards (the engine does
        this with documents fresh from the store). The result has no pending changes and
        equals the state that wrote the document. ``live_returns``: see :class:`AgentState`."""
        if isinstance(doc, SessionDocument):
            copied = doc.model_copy(deep=True) if copy else doc
        else:
            copied = load_document(dict(doc))
        state = cls.__new__(cls)
        state._attach(copied, clock, id_generator)
        state._live_returns = live_returns
        return state

    def _attach(
        self, doc: SessionDocument, clock: Clock | None, id_generator: IdGenerator | None
    ) -> None:
        self._doc = doc
        self._clock = clock or SystemClock()
        self._ids = id_generator or UuidV4Generator()
        self._changes = ChangeBuffer()
        self._declared = {}
        self._answered = set()
        self._open = {}  # declared calls without a result yet, in declaration order
        self._used_ids = {u.model_usage_id for u in doc.session.model_usage}
        self._recorded_calls = {c.tool_call_id: c for c in doc.session.tool_state.tool_calls}
        self._instruction: Message | None = None  # the newest system message
        for message in doc.session.messages:
            self._index(message)

    def _index(self, message: Message) -> None:
        if message.message_id:
            self._used_ids.add(message.message_id)
        if message.role is Role.SYSTEM:
            self._instruction = message
        for call in message.tool_calls or ():
            if call.tool_call_id not in self._declared:
                self._declared[call.tool_call_id] = self._open[call.tool_call_id] = call
        if message.role is Role.TOOL and message.tool_call_id in self._declared:
            self._answered.add(message.tool_call_id)
            self._open.pop(message.tool_call_id, None)

    # ----------------------------------------------------------------- equality

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AgentState):
            return NotImplemented
        return self._doc == other._doc

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        session = self._doc.session
        return (
            f"AgentState(session_id={session.session_id!r}, messages={len(session.messages)}, "
            f"status={session.run.status.value!r})"
        )

    # ----------------------------------------------------------------- read views

    @property
    def session_id(self) -> str:
        return self._doc.session.session_id

    @property
    def document(self) -> SessionDocument:
        """A deep copy of the session document."""
        return self._doc.model_copy(deep=True)

    def live_view(self) -> SessionDocument:
        """The live document, without copying, for read-only use on hot paths (the engine's
        index). Mutating it bypasses every invariant: use the writers instead."""
        return self._doc

    @property
    def messages(self) -> tuple[Message, ...]:
        """Copies of the history, oldest first."""
        return tuple(m.model_copy(deep=True) for m in self._doc.session.messages)

    @property
    def status(self) -> RunStatus:
        return self._doc.session.run.status

    @property
    def run(self) -> RunState:
        """A copy of the current run (id, status, last error)."""
        return self._doc.session.run.model_copy()

    @property
    def system_instruction(self) -> str | None:
        """The latest system instruction, or None when none was set."""
        message = self._instruction
        return message.content if message else None

    @property
    def pending_tool_calls(self) -> list[ToolCallRequest]:
        """Copies of the declared tool calls that have no result yet, in declaration order."""
        return [call.model_copy(deep=True) for call in self._open.values()]

    def declares(self, tool_call_id: str) -> bool:
        """Whether a message of the session declared a tool call with this id."""
        return tool_call_id in self._declared

    def tool_call_recorded(self, tool_call_id: str) -> bool:
        """Whether the session holds the record of a tool run with this id."""
        return tool_call_id in self._recorded_calls

    def tool_call_answered(self, tool_call_id: str) -> bool:
        """Whether a message of the session declared a tool call with this id and a tool
        message answered it."""
        return tool_call_id in self._declared and tool_call_id not in self._open

    @property
    def notebook(self) -> str:
        """The memory notebook content ('' when never written)."""
        block = self._notebook_block()
        return block.content if block else ""

    @property
    def tasks(self) -> list[Task]:
        """Copies of the task list, in insertion order."""
        return [t.model_copy(deep=True) for t in self._doc.session.task_state.todo_list.tasks]

    @property
    def summary(self) -> Summary | None:
        summary = self._doc.session.summary
        return summary.model_copy(deep=True) if summary else None

    # ----------------------------------------------------------------- history writers

    def append_model_input(
        self,
        content: str | Sequence[Section],
        *,
        author: Author | None = None,
        refs: Sequence[Ref] | None = None,
        lod: LodSections | None = None,
        meta: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        parts: Sequence[ContentPart] | None = None,
        name: str | None = None,
    ) -> Message:
        """Append a user message and return (a copy of) it.

        ``content`` is the Live text or sections; ``lod`` may add Summary/Gist renderings
        (see :meth:`ce.core.schema.LodSections.get`); ``parts`` its images, files and audio
        (see :class:`ce.core.schema.TextPart`); ``name`` the participant name it goes with.
        Blank content without such parts is rejected.
        """
        text, sections = normalize_content(content, lod)
        if not text.strip() and not any(p.type != "text" for p in parts or ()):
            raise InvariantViolationError("a model input needs non-blank content")
        message = Message(
            role=Role.USER,
            content=text,
            author=author.model_copy() if author else None,
            refs=[r.model_copy() for r in refs] if refs is not None else None,
            lod=sections,
            meta=validate_meta(meta),
            message_id=self._check_message_id(message_id),
            parts=list(parts) if parts else None,
            name=name,
        )
        return self._append(message)

    def append_model_output(self, output: ModelOutput) -> Message:
        """Append an assistant message built from ``output`` and return (a copy of) it.

        Rejects an output with neither text nor tool calls, without an invocation (non-empty
        provider and model), or whose tool call ids repeat or were already used in the
        session. Tool calls are stored with ``arguments`` parsed from ``raw_arguments`` when
        the caller left both unset. ``finish_reason`` goes into the message metadata unless
        the output's ``meta`` sets that key. When ``output.usage`` is given, a
        :class:`~ce.core.schema.ModelUsage` record is appended too (stage ``tool_call`` if
        the output calls tools, else ``answer``; status ``error`` when ``output.error``).
        """
        invocation = output.invocation
        if invocation is None or not invocation.provider.strip() or not invocation.model.strip():
            raise InvariantViolationError(
                "a model output must carry its invocation (non-empty provider and model)"
            )
        calls = [normalize_tool_call(call) for call in output.tool_calls]
        seen: set[str] = set()
        for call in calls:
            if call.tool_call_id in seen or call.tool_call_id in self._declared:
                raise InvariantViolationError(
                    f"tool call id {call.tool_call_id!r} is already used in this session"
                )
            seen.add(call.tool_call_id)
        if not output.text.strip() and not calls:
            raise InvariantViolationError("a model output needs text or tool calls")
        meta = dict(output.meta)
        if output.finish_reason is not None:
            meta.setdefault("finish_reason", output.finish_reason)
        message = Message(
            role=Role.ASSISTANT,
            content=output.text,
            author=output.author.model_copy() if output.author else None,
            refs=[r.model_copy() for r in output.refs] if output.refs is not None else None,
            tool_calls=calls or None,
            invocation=invocation.model_copy(),
            meta=validate_meta(meta),
            message_id=self._check_message_id(output.message_id),
            name=output.name,
        )
        stored = self._append(message)
        if output.usage is not None:
            usage = ModelUsage(
                model_usage_id=self._fresh_id(),
                provider=invocation.provider,
                model=invocation.model,
                stage=ModelUsageStage.TOOL_CALL if calls else ModelUsageStage.ANSWER,
                prompt_tokens=output.usage.prompt_tokens,
                completion_tokens=output.usage.completion_tokens,
                total_tokens=output.usage.total_tokens,
                latency_ms=output.latency_ms or 0,
                first_token_latency_ms=output.first_token_latency_ms,
                status=ModelUsageStatus.ERROR if output.error else ModelUsageStatus.SUCCESS,
                error=output.error or "",
            )
            self._doc.session.model_usage.append(usage)
            self._used_ids.add(usage.model_usage_id)
            self._changes.model_usage.append(usage)
        return stored

    def append_tool_results(self, results: Sequence[ToolResult]) -> list[Message]:
        """Append one ``tool`` message and one ``ToolCall`` record per result, in order.

        Each result must answer a pending tool call; a result for an unknown or already
        answered call, or two results for one call, raise and nothing is written. The record
        takes its status and duration from the result and its ``args_digest`` from the
        call's parsed arguments; ``at`` and ``called_at`` are one clock reading.
        """
        if not results:
            raise InvariantViolationError("append_tool_results needs at least one result")
        prepared: list[
            tuple[ToolResult, ToolCallRequest, str, LodSections | None, dict[str, Any]]
        ] = []
        batch_calls: set[str] = set()
        batch_ids: set[str] = set()
        for result in results:
            call_id = result.tool_call_id
            request = self._declared.get(call_id)
            if request is None:
                raise InvariantViolationError(f"no tool call {call_id!r} was declared")
            if call_id in self._answered or call_id in batch_calls:
                raise InvariantViolationError(f"tool call {call_id!r} already has its result")
            if result.name and result.name != request.name:
                raise InvariantViolationError(
                    f"tool call {call_id!r} was declared as {request.name!r}, not {result.name!r}"
                )
            batch_calls.add(call_id)
            text, sections = normalize_content(result.content, result.lod)
            if not text and result.error:
                text = result.error
            meta = validate_meta(result.meta)
            if result.message_id is not None:
                batch_ids.add(self._check_message_id(result.message_id, batch_ids))
            prepared.append((result, request, text, sections, meta))
        stored: list[Message] = []
        for result, request, text, sections, meta in prepared:
            message = Message(
                role=Role.TOOL,
                content=text,
                tool_call_id=request.tool_call_id,
                name=request.name,
                lod=sections,
                meta=meta,
                message_id=(
                    result.message_id
                    if result.message_id is not None
                    else self._fresh_id(batch_ids)
                ),
                parts=result.parts,
            )
            stored.append(self._append(message))
            if request.tool_call_id in self._recorded_calls:
                continue  # the tool run was recorded already (record_tool_call): it wins
            record = ToolCall(
                tool_call_id=request.tool_call_id,
                tool=request.name,
                provider=(
                    result.provider.model_copy()
                    if result.provider
                    else ToolProvider(kind=ProviderKind.OTHER)
                ),
                called_at=stored[-1].at or "",
                args_digest=args_digest(request),
                status=result.status,
                duration_ms=result.duration_ms,
                result_evidence_ids=list(result.result_evidence_ids),
                task_id=result.task_id,
            )
            self._doc.session.tool_state.tool_calls.append(record)
            self._recorded_calls[record.tool_call_id] = record
            self._changes.tool_calls.append(record)
        return stored

    def set_system_instruction(self, text: str) -> Message:
        """Append ``text`` as a system message: the latest one is THE system instruction.

        Blank text is rejected. Setting the instruction it already is writes nothing and
        returns (a copy of) the current instruction message.
        """
        if not text.strip():
            raise InvariantViolationError("a system instruction must not be blank")
        current = self._instruction
        if current is not None and current.content == text:
            return self._returned(current)
        message = Message(role=Role.SYSTEM, content=text, message_id=self._fresh_id())
        return self._append(message)

    def _check_message_id(
        self, message_id: str | None, batch: AbstractSet[str] = frozenset()
    ) -> str:
        if message_id is None:
            return self._fresh_id(batch)
        if not message_id:
            raise InvariantViolationError("a message_id must be a non-empty string")
        if message_id in self._used_ids or message_id in batch:
            raise InvariantViolationError(f"message_id {message_id!r} is already used")
        return message_id

    def _fresh_id(self, batch: AbstractSet[str] = frozenset()) -> str:
        # A generator restarted on a rebuilt state (e.g. a sequential one) may repeat ids the
        # document already holds; stores skip records whose id they have, so never reuse one.
        for _ in range(_MAX_ID_ATTEMPTS):
            candidate = self._ids.generate()
            if candidate not in self._used_ids and candidate not in batch:
                return candidate
        raise InvariantViolationError(
            f"the id generator produced {_MAX_ID_ATTEMPTS} ids in a row that are already used"
        )

    def _append(self, message: Message) -> Message:
        message.at = self._clock.now_iso()
        self._doc.session.messages.append(message)
        self._changes.messages.append(message)
        self._index(message)
        return self._returned(message)

    # ----------------------------------------------------------------- run status

    def start_run(self, run_id: str | None = None) -> RunState:
        """Start a new run (status ``preparing``) from ``idle``, ``completed``, ``failed`` or
        ``aborted``; ``run_id`` defaults to a new id. Clears ``last_error``."""
        check_transition(self.status, RunStatus.PREPARING)
        if run_id is not None and not run_id:
            raise InvariantViolationError("a run_id must be a non-empty string")
        return self._set_run(
            RunState(run_id=run_id or self._fresh_id(), status=RunStatus.PREPARING)
        )

    def transition(self, status: RunStatus, error: str | None = None) -> RunState:
        """Move the current run to ``status`` (see :data:`RUN_TRANSITIONS`), recording
        ``error`` as ``last_error`` when given. ``preparing`` starts a new run, as
        :meth:`start_run` does. Raises :class:`~ce.core.errors.InvalidTransitionError`."""
        target = RunStatus(status)
        check_transition(self.status, target)
        current = self._doc.session.run
        if target is RunStatus.PREPARING:
            run = RunState(run_id=self._fresh_id(), status=target, last_error=error or "")
        else:
            last_error = current.last_error if error is None else error
            run = current.model_copy(update={"status": target, "last_error": last_error})
        return self._set_run(run)

    def _set_run(self, run: RunState) -> RunState:
        self._doc.session.run = run
        self._changes.run = True
        return run.model_copy()

    # ----------------------------------------------------------------- persistence

    def absorb(self, changes: SessionChanges) -> None:
        """Add records another writer has already stored, as
        :meth:`Store.read_since <ce.core.stores.base.Store.read_since>` returns them for this
        state's version: messages, tool calls, usage records and evidences are appended,
        context blocks and tasks replace those with the same id (new ones are appended), and
        ``summary``, ``run`` and ``meta`` replace the current value when given. Nothing is
        validated again and nothing becomes a pending change.

        Raises :class:`InvariantViolationError` when the state has pending changes: records
        written here but not stored yet would end up after the ones stored before them.
        """
        if not self._changes.is_empty():
            raise InvariantViolationError("absorb() needs a state without pending changes")
        doc = self._doc
        session = doc.session
        for message in changes.messages:
            session.messages.append(message)
            self._index(message)
        for call in changes.tool_calls:
            session.tool_state.tool_calls.append(call)
            self._recorded_calls[call.tool_call_id] = call
        for usage in changes.model_usage:
            session.model_usage.append(usage)
            self._used_ids.add(usage.model_usage_id)
        for evidence in changes.evidences:
            doc.evidences[evidence.evidence_id] = evidence
        _replace_by_id(doc.context_blocks, changes.context_blocks, lambda b: b.block_id)
        _replace_by_id(session.task_state.todo_list.tasks, changes.tasks, lambda t: t.task_id)
        if changes.summary is not None:
            session.summary = changes.summary
        if changes.run is not None:
            session.run = changes.run
        if changes.meta is not None:
            doc.meta = changes.meta

    def note_instruction(self, message: Message) -> None:
        """Take ``message`` as the newest system message stored before the records this
        state holds (a state of a session's newest records only), unless it holds a newer
        one. Nothing becomes a pending change."""
        if self._instruction is None:
            self._instruction = message

    def has_pending_records(self) -> bool:
        """Whether anything but the run state was written since the changes were last taken
        (a change set without it would only move the run on)."""
        return self._changes.has_records()

    def forget_run_change(self) -> None:
        """Leave the run state's last change out of the next change set (the state keeps
        it; a later transition marks it changed again)."""
        self._changes.run = False

    def take_changes(self, *, copies: bool = True) -> SessionChanges:
        """Everything written since the previous call, as one change set for
        :meth:`Store.commit <ce.core.stores.base.Store.commit>`; then the buffer is cleared.

        Appended messages, tool calls and usage records come in write order; the notebook
        block and tasks appear once each, in their latest version; ``run`` and ``summary``
        are set only when they changed. The records are copies; with ``copies=False`` they
        are the state's own (for a caller that hands them straight to ``Store.commit``,
        which validates them again into records of its own, and never changes them).
        """
        return self._changes.take(self._doc, copies=copies)


def _replace_by_id(stored: list[_R], new: Sequence[_R], key: Callable[[_R], str]) -> None:
    """Replace the records of ``stored`` whose key a record of ``new`` has; append the rest."""
    if not new:
        return
    position = {key(record): i for i, record in enumerate(stored)}
    for record in new:
        i = position.get(key(record))
        if i is None:
            position[key(record)] = len(stored)
            stored.append(record)
        else:
            stored[i] = record
