"""Writing what the framework and the model produced into the session, redacted first."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any, cast

from ce.core.config import RedactionConfig, RuntimeConfig
from ce.core.engine._held import (
    answers_waiting_call,
    asked_within,
    cited,
    current_turn,
    holds_transcript,
    joined_instruction,
    quoted_documents,
    quoting_evidence,
    renders,
    unchanged_prefix,
)
from ce.core.engine._session import (
    FRAMEWORK_CALL_ID,
    FRAMEWORK_CALL_IDS,
    FRAMEWORK_MESSAGE_ID,
    SessionEntry,
    TailTooShort,
    message_key,
)
from ce.core.errors import InvariantViolationError, RedactionError
from ce.core.pipeline import document_pointer, quotes_document
from ce.core.redaction import RegexRedactor
from ce.core.schema import (
    MESSAGES_BEFORE,
    Message,
    ModelInvocation,
    RedactionRecord,
    Role,
    RunStatus,
    ToolCallRequest,
)
from ce.core.state import AgentState, ModelOutput, ToolResult, can_transition
from ce.core.stores import SessionWriter, SliceStore, Store
from ce.core.tokens import StoredCounts

__all__ = ["ACTIVE_RUN", "UNFINISHED_RUN", "HistoryWriter", "WriteLog"]

_STORED_FORMS_MAX = 50_000

ACTIVE_RUN = (
    RunStatus.PREPARING,
    RunStatus.MODEL_RUNNING,
    RunStatus.TOOL_RUNNING,
    RunStatus.AWAITING_HUMAN,
)

UNFINISHED_RUN = (RunStatus.FAILED, RunStatus.ABORTED)
"""A run that ended without its answer (a model call that failed, an error or cancellation
the app reported): the app may ask its question again."""


class WriteLog:
    """Bookkeeping of one engine call: what goes into its report and events."""

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.new_messages: list[Message] = []
        self.new_evidence_ids: list[str] = []
        self.redactions: list[RedactionRecord] = []
        self.degradations: list[tuple[str, str]] = []
        self.degradations_emitted = 0
        self.errors: list[tuple[str, str]] = []
        self.writer: SessionWriter | None = None  # the session held for this call, if so
        self.prepare = False  # a prepare_turn / prepare_call: its report holds all of the above
        # token counts the call's tokenizer computed, stored with its first new record
        self.counts: StoredCounts = {}

    def restart(self) -> None:
        """Forget what an attempt that stored nothing noted (it is done again)."""
        for notes in (
            self.new_messages,
            self.new_evidence_ids,
            self.redactions,
            self.degradations,
            self.errors,
        ):
            notes.clear()
        self.degradations_emitted = 0
        self.prepare = False


class HistoryWriter:
    """The engine's write side: every text goes through the configured redactor before the
    AgentState (and so the store) sees it."""

    config: RuntimeConfig
    store: Store
    _redactor: RegexRedactor | None
    _redactors: dict[RedactionConfig, RegexRedactor]
    _stored_forms: dict[int, dict[str, tuple[str, tuple[str, ...]]]]

    def redactor_for(self, runtime_config: RuntimeConfig | None = None) -> RegexRedactor | None:
        """The redactor that texts written under ``runtime_config`` (default: the engine's
        config) go through, or ``None`` when that config turns redaction off. Integrations use
        it for what reaches a model without the engine (fail-open)."""
        return self._redactor_for(runtime_config or self.config)

    def _redactor_for(self, cfg: RuntimeConfig) -> RegexRedactor | None:
        if not cfg.redaction.enabled:
            return None
        if self._redactor is not None:
            return self._redactor
        redactor = self._redactors.get(cfg.redaction)
        if redactor is None:
            redactor = RegexRedactor(cfg.redaction.rules, builtin=cfg.redaction.builtin_rules)
            self._redactors[cfg.redaction] = redactor
        return redactor

    def _transition(self, state: AgentState, status: RunStatus, error: str | None = None) -> None:
        if state.status is status:
            return
        if can_transition(state.status, status):
            state.transition(status, error)

    def _begin_run(self, state: AgentState) -> None:
        if state.status in ACTIVE_RUN:
            self._transition(state, RunStatus.ABORTED, "superseded by a new turn")
        if can_transition(state.status, RunStatus.PREPARING):
            state.start_run()

    # -- redaction of what is written -------------------------------------------------------

    def _redact_text(self, text: str, cfg: RuntimeConfig, call: WriteLog) -> tuple[str, list[str]]:
        redactor = self._redactor_for(cfg)
        if redactor is None or not text:
            return text, []
        held = self._stored_forms.get(id(redactor), {}).get(text)
        if held is not None:  # a pending message's text, redacted when it was matched
            return held[0], list(held[1])
        try:
            result = redactor.redact_text(text)
        except RedactionError as exc:
            call.degradations.append(("redaction_failed", str(exc)))
            return text, []
        return result.redacted_text, list(result.applied_rules)

    def _stored_text(self, text: str, cfg: RuntimeConfig) -> str:
        """``text`` as the store holds it (redacted), memoized with the rules that applied:
        a framework passes the same history again on every call, and each text is redacted
        once (a new message's text then is not redacted again when it is written)."""
        redactor = self._redactor_for(cfg)
        if redactor is None or not text:
            return text
        cache = self._stored_forms.setdefault(id(redactor), {})
        held = cache.get(text)
        if held is None:
            try:
                result = redactor.redact_text(text)
            except RedactionError:
                return text  # not memoized: writing it reports the failure
            held = (result.redacted_text, tuple(result.applied_rules))
            if len(cache) >= _STORED_FORMS_MAX:
                cache.clear()
            cache[text] = held
        return held[0]

    def _redact_value(
        self, value: Any, cfg: RuntimeConfig, call: WriteLog
    ) -> tuple[Any, list[str]]:
        redactor = self._redactor_for(cfg)
        if redactor is None:
            return value, []
        try:
            return redactor.redact_value(value)
        except RedactionError as exc:
            call.degradations.append(("redaction_failed", str(exc)))
            return value, []

    def _note_redaction(
        self, call: WriteLog, target: str, rules: Sequence[str], fields: int
    ) -> None:
        if rules:
            call.redactions.append(
                RedactionRecord(
                    evidence_id=target, rules_applied=sorted(set(rules)), fields_redacted=fields
                )
            )

    def _redacted_calls(
        self, calls: Sequence[ToolCallRequest], cfg: RuntimeConfig, call: WriteLog
    ) -> tuple[list[ToolCallRequest], list[str]]:
        out, rules = [], []
        for request in calls:
            raw, raw_rules = self._redact_text(request.raw_arguments, cfg, call)
            args, arg_rules = (
                self._redact_value(request.arguments, cfg, call)
                if request.arguments is not None
                else (None, [])
            )
            rules += raw_rules + arg_rules
            out.append(request.model_copy(update={"raw_arguments": raw, "arguments": args}))
        return out, rules

    # -- writing messages -------------------------------------------------------------------

    def _write_user(
        self, entry: SessionEntry, message: Message, cfg: RuntimeConfig, call: WriteLog
    ) -> None:
        text, rules = self._redact_text(message.content, cfg, call)
        meta, meta_rules = self._redact_value(dict(message.meta), cfg, call)
        stored = entry.state.append_model_input(
            quoted_documents(entry, text),  # a RAG prompt's documents: sent once, as evidence
            author=message.author,
            refs=message.refs,
            lod=message.lod,
            meta=meta,
            message_id=message.message_id,
            parts=message.parts,
            name=message.name,
        )
        self._note_redaction(call, f"msg:{stored.message_id}", rules + meta_rules, 1)
        call.new_messages.append(stored)
        entry.note_written(stored)

    def _write_assistant(
        self,
        entry: SessionEntry,
        message: Message | ModelOutput,
        cfg: RuntimeConfig,
        call: WriteLog,
    ) -> Message:
        if isinstance(message, Message):
            if message.role is not Role.ASSISTANT:
                raise InvariantViolationError(
                    f"an assistant message was expected, got {message.role.value}"
                )
            invocation = message.invocation or ModelInvocation(
                provider=cfg.provider_hint or "unknown", model=cfg.model_hint or "unknown"
            )
            output = ModelOutput(
                text=message.content,
                tool_calls=list(message.tool_calls or []),
                invocation=invocation,
                author=message.author,
                refs=message.refs,
                meta=dict(message.meta),
                message_id=message.message_id,
                name=message.name,
            )
        else:
            output = message
        text, rules = self._redact_text(output.text, cfg, call)
        calls, call_rules = self._redacted_calls(output.tool_calls, cfg, call)
        calls, renamed = self._unique_calls(entry, calls, call)
        meta, meta_rules = self._redact_value(dict(output.meta), cfg, call)
        if renamed:
            meta[FRAMEWORK_CALL_IDS] = renamed
        update: dict[str, Any] = {"text": text, "tool_calls": calls, "meta": meta}
        if output.refs is None and (refs := cited(entry, text)):
            update["refs"] = refs
        stored = entry.state.append_model_output(output.model_copy(update=update))
        self._note_redaction(call, f"msg:{stored.message_id}", rules + call_rules + meta_rules, 1)
        call.new_messages.append(stored)
        entry.note_written(stored)
        return stored

    def _unique_calls(
        self, entry: SessionEntry, calls: list[ToolCallRequest], call: WriteLog
    ) -> tuple[list[ToolCallRequest], dict[str, str]]:
        """``calls`` with every id the session (or an earlier call of the same reply)
        already uses replaced by a unique one (``<id>~2``, ``<id>~3``, ...), and the map of
        the new ids to the framework's: a model may reuse ``call_0`` in every turn."""
        state = entry.state
        taken: set[str] = set()
        renamed: dict[str, str] = {}
        out: list[ToolCallRequest] = []
        for request in calls:
            framework_id = request.tool_call_id
            stored_id = framework_id
            if not stored_id.strip() or state.declares(stored_id) or stored_id in taken:
                base = framework_id.strip() or "call"
                n = 2
                while state.declares(f"{base}~{n}") or f"{base}~{n}" in taken:
                    n += 1
                stored_id = f"{base}~{n}"
                renamed[stored_id] = framework_id
                entry.call_aliases[framework_id] = stored_id
                call.degradations.append(
                    (
                        "tool_call_id_reused",
                        f"tool call id {framework_id!r} is already used in this session; "
                        f"stored as {stored_id!r}",
                    )
                )
                request = request.model_copy(update={"tool_call_id": stored_id})
            taken.add(stored_id)
            out.append(request)
        return out, renamed

    def _write_tool_result(
        self, entry: SessionEntry, message: Message, cfg: RuntimeConfig, call: WriteLog
    ) -> None:
        framework_id = message.tool_call_id or ""
        pending = {c.tool_call_id: c.name for c in entry.state.pending_tool_calls}
        call_id = framework_id
        if call_id not in pending:
            call_id = entry.call_aliases.get(framework_id, "")
        if call_id not in pending:
            call.degradations.append(
                (
                    "orphan_tool_result",
                    f"tool result for unknown or answered call {framework_id!r}",
                )
            )
            return
        text, rules = self._redact_text(message.content, cfg, call)
        meta, meta_rules = self._redact_value(dict(message.meta), cfg, call)
        if call_id != framework_id:
            meta[FRAMEWORK_CALL_ID] = framework_id
        stored = entry.state.append_tool_results(
            [
                ToolResult(
                    tool_call_id=call_id,
                    name=pending[call_id],
                    content=text,
                    meta=meta,
                    message_id=message.message_id,
                    parts=message.parts,
                )
            ]
        )
        self._note_redaction(call, f"msg:{stored[0].message_id}", rules + meta_rules, 1)
        call.new_messages.extend(stored)
        entry.note_written(stored[0])

    def _write_instruction(
        self, entry: SessionEntry, message: Message, cfg: RuntimeConfig, call: WriteLog
    ) -> None:
        if not message.content.strip():
            return
        stored_form = quoting_evidence(entry, self._stored_text(message.content, cfg))
        if stored_form == entry.state.system_instruction:
            return
        text, rules = self._redact_text(message.content, cfg, call)
        stored = entry.state.set_system_instruction(quoting_evidence(entry, text))
        self._note_redaction(call, f"msg:{stored.message_id}", rules, 1)
        call.new_messages.append(stored)
        entry.note_written(stored)

    async def _tail_start(
        self, entry: SessionEntry, pending: Sequence[Message], cfg: RuntimeConfig
    ) -> tuple[int, tuple[int, ...]] | None:
        """For an entry that holds the session's newest messages only (see
        ``ContextEngine._tail_entry``): where its messages start in ``pending`` and the
        positions of the system messages before that (None: the entry holds the whole
        session, or ``pending`` continues the list the previous call matched). The ids of
        the messages after them that the entry has not read are looked up in the store
        (a framework id the session took before is not stored twice).

        A framework passes its whole history on every call: when ``pending`` has as many
        messages (system messages aside) as the session stores before the entry's, then the
        entry's own in order, the older ones are the session's older ones, and only the rest
        is matched against the entry (after a cut of the app's, see
        ``ContextEngine.cut_history``, the app passes the messages after the cut). Anything
        else (a history trimmed, summarised or rewritten by the framework; new messages that
        declare tool calls, whose ids the whole session must be searched for; a tool result
        for a call the entry does not hold waiting) raises :class:`TailTooShort` for the
        whole session."""
        if not entry.partial or unchanged_prefix(entry, pending, cfg)[0]:
            return None
        messages = entry.doc.session.messages
        base = entry.unread.messages
        older = base - entry.unread.system_messages
        summary = entry.doc.session.summary
        removed = summary.removed_by_app if summary is not None else 0
        first = base  # the position of messages[0]
        if removed >= base:
            # the app removed the session's oldest messages from its history (see
            # ContextEngine.cut_history): it passes the ones after them
            messages = messages[removed - base :]
            first, older = removed, 0
        withdrawn = summary.withdrawn if summary is not None else []
        for span in withdrawn:  # turns the app took back: it no longer passes them
            older -= max(0, min(span.to_index, base) - max(span.from_index, removed))
        held = [
            m
            for i, m in enumerate(messages, first)
            if m.role is not Role.SYSTEM and not (withdrawn and entry.withdrawn(i))
        ]
        positions: list[int] = []  # of the non-system messages
        systems: list[int] = []
        for i, m in enumerate(pending):
            (systems if m.role is Role.SYSTEM else positions).append(i)
        if len(positions) < older + len(held):
            raise TailTooShort(whole=True)
        for stored, position in zip(held, positions[older:], strict=False):
            if not self._same_turn(entry, pending[position], stored, cfg):
                raise TailTooShort(whole=True)
        start = positions[older] if older < len(positions) else len(pending)
        before = tuple(systems[: bisect.bisect_left(systems, start)])
        unknown: list[str] = []
        for position in positions[older + len(held) :]:
            message = pending[position]
            if message.tool_calls or (
                message.role is Role.TOOL
                and not answers_waiting_call(entry, message.tool_call_id or "")
            ):
                raise TailTooShort(whole=True)
            if message.message_id and message.message_id not in entry.message_ids:
                unknown.append(message.message_id)
        if unknown:
            store = cast(SliceStore, self.store)  # an entry of newest records: a SliceStore
            entry.note_taken(await store.read_messages(entry.session_id, unknown))
        return start, before

    def _record_pending(
        self,
        entry: SessionEntry,
        pending: Sequence[Message],
        cfg: RuntimeConfig,
        call: WriteLog,
        tail_start: tuple[int, tuple[int, ...]] | None = None,
    ) -> None:
        """Record the pending messages that the session does not hold yet: by framework id
        when they carry one, else by content (a message seen k times is new the k+1-th; the
        closing user message is new unless the session's history ends with it).

        The system messages are the instruction of this call (the assembled input has one
        instruction), joined in order when there are several (an agent's own prompt and one
        the app passes with its messages, say: the model is sent both, as without the
        engine): it becomes the session's instruction whenever it differs from the current
        one, even if the session held it before, so agents that take turns in one session,
        each with its own system prompt, each get their own.

        ``tail_start``: for an entry of the session's newest messages only, where its
        messages start in ``pending`` and the system messages before (see
        :meth:`_tail_start`); the messages before are not matched."""
        known_ids = entry.message_ids
        before = len(entry.doc.session.messages)  # the messages held before this call
        last = len(pending) - 1
        start, seen, held_systems = unchanged_prefix(entry, pending, cfg)
        if not start and tail_start is not None:  # the entry's messages start there
            start, held_systems = tail_start
        systems = [
            *held_systems,
            *(i for i in range(start, len(pending)) if pending[i].role is Role.SYSTEM),
        ]
        system = systems[-1] if systems else None
        instruction = joined_instruction(pending, systems)
        if instruction is not None and system is not None and system < start:
            self._write_instruction(entry, instruction, cfg, call)
        # The message the model is asked to answer now: when the session's history does not
        # already end with it, it is new even if the same text was asked before (a framework
        # that passes only the new question, e.g. a fresh memory on a named session).
        asked = pending[-1] if pending and pending[-1].role is Role.USER else None
        # the last result the framework sends for each tool call id: when that id names a call
        # still waiting for its result, the message is that result, even if the same text
        # answered an earlier call under the same id (servers that reuse ids per turn)
        last_result = {
            pending[i].tool_call_id: i
            for i in range(start, len(pending))
            if pending[i].role is Role.TOOL and not pending[i].message_id
        }
        # the framework's last user message: when it is the session's newest one, a tool
        # call made after it that the session does not hold in that turn is new, even if the
        # same call (same id, same arguments) was made in an earlier turn (a framework that
        # passes only the current turn, and a server that reuses ids)
        turn_user = next(
            (i for i in range(last, start - 1, -1) if pending[i].role is Role.USER), None
        )
        turn: tuple[bool, set[str]] | None = None  # (the session's newest turn?, its calls)

        def call_of_this_turn(position: int, message: Message) -> bool:
            nonlocal turn
            if turn_user is None or position < turn_user or not message.tool_calls:
                return False
            if turn is None:
                held_key, calls = current_turn(entry)
                asked = pending[turn_user]
                turn = (
                    message_key(asked, self._stored_text(asked.content, cfg)) == held_key,
                    calls,
                )
            same, calls = turn
            return same and all(c.tool_call_id not in calls for c in message.tool_calls)

        for position in range(start, len(pending)):
            message = pending[position]
            if position == last:
                memo_systems = tuple(i for i in systems if i < last)
                entry.pending_memo = (list(pending[:last]), dict(seen), memo_systems, cfg)
            if message.role is Role.SYSTEM:
                if position == system and instruction is not None:
                    self._write_instruction(entry, instruction, cfg, call)
                continue
            if message.message_id and message.message_id in known_ids:
                fresh = self._unless_held(entry, message, cfg, call)
                if fresh is None:
                    continue
                message = fresh
            if not message.message_id:
                key = message_key(message, self._stored_text(message.content, cfg))
                seen[key] = seen.get(key, 0) + 1
                if (
                    seen[key] <= entry.key_counts.get(key, 0)
                    and not (message is asked and entry.last_key != key)
                    and not (
                        last_result.get(message.tool_call_id) == position
                        and answers_waiting_call(entry, message.tool_call_id or "")
                    )
                    and not call_of_this_turn(position, message)
                ):
                    continue
                if message.role is Role.USER and self._held_in_another_form(
                    entry,
                    message,
                    key,
                    seen,
                    cfg,
                    asked=message is asked,
                    before=before,
                    answer=pending[position + 1] if position < last else None,
                ):
                    continue
            if message.role is Role.USER:
                media = any(p.type != "text" for p in message.parts or ())
                if not message.content.strip() and not media:
                    continue
                if entry.state.status not in ACTIVE_RUN:
                    self._begin_run(entry.state)
                self._write_user(entry, message, cfg, call)
            elif message.role is Role.ASSISTANT:
                if not message.tool_calls and holds_transcript(entry, message.content):
                    continue  # a finished ReAct run written as one message: stored step by step
                if message.content.strip() or message.tool_calls:
                    self._write_assistant(entry, message, cfg, call)
            else:
                self._write_tool_result(entry, message, cfg, call)

    def _rewound_to(
        self, entry: SessionEntry, pending: Sequence[Message], cfg: RuntimeConfig
    ) -> int | None:
        """Where ``pending``, the app's whole conversation as it stands, went back to in the
        session's conversation (an answer asked for again, a message edited, a conversation
        resumed from an earlier state): the position of the first stored message after that
        point, whose turns the app took back; None when it did not go back.

        The point is the newest message of ``pending`` the session holds, at its newest
        stored place where the message of ``pending`` before it is the session's message
        before it too (or that user message in the form the app keeps of it: see
        :meth:`_same_turn`; an earlier place of the same text when the newest is not one:
        an answer given twice). The app went back when that is not the session's newest
        message, and after it ``pending`` holds nothing (the question asked again: the point
        is a user message) or new messages from a user message on (the edit). Not while a
        run is in flight (another request's turn), nor when the session's next message
        answers a tool call of the point (an exchange stays whole). After a run that ended
        unfinished, its question passed alone again is a going back to it (see
        :meth:`_failed_question`).
        Work proportional to the new messages at the end of ``pending``, and to the messages
        after an earlier place when the newest is not the point."""
        if entry.state.status in ACTIVE_RUN:
            return None
        messages = entry.doc.session.messages
        base = entry.unread.messages
        cleared = entry.cleared()
        newest = None  # the session's newest message the app could still pass
        for i in range(len(messages) - 1, -1, -1):
            if base + i < cleared:
                break
            if messages[i].role is not Role.SYSTEM and not entry.withdrawn(base + i):
                newest = base + i
                break
        if newest is None:
            return None
        asked = [m for m in pending if m.role is not Role.SYSTEM]

        def key(message: Message) -> tuple[Any, ...]:
            return message_key(message, self._stored_text(message.content, cfg))

        j = len(asked) - 1
        while j >= 0 and key(asked[j]) not in entry.key_positions:
            j -= 1
        if j < 1:
            if len(asked) == 1 and j == 0 and entry.state.status in UNFINISHED_RUN:
                return self._failed_question(entry, key(asked[0]), newest)
            return None

        def preceded(point: int) -> bool:  # the app's message before it is the session's
            before = point - base - 1
            while before >= 0 and (
                messages[before].role is Role.SYSTEM or entry.withdrawn(base + before)
            ):
                before -= 1
            return (
                before >= 0
                and base + before >= cleared
                and self._same_turn(entry, asked[j - 1], messages[before], cfg)
            )

        point: int | None = entry.key_positions[key(asked[j])]
        if point is not None and not preceded(point):
            # the same text said earlier too (an answer given twice): the point is where the
            # app's message before it is the session's
            point = self._earlier_place(entry, key(asked[j]), point, cleared, preceded)
        if point is None or point >= newest:
            return None
        after = asked[j + 1] if j + 1 < len(asked) else None
        if after is None and messages[point - base].role not in (Role.USER, Role.TOOL):
            return None  # asked again: a question, or a tool's result (a graph replayed)
        if after is not None and after.role is not Role.USER:
            return None
        following = point - base + 1
        while following < len(messages) and messages[following].role is Role.SYSTEM:
            following += 1
        if following < len(messages) and messages[following].role is Role.TOOL:
            return None
        return point + 1

    def _failed_question(
        self, entry: SessionEntry, wanted: tuple[Any, ...], newest: int
    ) -> int | None:
        """Where the app that passes only its newest question (the engine holds the
        conversation) went back to by asking, alone, the question of the session's run that
        ended unfinished again (a retry): the position after that question, whose turn the
        failed attempt began (its tool call and result); None when ``wanted`` is not that
        question or nothing followed it."""
        point = entry.key_positions.get(wanted)
        if point is None or point >= newest:
            return None
        messages = entry.doc.session.messages
        base = entry.unread.messages
        for i in range(newest, point, -1):
            if messages[i - base].role is Role.USER and not entry.withdrawn(i):
                return None  # a user message after it: not the failed run's question
        return point + 1

    def _earlier_place(
        self,
        entry: SessionEntry,
        wanted: tuple[Any, ...],
        point: int,
        cleared: int,
        fits: Callable[[int], bool],
    ) -> int | None:
        """The newest place before ``point`` (after the latest clear, not taken back) of a
        message whose key is ``wanted`` and where ``fits``; None when there is none among
        the messages the entry holds."""
        messages = entry.doc.session.messages
        base = entry.unread.messages
        for i in range(point - base - 1, max(cleared - base, 0) - 1, -1):
            if (
                message_key(messages[i]) == wanted
                and not entry.withdrawn(base + i)
                and fits(base + i)
            ):
                return base + i
        return None

    def _still_quoted(
        self, entry: SessionEntry, pending: Sequence[Message], cfg: RuntimeConfig, first: int
    ) -> list[str]:
        """The documents retrieved for the session's turns from message ``first`` on (which
        the app took back) that ``pending``, its conversation as it went back, quotes whole
        or points to, or that were ingested again since the newest of those turns (in this
        process): retrieved again for the message that replaced them, they stay sent.
        A document stored again since (the same text, newer) stays sent as that copy, and
        of one text taken back twice only the newest copy is kept. The texts that can quote
        them are the system messages of ``pending`` (a prompt holding the retrieved context)
        and its messages after the point it went back to (the session does not hold them:
        what replaced those turns); the messages before that point came before those
        documents. Work proportional to those documents and messages."""
        texts = [self._stored_text(m.content, cfg) for m in pending if m.role is Role.SYSTEM]
        for message in reversed(pending):
            if message.role is Role.SYSTEM:
                continue
            stored = self._stored_text(message.content, cfg)
            if message_key(message, stored) in entry.key_positions:
                break
            if message.role is Role.USER:
                texts.append(stored)
        end = entry.message_total  # the turns taken back end with the session's messages
        recalled = entry.recalled[1] if entry.recalled[0] == end else []
        sent: set[str] = set()  # the texts of the documents that stay sent, newest first
        kept: list[str] = []
        for evidence in reversed(entry.doc.evidences.values()):
            held = evidence.metadata.get(MESSAGES_BEFORE)
            if not isinstance(held, int) or held < first:
                break  # stored before those turns (or by an engine that did not say when)
            if evidence.links.tool_call_id:
                continue  # a tool's output goes with its call
            content = evidence.content.strip()
            if held >= end or content in sent:  # stored since: this call's own
                sent.add(content)
                continue
            pointer = document_pointer(evidence.evidence_id)
            if evidence.evidence_id in recalled or any(
                pointer in text or quotes_document(text, content) for text in texts
            ):
                kept.append(evidence.evidence_id)
                sent.add(content)
        return kept[::-1]

    def _same_turn(
        self, entry: SessionEntry, message: Message, stored: Message, cfg: RuntimeConfig
    ) -> bool:
        """Whether ``message`` (of a framework's history, at the place of ``stored`` in it)
        is the session's ``stored`` message: the same, or a user message in the form the app
        keeps of it (the retrieved documents it quotes inline where the session holds
        pointers, or its bare question where the session holds the prompt rendered around it;
        see :meth:`_held_in_another_form`)."""
        text = self._stored_text(message.content, cfg)
        if message_key(message, text) == message_key(stored):
            return True
        if message.role is not Role.USER or stored.role is not Role.USER:
            return False
        if message_key(message, quoted_documents(entry, text)) == message_key(stored):
            return True
        return renders(stored, text)

    def _held_in_another_form(
        self,
        entry: SessionEntry,
        message: Message,
        key: tuple[Any, ...],
        seen: dict[tuple[Any, ...], int],
        cfg: RuntimeConfig,
        *,
        asked: bool,
        before: int,
        answer: Message | None = None,
    ) -> bool:
        """Whether the user message ``message`` (new by its text ``key``) is one the session
        holds in another form: with the retrieved documents it quotes replaced by pointers
        (see :func:`~ce.core.pipeline.document_pointer`: the session stores a user message so,
        and the app passes it on later calls as it wrote it; counted as that message in
        ``seen``; the newest message, ``asked``, only when the session's history ends with
        it), or, for a message before the newest, inside the prompt the app rendered around
        it among the ``before`` messages the session held before the call (see
        :func:`asked_within`; a question too short to be looked for so is found in the
        prompt just before ``answer``, the message the app passes after it, when the session
        holds that: see :meth:`_rendered_before`). Such a message is not recorded again: the
        session's form of the turn is what the model gets."""
        text = self._stored_text(message.content, cfg)
        quoted = quoted_documents(entry, text)
        if quoted != text:
            held = message_key(message, quoted)
            if seen.get(held, 0) < entry.key_counts.get(held, 0) and (
                not asked or entry.last_key == held
            ):
                seen[key] -= 1
                seen[held] = seen.get(held, 0) + 1
                return True
        if asked or before <= 0:
            return False
        return asked_within(entry, text, before) or self._rendered_before(
            entry, text, answer, cfg, before
        )

    def _rendered_before(
        self,
        entry: SessionEntry,
        question: str,
        answer: Message | None,
        cfg: RuntimeConfig,
        before: int,
    ) -> bool:
        """Whether the session holds ``answer`` (the message an app's history passes after
        its bare ``question``) among its first ``before`` messages, right after a user
        message that contains ``question``: the prompt the app rendered around it (a short
        question is found so, by its place, where a search of the recent prompts would find
        it in any of them)."""
        question = question.strip()
        if answer is None or answer.role is Role.USER or not question:
            return False
        position = entry.key_positions.get(
            message_key(answer, self._stored_text(answer.content, cfg))
        )
        if position is None or position >= before:
            return False
        messages = entry.doc.session.messages
        i = position - entry.unread.messages - 1
        while i >= 0 and messages[i].role is Role.SYSTEM:
            i -= 1
        return (
            i >= 0
            and messages[i].role is Role.USER
            and renders(messages[i], question, answered=True)
        )

    def _own_run(
        self, entry: SessionEntry, pending: Sequence[Message], cfg: RuntimeConfig
    ) -> tuple[str | None, list[str]]:
        """The run of a call whose pending messages are ``pending`` (recorded already), as
        stored: the id of its question (the newest stored user message with the text of the
        last one the framework passes) and the ids of the tool calls its model made since.
        Other runs may have written to the session meanwhile (concurrent runs on one
        session): this run's in-flight tool chain is kept all the same. ``(None, [])`` when
        no tool call follows that question in ``pending``."""
        calls: list[str] = []
        for position in range(len(pending) - 1, -1, -1):
            message = pending[position]
            if message.role is Role.USER:
                if not calls:
                    return None, []
                text = self._stored_text(message.content, cfg)
                question = entry.user_ids.get(message_key(message, text))
                if question is None:  # stored with the documents it quotes as pointers
                    quoted = message_key(message, quoted_documents(entry, text))
                    question = entry.user_ids.get(quoted)
                return question, calls
            for request in message.tool_calls or ():
                framework_id = request.tool_call_id
                calls.append(entry.call_aliases.get(framework_id, framework_id))
        return None, []

    def _unless_held(
        self, entry: SessionEntry, message: Message, cfg: RuntimeConfig, call: WriteLog
    ) -> Message | None:
        """None when the session holds ``message`` (its framework id, role and text), else
        a copy to store under a fresh id: the framework reused an id the session holds for
        other content. The copy keeps the framework's id in its meta (so it is recognised
        when passed again) and the reuse is reported."""
        message_id = message.message_id or ""
        if entry.holds(message_id, message.role, self._stored_text(message.content, cfg)):
            return None
        if message_id not in entry.removed_ids:  # not a message the app put back after a cut
            call.degradations.append(
                (
                    "duplicate_message_id",
                    f"message id {message_id!r} is already used in this session for other "
                    "content; stored under a new id",
                )
            )
        meta = {**message.meta, FRAMEWORK_MESSAGE_ID: message_id}
        return message.model_copy(update={"message_id": None, "meta": meta})
