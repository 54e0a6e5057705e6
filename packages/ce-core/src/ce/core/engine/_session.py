"""Per-session working state of the engine: the AgentState, its indexes, and a lock."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from itertools import islice
from typing import Any

from ce.core._drive import blocked_threads, inline, turn_released
from ce.core.engine._turn import Unread
from ce.core.pipeline import SessionIndex, canonical_step
from ce.core.schema import MESSAGES_BEFORE, Evidence, Message, Role, SessionDocument
from ce.core.state import AgentState
from ce.core.stores.base import SessionChanges, SessionUpdate
from ce.core.tokens import TokenEstimator, remember_counts

__all__ = [
    "FRAMEWORK_CALL_ID",
    "FRAMEWORK_CALL_IDS",
    "FRAMEWORK_MESSAGE_ID",
    "TAIL_EVIDENCES",
    "TAIL_MESSAGES",
    "SessionEntry",
    "SessionLocks",
    "TailTooShort",
    "message_key",
    "remember_stored_counts",
]

TAIL_MESSAGES = 64
TAIL_EVIDENCES = 64
"""How many of a session's newest messages and evidences a cold engine call reads first (a
call that can keep more reads twice as many, and so on: see ``ContextEngine._tail_entry``)."""


class TailTooShort(Exception):
    """A call on the newest part of a session found it could keep older records: it is done
    again on a longer part (``whole``: on the whole session). Nothing of it was stored."""

    def __init__(self, whole: bool = False) -> None:
        super().__init__("the session's newest records are not enough for this call")
        self.whole = whole


class ReadNewest(Exception):
    """A call on a whole long session found that the session's newest records serve it at
    less cost (going back rebuilds what the engine derived from every record it holds): it
    is done again on those. Nothing of it was stored."""


FRAMEWORK_MESSAGE_ID = "framework_message_id"
"""Message meta: the framework's id of a message stored under another id (the framework
reused an id the session holds for other content)."""
FRAMEWORK_CALL_IDS = "framework_tool_call_ids"
"""Assistant message meta: ``{stored id: framework id}`` of its tool calls whose framework id
was already used in the session (stored under a unique id instead)."""
FRAMEWORK_CALL_ID = "framework_tool_call_id"
"""Tool message meta: the framework's id of the call it answers, when stored under another."""


def message_key(message: Message, content: str | None = None) -> tuple[Any, ...]:
    """What identifies a message when the framework gives it no id: role, text as stored
    (``content`` when given), tool ids as the framework gave them."""
    renamed = message.meta.get(FRAMEWORK_CALL_IDS) or {}
    calls = tuple(renamed.get(c.tool_call_id, c.tool_call_id) for c in message.tool_calls or ())
    call_id = message.meta.get(FRAMEWORK_CALL_ID, message.tool_call_id)
    text = message.content if content is None else content
    if message.role is Role.ASSISTANT:
        text = canonical_step(text)  # a ReAct step re-rendered with its input re-printed
    return (message.role, text, call_id, calls)


def reply_key(text: str) -> tuple[Any, ...]:
    """:func:`message_key` of an assistant message without tool calls with ``text`` (as
    stored)."""
    return (Role.ASSISTANT, canonical_step(text), None, ())


