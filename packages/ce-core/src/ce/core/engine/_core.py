"""The engine's plumbing under every public call: the session cache, per-session
serialization, the write template with conflict retries, persisting and events, evidence
ingestion."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar, cast

from ce.core._drive import engine_turn, inline, settle, turn_released
from ce.core.config import RuntimeConfig
from ce.core.engine._carry import Carry, attach_counts
from ce.core.engine._deferred import DeferredWrites, draining, note_pending
from ce.core.engine._session import (
    TAIL_EVIDENCES,
    TAIL_MESSAGES,
    ReadNewest,
    SessionEntry,
    SessionLocks,
    TailTooShort,
    remember_stored_counts,
)
from ce.core.engine._turn import Unread
from ce.core.engine._writes import HistoryWriter, WriteLog
from ce.core.errors import VersionConflictError
from ce.core.events import Event, EventBus, InMemoryEventBus
from ce.core.pipeline import EvidenceIngestor, IngestOptions, Summarizer
from ce.core.primitives import Clock, Hasher, IdGenerator
from ce.core.schema import (
    MESSAGES_BEFORE,
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    Message,
    ModelUsage,
    PutResult,
    Role,
    RunStatus,
    TurnRecord,
)
from ce.core.state import AgentState, ModelOutput
from ce.core.stores import SessionChanges, SessionWriter, SliceStore, Store, WriterStore
from ce.core.stores.base import OwnedChanges
from ce.core.tokens import TokenEstimator, collecting_counts

__all__ = ["EngineCore"]

_T = TypeVar("_T")

logger = logging.getLogger("ce.core.engine")

CONTENDED_SECONDS = 2.0
"""How long after a refused commit an engine's writes to that session hold it from the start
(on a store that can hold a session), rather than try optimistically first."""


class EngineCore(HistoryWriter):
    """What every engine call stands on (the attributes :class:`ContextEngine` sets up)."""

    conflict_retries: int
    store: Store
    config: RuntimeConfig
    events: EventBus
    clock: Clock
    ids: IdGenerator
    hasher: Hasher
    estimator: TokenEstimator
    _owns_store: bool
    _tokenizer_notes: list[tuple[str, str]]
    _summarizer: Summarizer | None
    _entries: OrderedDict[str, SessionEntry]
    _entries_lock: threading.Lock  # blocking calls run on many threads at once
    _max_cached: int
    _locks: SessionLocks
    _deferred: DeferredWrites
    _carried: dict[str, Carry]  # what waits for its session's next commit
    _contention: dict[str, float]  # session -> until when its writes hold it (monotonic)
    _tails: bool  # the store reads a session's newest records (a SliceStore)
    # session -> how many newest messages and evidences to read when it is not cached (None:
    # all), for a session whose newest records were not enough for a call
    _tail_sizes: dict[str, tuple[int, int] | None]

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

    def _tool_call_names(self, session_id: str, framework_id: str) -> tuple[str | None, set[str]]:
        """:meth:`SessionEntry.tool_call_names` of the session as this process holds it (no
        store read: ``(None, set())`` when it holds none)."""
        entry = self._entries.get(session_id)
        return entry.tool_call_names(framework_id) if entry is not None else (None, set())

    def _touch(self, session_id: str) -> None:
        """Mark the cached entry as the most recently used (it may have been evicted)."""
        with self._entries_lock:
            if session_id in self._entries:
                self._entries.move_to_end(session_id)

    async def _entry(
        self, session_id: str, writer: SessionWriter | None = None, *, tail: bool = False
    ) -> SessionEntry:
        """The cached entry of the session, brought up to the stored version: a stale entry
        absorbs only what other writers stored since (when the store can read that), so a
        turn costs what is new, not the whole history. Read through ``writer`` when the
        session is held. With ``tail`` (a call that can work on the session's newest records)
        an entry not cached yet holds only those (see :meth:`_tail_entry`); without it, the
        whole session."""
        entry = self._entries.get(session_id)
        if entry is not None and entry.partial and not tail:
            # the call needs every record: read the session again, whole
            self._entries.pop(session_id, None)
            entry = None
        if entry is None and tail and writer is None and self._tails:
            sizes = self._tail_sizes.get(session_id, (TAIL_MESSAGES, TAIL_EVIDENCES))
            if sizes is not None:
                return await self._tail_entry(session_id, *sizes)
        if entry is None:
            update = await (writer.read_since() if writer else self.store.read_since(session_id))
        else:
            update = await (
                writer.read_since(entry.version, entry.epoch)
                if writer
                else self.store.read_since(session_id, entry.version, entry.epoch)
            )
            current = entry.version == 0 if update is None else not update.complete
            if current:
                if update is not None and update.version != entry.version:
                    entry.catch_up(update)
                self._touch(session_id)
                return entry
        state = AgentState(session_id, clock=self.clock, id_generator=self.ids, live_returns=True)
        version, epoch = 0, ""
        if update is not None:
            remember_stored_counts(update.changes)
            state.absorb(update.changes)
            version, epoch = update.version, update.epoch
        entry = SessionEntry(session_id, state, version, self._estimator_for, epoch)
        return await self._cache(entry)

    async def _cache(self, entry: SessionEntry) -> SessionEntry:
        session_id = entry.session_id
        carry = self._carried.get(session_id)
        if carry is not None and carry.records:
            carry.taken_in(entry)  # written here, not stored yet: this process sees them
        with self._entries_lock:
            self._entries[session_id] = entry
            self._entries.move_to_end(session_id)
            while len(self._entries) > self._max_cached:
                self._entries.popitem(last=False)
        await self._emit("SessionLoaded", session_id, None, version=entry.version)
        return entry

    async def _tail_entry(self, session_id: str, messages: int, evidences: int) -> SessionEntry:
        """An entry of the session's newest ``messages`` messages and ``evidences``
        evidences (with what goes with them: see :class:`~ce.core.stores.SliceStore`), for a
        call that can work on those: a process that has not seen the session reads what one
        turn can keep, not the whole history. A call that finds it could keep older records
        raises :class:`TailTooShort` before it stores anything, and is done again on twice
        as many (:meth:`_attempt`)."""
        store = self.store
        assert isinstance(store, SliceStore)
        part = await store.read_tail(session_id, messages=messages, evidences=evidences)
        state = AgentState(session_id, clock=self.clock, id_generator=self.ids, live_returns=True)
        if part is None:
            return await self._cache(SessionEntry(session_id, state, 0, self._estimator_for))
        remember_stored_counts(part.changes)
        state.absorb(part.changes)
        if part.instruction is not None:
            state.note_instruction(part.instruction)
        unread = Unread(
            part.older_messages,
            part.older_evidences,
            tuple(part.fact_sources),
            part.older_system,
        )
        entry = SessionEntry(
            session_id,
            state,
            part.version,
            self._estimator_for,
            part.epoch,
            unread=unread,
            instruction=part.instruction,
        )
        return await self._cache(entry)

    def _serialized(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """The session's lock, for the body of an ``async with``."""
        if not session_id:
            raise ValueError("session_id must be a non-empty string")
        return self._locks.hold(session_id)

    async def _write(
        self,
        session_id: str,
        op: Callable[[SessionEntry, WriteLog], Awaitable[_T]],
        *,
        tail: bool = False,
    ) -> _T:
        """The template of every engine call that writes: the session's deferred records
        first, then ``op`` on the session's entry with a fresh :class:`WriteLog`, serialized
        per session, redone on version conflicts (see :meth:`_attempt`). ``tail``: ``op``
        can work on the session's newest records (see :meth:`_tail_entry`)."""
        # one turn of the loop for the call and the records it runs first: it does not go
        # back in line between them (it gives the turn up only while it waits)
        async with engine_turn():
            await self._run_deferred(session_id)
            return await self._write_now(session_id, op, tail)

    async def _write_now(
        self,
        session_id: str,
        op: Callable[[SessionEntry, WriteLog], Awaitable[_T]],
        tail: bool = False,
        turn_id: str | None = None,
    ) -> _T:
        call = WriteLog(turn_id or self.ids.generate())
        run = _Recalling(op, call)
        async with self._serialized(session_id):
            while True:
                try:
                    return await self._attempt(session_id, call, run, tail)
                except TailTooShort as short:
                    self._entries.pop(session_id, None)
                    self._grow_tail(session_id, short.whole)
                    call.restart()
                except ReadNewest:
                    self._entries.pop(session_id, None)
                    call.restart()

    async def _run_deferred(self, session_id: str) -> None:
        """Run the session's deferred records and store what they wrote in one commit: when
        several are queued, each record's write leaves its changes for the session's next
        commit (see :meth:`_persist`), and this one, right after them, takes them all (a
        hook's model call, task updates and tool results: one commit, not one each)."""
        if not await self._deferred.run(session_id):
            return
        carry = self._carried.get(session_id)
        if carry is None or not carry.records:
            return

        async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
            return await self._persist(entry, call)

        try:  # under the turn id of the last record it stores: no id of its own
            await self._write_now(session_id, op, turn_id=carry.turn_id)
        except Exception:  # as a deferred record's own failure: logged, the call goes on
            # what it carries stays for the session's next commit (or a flush)
            logger.exception("storing the deferred records of session %r failed", session_id)

    def _reads_newest(self, entry: SessionEntry) -> bool:
        """Whether a call that rebuilds what the engine derived from the session (going back)
        costs less on the session's newest records than on ``entry``, which holds all of a
        long session: the store reads newest records, and no call of the session needed the
        whole of it."""
        return (
            self._tails
            and not entry.partial
            and len(entry.doc.session.messages) > 16 * TAIL_MESSAGES
            and self._tail_sizes.get(entry.session_id, ()) is not None
        )

    def _grow_tail(self, session_id: str, whole: bool) -> None:
        """Read twice as much of the session next time (``whole``: all of it)."""
        messages, evidences = self._tail_sizes.get(session_id) or (TAIL_MESSAGES, TAIL_EVIDENCES)
        if len(self._tail_sizes) >= 4096:
            self._tail_sizes.clear()
        self._tail_sizes[session_id] = None if whole else (2 * messages, max(2 * evidences, 1))

    async def _attempt(
        self,
        session_id: str,
        call: WriteLog,
        op: Callable[[SessionEntry], Awaitable[_T]],
        tail: bool = False,
    ) -> _T:
        """Run ``op`` on the session; on a version conflict read the session again and redo
        it: holding the session when the store can (then the redo is not refused), else up
        to ``conflict_retries`` times (see the class docstring). What the call tokenizes, in
        any attempt, is stored with its first new record (see :func:`_attach_counts`)."""
        with collecting_counts(call.counts):
            return await self._attempts(session_id, call, op, tail)

    async def _attempts(
        self,
        session_id: str,
        call: WriteLog,
        op: Callable[[SessionEntry], Awaitable[_T]],
        tail: bool,
    ) -> _T:
        store = self.store
        if getattr(store, "prefers_holding", False):  # every write holds: nothing to track
            return await self._attempt_held(
                cast(WriterStore, store), session_id, call, op, tail, track=False
            )
        # only a store that holds sessions ever marks one contended: the protocol check
        # (slow) runs only then, not on every write
        if self._contention and self._contended(session_id) and isinstance(store, WriterStore):
            return await self._attempt_held(store, session_id, call, op, tail)
        retry = 0
        while True:
            entry = await self._entry(session_id, tail=tail)
            try:
                async with engine_turn():  # the loop's turn for the CPU part (see _drive)
                    return await op(entry)
            except VersionConflictError as exc:
                await self._refused(session_id, call, exc)
                if isinstance(store, WriterStore):
                    self._contention[session_id] = time.monotonic() + CONTENDED_SECONDS
                    return await self._attempt_held(store, session_id, call, op, tail)
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

    async def _refused(self, session_id: str, call: WriteLog, exc: VersionConflictError) -> None:
        """Note a refused commit: the cached state holds the refused writes, so the session
        is read afresh; the call's report and an ``Error`` event say so."""
        self._entries.pop(session_id, None)
        call.errors.append(("version_conflict", str(exc)))
        await self._emit(
            "Error", session_id, call.turn_id, reason="version_conflict", detail=str(exc)
        )

    def _contended(self, session_id: str) -> bool:
        """Whether another process wrote the session under this engine's feet less than
        :data:`CONTENDED_SECONDS` ago: then its writes hold the session from the start
        rather than meet a refused commit (and a full read) again."""
        until = self._contention.get(session_id)
        if until is None:
            return False
        if until > time.monotonic():
            return True
        self._contention.pop(session_id, None)
        return False

    async def _attempt_held(
        self,
        store: WriterStore,
        session_id: str,
        call: WriteLog,
        op: Callable[[SessionEntry], Awaitable[_T]],
        tail: bool = False,
        *,
        track: bool = True,
    ) -> _T:
        """Run ``op`` holding the session in the store, from the read to the commit: no
        other writer can store anything in between, so its commit is not refused. A session
        not cached is read before it is held, so holding it costs only a catch-up. When that
        catch-up finds another writer's records, the session stays contended for
        :data:`CONTENDED_SECONDS` more: writers that keep meeting each other keep holding it
        rather than go back to meeting refused commits (and whole reads); ``track`` False
        (a store whose every write holds) marks nothing."""
        retry = 0
        while True:
            cached = self._entries.get(session_id)
            if cached is None or (cached.partial and not tail):
                cached = await self._entry(session_id, tail=tail)
            seen = cached.version
            async with store.writer(session_id) as writer:
                call.writer = writer
                try:
                    entry = await self._entry(session_id, writer, tail=tail)
                    if track and entry.version != seen:
                        self._contention[session_id] = time.monotonic() + CONTENDED_SECONDS
                    async with engine_turn():
                        return await op(entry)
                except VersionConflictError as exc:
                    # a writer that does not hold sessions (a process of an older ce-core)
                    # wrote in between: read the session afresh and hold it again
                    await self._refused(session_id, call, exc)
                    retry += 1
                    if retry > self.conflict_retries:
                        raise
                except BaseException:
                    self._entries.pop(session_id, None)
                    raise
                finally:
                    call.writer = None

    async def _persist(
        self, entry: SessionEntry, call: WriteLog, turn: TurnRecord | None = None
    ) -> PutResult:
        session_id = entry.session_id
        if self._deferred.coalescing(session_id):  # committed once the deferred records ran
            return await self._carry(entry, call, turn)
        # the store makes the records its own (copies or JSON): no copies here
        changes: SessionChanges = entry.state.take_changes(copies=False)
        if turn is not None:
            changes.turns.append(turn)
        carry = self._carried.pop(session_id, None)
        if carry is not None:
            changes = carry.changes.merge(changes)
        attach_counts(changes, call.counts)
        changes = OwnedChanges.of(changes)  # made by the schema's constructors
        try:
            async with turn_released():  # a store may wait on I/O: not in the loop's turn
                result = await (
                    call.writer.commit(changes)
                    if call.writer is not None
                    else self.store.commit(session_id, changes, expected_version=entry.version)
                )
        except BaseException:
            if carry is not None:  # not stored: the session's next commit takes it (or a flush)
                self._carried[session_id] = carry
            raise
        if carry is not None and carry.records and not carry.holds_order(entry):
            # stored after what the entry holds behind the carried records: read it again
            with self._entries_lock:
                if self._entries.get(session_id) is entry:
                    del self._entries[session_id]
        entry.version = result.version
        if result.epoch is not None:
            entry.epoch = result.epoch
        await self._emit_degradations(session_id, call)
        appended = [
            *(carry.announce if carry is not None else ()),
            *((call.turn_id, m) for m in call.new_messages),
        ]
        for turn_id, message in appended:
            await self._emit(
                "MessageAppended",
                session_id,
                turn_id,
                message_id=message.message_id,
                role=message.role.value,
            )
        await self._emit("Persisted", session_id, call.turn_id, version=result.version)
        return result

    async def _carry(
        self,
        entry: SessionEntry,
        call: WriteLog,
        turn: TurnRecord | None,
        changes: SessionChanges | None = None,
    ) -> PutResult:
        """Leave ``changes`` (default: what the call wrote) for the session's next commit
        (for the records a ``prepare_call`` deferred, the recording of its model call's
        outcome; for deferred records, the commit :meth:`_run_deferred` makes once they
        ran)."""
        if changes is None:
            changes = entry.state.take_changes(copies=False)
        attach_counts(changes, call.counts)  # stored with them by the commit that takes them
        if turn is not None:
            changes.turns.append(turn)
        if not changes.is_empty():
            self._carried.setdefault(entry.session_id, Carry()).add(entry, changes, call)
            note_pending(self)  # type: ignore[arg-type]
        await self._emit_degradations(entry.session_id, call)
        return PutResult(success=True, version=entry.version, epoch=entry.epoch or None)

    async def _persist_or_carry(
        self, entry: SessionEntry, call: WriteLog, turn: TurnRecord | None, defer: bool = False
    ) -> int:
        """Commit what the call wrote, with its turn record; the session's version after.

        A call that wrote nothing of the session itself (only its turn record and the run
        moving on, e.g. a model call whose input was all stored) commits nothing now: its
        turn record rides with the session's next commit (the recording of the model's
        reply, typically), or is written by :meth:`_drain` before any read of the session's
        turns, on ``flush()``, ``close()`` and at exit. With ``defer`` so does everything
        the call wrote (see ``prepare_call``), unless an earlier call's records still wait
        (then all are committed now). One commit per model call, not two."""
        carry = self._carried.get(entry.session_id)
        if (carry is not None and carry.records) or (
            not defer and entry.state.has_pending_records()
        ):  # records of at most one call wait for a commit
            return (await self._persist(entry, call, turn)).version
        if defer:
            changes = entry.state.take_changes(copies=False)
        else:
            entry.state.forget_run_change()
            changes = SessionChanges()
        return (await self._carry(entry, call, turn, changes)).version

    async def _drain(self, session_id: str) -> None:
        """Run the session's deferred records (and wait for those another flow is running)
        and commit its carried turn records: a read after it sees every write made so far."""
        await self._deferred.run(session_id)
        await self._locks.settle(session_id)
        if session_id in self._carried and not draining():

            async def op(entry: SessionEntry, call: WriteLog) -> PutResult:
                return await self._persist(entry, call)

            await self._write(session_id, op)

    async def _emit_degradations(self, session_id: str, call: WriteLog) -> None:
        # ``prepare``: the degradation is in that prepared call's report too
        extra = {"prepare": True} if call.prepare else {}
        for reason, detail in call.degradations[call.degradations_emitted :]:
            await self._emit(
                "Degraded", session_id, call.turn_id, reason=reason, detail=detail, **extra
            )
        call.degradations_emitted = len(call.degradations)

    async def _write_reply(
        self, entry: SessionEntry, reply: Message | ModelOutput, cfg: RuntimeConfig, call: WriteLog
    ) -> bool:
        """Add the model's reply and move the run on (tools running, or completed); False
        when a reply with its ``message_id`` is stored already (nothing written). On an
        entry of the session's newest records, an id it has not read is looked up in the
        store."""
        if entry.partial and reply.message_id and reply.message_id not in entry.message_ids:
            store = cast(SliceStore, self.store)  # an entry of newest records: a SliceStore
            entry.note_taken(await store.read_messages(entry.session_id, [reply.message_id]))
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
        # a copy with its own (redacted) params: the state need not copy it again
        entry.state.record_model_usage(usage.model_copy(update={"params": params}), owned=True)

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
        stored before (that stored evidence is returned). The evidence returned is the
        state's own record: copy it before handing it out."""
        if links is not None and links.tool_call_id:
            stored_id = entry.stored_call_id(links.tool_call_id)
            if stored_id != links.tool_call_id:
                links = links.model_copy(update={"tool_call_id": stored_id})
        prepared = ingestor.prepare(content, source, evidence_type, links, metadata, options)
        # the turn it comes with: withdrawn with it should the app go back before it
        prepared.evidence.metadata[MESSAGES_BEFORE] = entry.message_total
        if prepared.original is not None:
            prepared.original.metadata[MESSAGES_BEFORE] = entry.message_total
        for reason, detail in prepared.degradations:
            await self._emit("Degraded", entry.session_id, None, reason=reason, detail=detail)
        if prepared.dedup_key is not None:
            # an evidence the app cleared with its history (see clear_history), or that came
            # with turns it took back, is not sent again: the same content ingested after
            # the clear or the going back is stored anew
            summary = entry.doc.session.summary
            removed = summary.cleared.evidences if summary and summary.cleared else 0
            cleared = removed - entry.unread.evidences  # of the evidences the entry holds
            existing = entry.dedup.get(prepared.dedup_key)
            if existing is not None and existing in entry.doc.evidences:
                held = entry.doc.evidences[existing]
                if (
                    cleared <= 0 or list(entry.doc.evidences).index(existing) >= cleared
                ) and not entry.evidence_withdrawn(held):
                    entry.note_recalled(existing)
                    return held, None
            elif existing is None and entry.partial:
                # stored before the newest records this entry holds: looked up by its key
                store = cast(SliceStore, self.store)
                found = await store.read_evidences(entry.session_id, [prepared.dedup_key])
                if found and not removed:
                    live = next((e for e in found if not entry.evidence_withdrawn(e)), None)
                    if live is not None:
                        entry.note_recalled(live.evidence_id)
                        return live, None
                elif found and cleared < 0:
                    raise TailTooShort()  # stored before or after the clear: read further
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


class _Recalling(Generic[_T]):
    """``op`` for ``call``, on entry after entry: an entry read afresh for the call (its
    newest records were too few) takes over what the one before had ingested again (see
    :meth:`SessionEntry.recall`)."""

    __slots__ = ("call", "op", "recalled")

    def __init__(
        self, op: Callable[[SessionEntry, WriteLog], Awaitable[_T]], call: WriteLog
    ) -> None:
        self.op = op
        self.call = call
        self.recalled: tuple[int, list[str]] | None = None

    async def __call__(self, entry: SessionEntry) -> _T:
        try:
            return await self.op(entry.recall(self.recalled), self.call)
        except TailTooShort:
            self.recalled = entry.recalled
            raise