class SessionEntry:
    """The engine's cached view of one session at a known store version.

    ``state`` is the only writer; ``indexes`` (one per model hint and way of rendering tool
    results) are fed every record the state holds, in order, so deriving blocks for a turn
    costs only what is new.
    """

    def __init__(
        self,
        session_id: str,
        state: AgentState,
        version: int,
        estimator_for: Callable[[str | None], TokenEstimator],
        epoch: str = "",
        *,
        unread: Unread | None = None,
        instruction: Message | None = None,
    ) -> None:
        self.session_id = session_id
        self.state = state
        self.version = version
        self.epoch = epoch
        # an entry of the session's newest records only (see ContextEngine._tail_entry):
        # what it did not read, and the newest system message stored before what it holds
        self.unread = unread or Unread()
        self.instruction = instruction
        self._estimator_for = estimator_for
        self.indexes: dict[tuple[str | None, bool], SessionIndex] = {}
        self.dedup: dict[str, str] = {}
        self.key_counts: dict[tuple[Any, ...], int] = {}
        # the newest position (from the session's first message) of each key, for
        # the messages matched against what a framework passes
        self.key_positions: dict[tuple[Any, ...], int] = {}
        self.last_key: tuple[Any, ...] | None = None  # of the newest non-system message
        self.user_ids: dict[tuple[Any, ...], str] = {}  # key -> newest user message's id
        self.message_ids: set[str] = set()
        self.id_texts: dict[str, tuple[Any, ...]] = {}
        self.id_variants: set[tuple[str, tuple[Any, ...]]] = set()
        self.call_aliases: dict[str, str] = {}
        self.chunks: dict[int, str] = {}
        # the previous call's pending messages but the last, the counts of their keys, the
        # positions of their system messages and the config they were read under: a
        # framework passes its history again on every call, so the next call matches only
        # what follows them (see _record_pending)
        self.pending_memo: (
            tuple[list[Message], dict[tuple[Any, ...], int], tuple[int, ...], object] | None
        ) = None
        self.config_ids: set[str] = set()  # config snapshots this entry stored a turn with
        # an instruction, the session's evidence (count, newest id) then, and the instruction
        # with the retrieved documents it quotes replaced (see _held.quoting_evidence)
        self.quoted_memo: tuple[str, tuple[int, str | None], str] | None = None
        self.removed_ids: set[str] = set()  # framework ids of messages the app removed
        # the evidences ingested again (found stored) since the session's newest message,
        # and the message count then: a going back keeps them sent (see _still_quoted)
        self.recalled: tuple[int, list[str]] = (0, [])
        self.match_after_clear()
        self._note_evidences(state.live_view().evidences.values())

    def cleared(self) -> int:
        """How many of the session's first messages the app's latest clear covers."""
        summary = self.state.live_view().session.summary
        return summary.cleared.messages if summary is not None and summary.cleared else 0

    def _taken_back(self) -> tuple[int, tuple[tuple[int, int], ...]]:
        """The app's latest clear and the spans of turns it took back (see
        :meth:`match_after_clear`)."""
        summary = self.state.live_view().session.summary
        spans = tuple((w.from_index, w.to_index) for w in summary.withdrawn) if summary else ()
        return self.cleared(), spans

    def withdrawn(self, position: int) -> bool:
        """Whether the message at ``position`` (from the session's first message) is in
        turns the app took back."""
        summary = self.state.live_view().session.summary
        return summary is not None and bool(summary.withdrawn) and summary.withdraws(position)

    def holds_going_back(self, from_index: int) -> bool:
        """Whether the entry holds what taking the session's turns back from message
        ``from_index`` on needs (see ``AgentState.withdraw_turns``): that message, the span
        it joins (earlier spans it touches), and the documents retrieved for its turns (each
        evidence says how many messages the session held when it was stored). An entry of
        the session's newest records holds them when its oldest evidence came before the
        span, or there is no older one."""
        base = self.unread.messages
        if from_index < base:
            return False
        summary = self.state.live_view().session.summary
        for span in reversed(summary.withdrawn if summary is not None else []):
            if span.to_index >= from_index:
                from_index = min(from_index, span.from_index)
        if from_index < base:
            return False
        if not self.unread.evidences:
            return True
        oldest = next(iter(self.state.live_view().evidences.values()), None)
        held = oldest.metadata.get(MESSAGES_BEFORE) if oldest is not None else None
        return not (isinstance(held, int) and held >= from_index)

    def note_recalled(self, evidence_id: str) -> None:
        """Remember that ``evidence_id`` was ingested again (found stored) now."""
        total, ids = self.recalled
        if total != self.message_total:
            self.recalled = total, ids = self.message_total, []
        if evidence_id not in ids:
            ids.append(evidence_id)

    def recall(self, recalled: tuple[int, list[str]] | None) -> SessionEntry:
        """This entry, taking over ``recalled`` (an entry's :attr:`recalled` that this one,
        read afresh for the same call, replaces) when it has none of its own since."""
        if recalled is not None and not self.recalled[1] and recalled[0] == self.message_total:
            self.recalled = recalled
        return self

    def evidence_withdrawn(self, evidence: Evidence) -> bool:
        """Whether ``evidence`` came with turns the app took back (see
        :meth:`~ce.core.schema.Summary.withdraws_evidence`)."""
        summary = self.state.live_view().session.summary
        return (
            summary is not None and bool(summary.withdrawn) and summary.withdraws_evidence(evidence)
        )

    def match_after_clear(self) -> None:
        """Match what a framework passes only against the messages after the app's latest
        clear of its history (see ``ContextEngine.clear_history``): a message it held before
        and passes again (a conversation restored after a reset) is new, stored and sent
        again. Their ids stay taken (a framework id among them is stored under a fresh id).
        Likewise for the turns the app took back (see :meth:`withdrawn`)."""
        messages = self.state.live_view().session.messages
        base = self.unread.messages
        cut = max(0, self.cleared() - base)
        self.key_counts = {}
        self.key_positions = {}
        self.last_key = None
        self.user_ids = {}
        self.id_texts = {}
        self.id_variants = set()
        self.pending_memo = None
        for position, message in enumerate(messages):
            if position >= cut and not self.withdrawn(base + position):
                self._count_key(message, base + position)
                continue
            for taken in (message.message_id, message.meta.get(FRAMEWORK_MESSAGE_ID)):
                if isinstance(taken, str) and taken:
                    self.message_ids.add(taken)
                    self.removed_ids.add(taken)
            for stored, framework_id in (message.meta.get(FRAMEWORK_CALL_IDS) or {}).items():
                self.call_aliases[framework_id] = stored

    def _note_evidences(self, evidences: Iterable[Evidence]) -> None:
        for evidence in evidences:
            key = evidence.metadata.get("dedup_key")
            if isinstance(key, str):  # the newest evidence of a key (see clear_history)
                self.dedup[key] = evidence.evidence_id

    def catch_up(self, update: SessionUpdate) -> None:
        """Absorb an incremental :class:`~ce.core.stores.base.SessionUpdate` of this entry's
        version and epoch (what other writers stored since); the indexes take the new records
        on their next use."""
        self.take_in(update.changes)
        self.version = update.version

    def take_in(self, changes: SessionChanges) -> None:
        """Absorb records already written elsewhere (stored by another writer, or carried
        to the session's next commit by an earlier call of this engine) after the ones the
        entry holds; the version stays."""
        remember_stored_counts(changes)
        taken_back = self._taken_back()
        first = self.message_total
        self.state.absorb(changes)
        if self._taken_back() != taken_back:  # another writer recorded a clear or rewind
            self.match_after_clear()
            self.indexes.clear()
        else:
            for position, message in enumerate(changes.messages, first):
                self._count_key(message, position)
        self._note_evidences(changes.evidences)

    @property
    def doc(self) -> SessionDocument:
        return self.state.live_view()

    @property
    def partial(self) -> bool:
        """Whether the entry holds the session's newest records only."""
        return bool(self.unread.messages or self.unread.evidences)

    @property
    def message_total(self) -> int:
        """How many messages the session holds (read or not)."""
        return self.unread.messages + len(self.state.live_view().session.messages)

    @property
    def evidence_total(self) -> int:
        """How many evidences the session holds (read or not)."""
        return self.unread.evidences + len(self.state.live_view().evidences)

    def _count_key(self, message: Message, position: int) -> None:
        if message.message_id:
            self.message_ids.add(message.message_id)
            self.id_texts[message.message_id] = (message.role, message.content)
        original = message.meta.get(FRAMEWORK_MESSAGE_ID)
        if isinstance(original, str):  # stored under a fresh id: the framework's is taken too
            self.message_ids.add(original)
            self.id_variants.add((original, (message.role, message.content)))
        for stored, framework_id in (message.meta.get(FRAMEWORK_CALL_IDS) or {}).items():
            self.call_aliases[framework_id] = stored
        key = message_key(message)
        self.key_counts[key] = self.key_counts.get(key, 0) + 1
        self.key_positions[key] = position
        if message.role is not Role.SYSTEM:
            self.last_key = key
        if message.role is Role.USER and message.message_id:
            self.user_ids[key] = message.message_id

    def holds(self, message_id: str, role: Any, text: str) -> bool:
        """Whether the session holds a message the framework identifies as ``message_id``
        with this role and (stored) text."""
        variant = (role, text)
        return self.id_texts.get(message_id) == variant or (
            (message_id, variant) in self.id_variants
        )

    def stored_call_id(self, framework_id: str) -> str:
        """The stored id of the newest tool call the framework identified as
        ``framework_id`` that has no tool run recorded yet (a framework may reuse an id in a
        later turn: the session stores that call under a unique id)."""
        alias = self.call_aliases.get(framework_id)
        current = framework_id if alias is None else alias
        state = self.state
        if alias is not None and not state.tool_call_recorded(alias):
            return alias
        if not (state.tool_call_recorded(current) and state.tool_call_answered(current)):
            return framework_id
        # that call is over (its run and its result are stored): this run is of a later call
        # reusing the id whose reply is still to be recorded (a framework that reports a tool
        # run before it hands over the reply that asked for it). It takes the id that reply's
        # call will be stored under: the first ``<id>~n`` no message declares.
        n = 2
        while state.declares(f"{framework_id}~{n}") or state.tool_call_recorded(
            f"{framework_id}~{n}"
        ):
            n += 1
        self.call_aliases[framework_id] = alias = f"{framework_id}~{n}"
        return alias

    def tool_call_names(self, framework_id: str) -> tuple[str | None, set[str]]:
        """What the session holds of the tool calls the framework identified as
        ``framework_id``: the stored id of the one awaiting its run (its reply is recorded,
        its run is not: the call running now), and the stored ids of the others
        (``framework_id``, then ``<id>~2``, ... up to the newest one)."""
        alias = self.call_aliases.get(framework_id)
        if alias is not None:
            stem, _, number = alias.rpartition("~")
            held = {framework_id}
            if stem == framework_id and number.isdigit():
                held.update(f"{framework_id}~{n}" for n in range(2, int(number) + 1))
            held.add(alias)
        elif self.state.declares(framework_id):
            held = {framework_id}
        else:
            return None, set()
        current = self.stored_call_id(framework_id)
        if current in held and not self.state.tool_call_recorded(current):
            return current, held - {current}
        return None, held

    def note_taken(self, messages: Iterable[Message]) -> None:
        """Remember the ids of messages the session stores before what this entry holds
        (read by id): a framework id among them is taken, though the messages are not
        matched against what a framework passes."""
        removed = self.unread.messages <= self.cleared()
        for message in messages:
            if message.message_id:
                self.message_ids.add(message.message_id)
                if removed:  # before the app's clear (see match_after_clear)
                    self.removed_ids.add(message.message_id)
                else:
                    self.id_texts[message.message_id] = (message.role, message.content)

    def note_written(self, stored: Message) -> None:
        """Remember a message just written (in its stored, redacted form), so a framework
        that passes it again is not recorded twice."""
        self._count_key(stored, self.message_total - 1)

    def index(self, model_hint: str | None, fence_tool_results: bool = True) -> SessionIndex:
        """The index for ``model_hint`` (rendering tool results fenced or not), brought up
        to date with the state."""
        key = (model_hint, fence_tool_results)
        index = self.indexes.get(key)
        if index is None:
            index = SessionIndex(
                self._estimator_for(model_hint),
                model_hint,
                fence_tool_results=fence_tool_results,
                message_base=self.unread.messages,
                instruction=self.instruction,
            )
            self.indexes[key] = index
        doc = self.state.live_view()
        session = doc.session
        messages = session.messages
        summary = session.summary
        taken_back = summary if summary is not None and summary.withdrawn else None
        for message in messages[index.message_count - index.message_base :]:
            if taken_back is not None and taken_back.withdraws(index.message_count):
                index.skip_message()  # in turns the app took back: no block
            else:
                index.add_message(message)
        for record in session.tool_state.tool_calls[index.record_count :]:
            index.add_tool_record(record)
        new = len(doc.evidences) - index.evidence_count
        if new > 0:
            # dicts keep insertion order: the newest evidences are at the end
            for evidence in reversed(list(islice(reversed(doc.evidences.values()), new))):
                if taken_back is not None and taken_back.withdraws_evidence(evidence):
                    index.skip_evidence(evidence.evidence_id)  # with turns taken back
                else:
                    index.add_evidence(evidence)
        return index


class _Waiter:
    """A call waiting for a session's lock: its loop and future (a coroutine call) or its
    event (a call driven inline, which blocks its thread), and whether the lock was handed
    to it (set under the guard, before the waiter is woken)."""

    __slots__ = ("event", "future", "granted", "holder", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop | None, holder: _Holder) -> None:
        self.loop = loop
        self.holder = holder
        self.future: asyncio.Future[None] | None = None if loop is None else loop.create_future()
        self.event: threading.Event | None = threading.Event() if loop is None else None
        self.granted = False

    def wake(self) -> None:
        if self.loop is not None and self.future is not None:
            self.loop.call_soon_threadsafe(_wake, self.future)
        elif self.event is not None:
            self.event.set()


class _Holder:
    """Who holds (or waits for) a session's lock: the thread of a call driven inline, or the
    event loop and task of a coroutine call."""

    __slots__ = ("loop", "task", "thread")

    def __init__(
        self,
        thread: int | None,
        loop: asyncio.AbstractEventLoop | None,
        task: asyncio.Task[Any] | None,
    ) -> None:
        self.thread = thread
        self.loop = loop
        self.task = task

    def blocks(
        self, waiter: _Holder, blocking: bool, loop: asyncio.AbstractEventLoop | None
    ) -> bool:
        """Whether ``waiter`` waiting for this holder could never end: the holder is the
        waiter's own task, or a thread the waiter's flow of work blocks, or (for a blocking
        waiter) a task of the event loop the waiter's thread runs."""
        if self.task is not None and self.task is waiter.task:
            return True
        if self.thread is not None and self.thread in blocked_threads(waiter.thread):
            return True
        return blocking and loop is not None and self.loop is loop


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SessionLocks:
    """One lock per session that works across threads and event loops: calls for one session
    are serialized (first come, first served), different sessions run concurrently.

    Waiting takes no thread: a coroutine call awaits a future of its own loop, a call driven
    inline (``engine.sync``) blocks its own thread, and the call that releases the lock hands
    it to the next waiter directly (thread-safely, whatever loop or thread that waiter runs
    on). So any number of calls may wait for one session while the holder's store calls still
    find a free worker thread. A session's entry exists only while a call holds the lock or
    waits for it. A wait that could never end raises :class:`RuntimeError` instead: a call
    for a session its own flow of work already holds, or a blocking wait on a thread whose
    event loop runs the holder."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._waiters: dict[str, deque[_Waiter]] = {}  # present while held; queue of waiters
        # who holds each session: (thread of an inline holder, loop and task of a coroutine)
        self._holders: dict[str, _Holder] = {}

    def __len__(self) -> int:
        """The number of sessions whose lock is held right now."""
        with self._guard:
            return len(self._waiters)

    async def _acquire(self, session_id: str) -> None:
        loop = asyncio._get_running_loop()  # None off a loop, without raising
        blocking = inline()
        me = _Holder(
            threading.get_ident() if blocking else None,
            None if blocking else loop,
            None if blocking or loop is None else asyncio.current_task(loop),
        )
        with self._guard:
            queue = self._waiters.get(session_id)
            if queue is None:
                self._waiters[session_id] = deque()
                self._holders[session_id] = me
                return
            holder = self._holders.get(session_id)
            if holder is not None and holder.blocks(me, blocking, loop):
                raise RuntimeError(
                    f"a call for session {session_id!r} would wait for its own flow of work to "
                    "release the session (code the engine runs for the session, such as its "
                    "summarizer's model call, calling back into the engine for it; or a "
                    "blocking call on the event loop whose task holds it): it would wait on "
                    "itself forever"
                )
            waiter = _Waiter(None if blocking else loop, me)
            queue.append(waiter)
        if waiter.event is not None:
            waiter.event.wait()
            return
        assert waiter.future is not None
        try:
            async with turn_released():  # never wait for a session in the loop's turn
                await waiter.future
        except asyncio.CancelledError:
            with self._guard:
                granted = waiter.granted
                if not granted:
                    queue.remove(waiter)
            if granted:  # handed over as the cancellation came: pass it on
                self._release(session_id)
            raise

    def _release(self, session_id: str) -> None:
        with self._guard:
            queue = self._waiters[session_id]
            if not queue:
                del self._waiters[session_id]
                self._holders.pop(session_id, None)
                return
            waiter = queue.popleft()
            waiter.granted = True
            self._holders[session_id] = waiter.holder
        waiter.wake()

    async def settle(self, session_id: str) -> None:
        """Wait until the calls that hold or wait for the session now are done; at once
        when that wait could never end (this flow holds the session itself)."""
        try:
            await self._acquire(session_id)
        except RuntimeError:
            return
        self._release(session_id)

    def hold(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the session's lock for the body of an ``async with``."""
        return _Held(self, session_id)


class _Held:
    """:meth:`SessionLocks.hold`'s context manager (a class: every engine call opens one)."""

    __slots__ = ("locks", "session_id")

    def __init__(self, locks: SessionLocks, session_id: str) -> None:
        self.locks = locks
        self.session_id = session_id

    async def __aenter__(self) -> None:
        await self.locks._acquire(self.session_id)

    async def __aexit__(self, *exc_info: object) -> None:
        self.locks._release(self.session_id)


def remember_stored_counts(changes: SessionChanges) -> None:
    """Take the token counts read with the records of ``changes`` (see
    :func:`~ce.core.tokens.remember_counts`); counts that are not valid JSON are ignored."""
    for text in changes.token_counts.values():
        try:
            counts = json.loads(text)
        except ValueError:
            continue
        if isinstance(counts, dict):
            remember_counts(counts)
