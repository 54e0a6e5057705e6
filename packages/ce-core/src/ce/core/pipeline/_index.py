"""The incremental derivation of candidate blocks from a session.

A :class:`SessionIndex` turns a session's history and evidence into candidate blocks and keeps
them, with their token counts, as the session grows: adding a message or an evidence costs work
proportional to that record, never to the history. Rules:

* every user message is one ``conversation`` block; an assistant message is one block together
  with the results of its tool calls (a tool group is atomic: it is kept, degraded or dropped
  whole); tool calls that never got a result are left out of the rendering, so the input never
  holds a call without its result; system messages are not conversation (the newest one is the
  instruction);
* a tool result whose call produced ``rag_doc`` evidence and that is those documents alone (a
  retriever's output) renders as those evidences, fenced with their ids and sources, instead
  of the tool's raw text; a result with text of its own around them keeps that text with the
  documents it quotes fenced in place, and one that quotes none (an answer made from them)
  renders as the tool's own text followed by the documents, fenced; a tool call whose run was
  recorded without a tool message (``record_tool_call`` with a ``tool_result`` evidence linked
  by ``tool_call_id``) renders with that evidence, fenced, as its result once a later user
  message closed its turn;
* every other evidence is one ``evidence`` block, except ``llm_output`` (the model's own words
  are in the history already), evidence linked to a tool call (its tool result shows it) and
  the unredacted originals that ``dual_store`` keeps for audits;
  its priority follows its confidence (>= 0.75 high, >= 0.4 or unknown medium, else low);
* an answer that the newest user message quotes in full renders as a pointer to it, and so
  does its copy in an earlier prompt that quoted it too (see ``_quotes``): the model reads it
  once;
* a block that has no Summary/Gist of its own gets shortened ones (see ``_levels.shorten``);
  the images, files and audio of a user message or a tool result go with it at Live level only
  (they count against the budget there); its Summary and Gist say what was left out
  (``[image omitted]``).

Token counts are for one ``model_hint``; an index serves one hint.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial

from ce.core._flatten import peer_turn_text
from ce.core.formats import to_openai_messages
from ce.core.pipeline._conflicts import ConflictTracker
from ce.core.pipeline._levels import (
    LEVELS,
    POINTER_PREFIX,
    fence_evidence,
    fence_tool_result,
    shorten,
)
from ce.core.pipeline._quotes import (
    QUOTE_LOOKBACK,
    QUOTED_ANSWER,
    SAME_TEXT_POINTER,
    Quotes,
    fenced_in_place,
    quoted_answers,
    quoting,
    without_quoted,
)
from ce.core.pipeline._react import is_observation, is_react_step
from ce.core.primitives import parse_iso
from ce.core.schema import (
    Author,
    AuthorKind,
    BlockType,
    Evidence,
    EvidenceType,
    LevelOfDetail,
    Message,
    MessagePart,
    Priority,
    Role,
    ToolCall,
    ToolCallStatus,
)
from ce.core.schema._document import without_media
from ce.core.tokens import TokenEstimator

__all__ = [
    "SECTION_JOIN_TOKENS",
    "SUMMARY_OF",
    "Candidate",
    "Rendering",
    "SessionIndex",
    "evidence_priority",
]

SECTION_JOIN_TOKENS = 2
"""Tokens charged per section of the system message for the blank line that joins it."""


@dataclass(frozen=True, slots=True)
class Rendering:
    """A block at one level of detail: chat parts (conversation) or section text (context),
    and what it costs."""

    level: LevelOfDetail
    parts: tuple[MessagePart, ...]
    text: str
    tokens: int


class Candidate:
    """One candidate block. Renderings are built lazily, level by level, and cached."""

    __slots__ = ("_build", "_cache", "at", "block_id", "block_type", "kind", "position", "priority")

    def __init__(
        self,
        block_id: str,
        block_type: BlockType,
        kind: str,
        priority: Priority,
        position: int,
        at: datetime | None,
        build: Callable[[LevelOfDetail], Rendering],
    ) -> None:
        self.block_id = block_id
        self.block_type = block_type
        self.kind = kind
        self.priority = priority
        self.position = position
        self.at = at
        self._build = build
        self._cache: dict[LevelOfDetail, Rendering] = {}

    def rendering(self, level: LevelOfDetail) -> Rendering:
        cached = self._cache.get(level)
        if cached is None:
            cached = self._build(level)
            self._cache[level] = cached
        return cached

    @property
    def live(self) -> Rendering:
        return self.rendering(LevelOfDetail.LIVE)

    def cheaper(self) -> Iterator[Rendering]:
        """The Summary and Gist renderings that cost less than the one before them, each
        rendered when the caller asks for it (a block kept at Summary never renders its
        Gist)."""
        tokens = self.live.tokens
        for level in LEVELS[1:]:
            rendering = self.rendering(level)
            if rendering.tokens < tokens:
                yield rendering
                tokens = rendering.tokens

    def invalidate(self) -> None:
        self._cache.clear()


def evidence_priority(evidence: Evidence) -> Priority:
    if evidence.confidence is None:
        return Priority.MEDIUM
    if evidence.confidence >= 0.75:
        return Priority.HIGH
    if evidence.confidence >= 0.4:
        return Priority.MEDIUM
    return Priority.LOW


def _at(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return parse_iso(value)
    except ValueError:
        return None


SUMMARY_OF = "summary_of"
"""The metadata key of an ``llm_output`` evidence that is a model-written summary of one
message: the message's id. The message renders with it at the Summary level."""


class _Group:
    """The messages of one conversation block: its head and the results of its tool calls."""

    __slots__ = ("head", "index", "observation", "results")

    def __init__(self, head: Message, index: int) -> None:
        self.head = head
        self.index = index
        self.results: dict[str, Message] = {}
        self.observation: Message | None = None  # the answer to a ReAct step (see _react)


def _fenced_documents(evidences: Sequence[Evidence], level: LevelOfDetail) -> list[str]:
    """A tool call's evidences, each fenced with its provenance at ``level``; a text an
    earlier one of them holds goes as a pointer to that one (a retrieval tool asking two
    indexes that both hold a passage: the passage goes once, both sources are cited), unless
    the pointer is not shorter than the text."""
    first: dict[str, str] = {}  # text -> the evidence of the call sent whole with it
    blocks: list[str] = []
    for evidence in evidences:
        text = evidence.content.strip()
        whole = first.get(text)
        pointer = SAME_TEXT_POINTER.format(evidence_id=whole) if whole else None
        if pointer is not None and len(pointer) < len(text):
            blocks.append(fence_evidence(evidence, pointer))
            continue
        first.setdefault(text, evidence.evidence_id)
        blocks.append(fence_evidence(evidence, shorten(evidence.content, level)))
    return blocks


class SessionIndex:
    """Candidate blocks of one session for one ``model_hint``, maintained incrementally.

    Feed it every message (:meth:`add_message`), evidence (:meth:`add_evidence`) and tool-run
    record (:meth:`add_tool_record`) in stored order; or, for an index of the newest part of a
    session, every record of that part (positions count from ``message_base``).
    """

    def __init__(
        self,
        estimator: TokenEstimator,
        model_hint: str | None,
        *,
        fence_tool_results: bool = True,
        message_base: int = 0,
        instruction: Message | None = None,
    ) -> None:
        """``message_base``: how many messages of the session come before the first one fed
        (an index of the session's newest messages); ``instruction``: the newest system
        message among them."""
        self.estimator = estimator
        self.model_hint = model_hint
        self.fence_tool_results = fence_tool_results
        self.groups: list[Candidate] = []
        self._group_data: list[_Group] = []
        self._cum: list[int] = [0]  # live tokens of groups[:i], from _stale on out of date
        self._live: list[Rendering | None] = []  # groups' Live renderings, likewise
        self._stale: int | None = None
        self._call_group: dict[str, int] = {}
        self._tool_records: dict[str, ToolCall] = {}
        self._rag_by_call: dict[str, list[Evidence]] = {}
        self._result_by_call: dict[str, list[Evidence]] = {}
        # model-written summaries of long messages (``llm_output`` evidence ``summary_of``
        # a message id) and the group each message renders in
        self._summaries: dict[str, str] = {}
        self._message_group: dict[str, int] = {}
        self._evidence_answered: set[int] = set()  # groups of the current turn waiting
        # conflicting-fact trackers by entity keys (see _conflicts; kept by the engine)
        self.conflict_trackers: dict[tuple[str, ...], ConflictTracker] = {}
        self.evidence_tiers: dict[Priority, list[Candidate]] = {
            p: [] for p in (Priority.HIGH, Priority.MEDIUM, Priority.LOW)
        }
        self._evidence_cum: dict[Priority, list[int]] = {p: [0] for p in self.evidence_tiers}
        # each evidence block's evidence and its text (what two blocks with the same text
        # share, surrounding whitespace aside), and its pointer renderings (evidence_pointer)
        self._evidence_of: dict[str, Evidence] = {}
        # where each evidence renders: its own block (tier, place in the tier) or, linked to
        # a tool call, that call's group (by the call's id)
        self._evidence_slot: dict[str, tuple[Priority, int]] = {}
        self._evidence_call: dict[str, str] = {}
        self.pointing: set[str] = set()
        """The conversation blocks whose messages hold a document pointer (their prompt
        quoted a retrieved document whole: see ``_pointed``)."""
        self.evidence_texts: dict[str, str] = {}
        self._pointers: dict[tuple[str, str], Rendering] = {}
        self.message_base = message_base
        self.message_count = message_base
        self.evidence_count = 0
        self.withdrawn_evidences: list[str] = []  # see skip_evidence
        self.record_count = 0
        self._errors: list[tuple[str, str]] = []
        self.instruction: Message | None = instruction
        self.last_user_group: int | None = None
        self._quotes = Quotes({}, {})  # what the newest user message quotes (see settle)
        self._quoted: frozenset[int] = frozenset()  # the groups sent with a pointer
        self._quote_due = False  # a newer user message came: look again (see settle)

    # -- feeding ------------------------------------------------------------------------

    def skip_message(self) -> None:
        """Count the session's next message without making it a block (a message in turns
        the app took back: never sent)."""
        self.message_count += 1

    def skip_evidence(self, evidence_id: str) -> None:
        """Count the session's next evidence without making it a block (a document retrieved
        for turns the app took back: never sent, listed in ``withdrawn_evidences``)."""
        self.evidence_count += 1
        self.withdrawn_evidences.append(evidence_id)

    def add_message(self, message: Message) -> None:
        position = self.message_count
        self.message_count += 1
        points = POINTER_PREFIX in message.content  # a prompt that quoted a document
        if message.role is Role.SYSTEM:
            self.instruction = message
            return
        if message.role is Role.USER and self._observes(message):
            self._group_data[-1].observation = message
            self._note_group(message, len(self.groups) - 1)
            self._refresh(len(self.groups) - 1)
            if points:
                self.pointing.add(self.groups[-1].block_id)
            return
        if message.role is Role.TOOL:
            index = self._call_group.get(message.tool_call_id or "")
            if index is not None:
                group = self._group_data[index]
                if message.tool_call_id not in group.results:
                    group.results[message.tool_call_id or ""] = message
                    self._note_group(message, index)
                    self._refresh(index)
                    if points:
                        self.pointing.add(self.groups[index].block_id)
            return
        index = len(self.groups)
        group_id = f"msg:{message.message_id or position}"
        if points:
            self.pointing.add(group_id)
        data = _Group(message, index)
        candidate = Candidate(
            group_id,
            BlockType.CONVERSATION,
            "conversation",
            Priority.MEDIUM,
            position,
            _at(message.at),
            partial(self._render_group, data),
        )
        self.groups.append(candidate)
        self._group_data.append(data)
        self._note_group(message, index)
        for call in message.tool_calls or ():
            self._call_group.setdefault(call.tool_call_id, index)
        # rendered when first needed: a tool call's group renders once its results are in
        self._cum.append(self._cum[-1])
        self._live.append(None)
        if self._stale is None or index < self._stale:
            self._stale = index
        if message.role is Role.USER:
            self.last_user_group = index
            self._quote_due = True
            # calls answered by recorded result evidence only render once their turn is over
            for waiting in sorted(self._evidence_answered):
                self._refresh(waiting)
            self._evidence_answered.clear()

    @property
    def quoted(self) -> frozenset[int]:
        """The groups sent with a pointer to the newest user message (see settle)."""
        return self._quoted

    def settle(self) -> None:
        """Before blocks are rendered for a call: what the newest user message quotes in full
        of the recent blocks goes as a pointer to it (see ``_quotes``); what an earlier one
        quoted renders whole again. Once per newest user message, not per user message fed."""
        if not self._quote_due:
            return
        self._quote_due = False
        index = self.last_user_group
        if index is None:
            return
        first = max(0, index - QUOTE_LOOKBACK)
        heads = [data.head for data in self._group_data[first:index]]
        quotes = quoted_answers(self._group_data[index].head, heads, first)
        quoted = quotes.blocks
        for changed in self._quoted | quoted:
            self._refresh(changed)
        self._quotes, self._quoted = quotes, quoted

    def _note_group(self, message: Message, index: int) -> None:
        if message.message_id:
            self._message_group[message.message_id] = index
            if message.message_id in self._summaries:
                self._refresh(index)

    def _observes(self, message: Message) -> bool:
        """Whether a user message is the Observation of the ReAct step just before it (the
        step's block takes it: it is no question of the user's)."""
        if not self._group_data or not is_observation(message.content):
            return False
        step = self._group_data[-1]
        head = step.head
        return (
            step.observation is None
            and head.role is Role.ASSISTANT
            and not head.tool_calls
            and is_react_step(head.content)
        )

    def add_tool_record(self, record: ToolCall) -> None:
        self.record_count += 1
        self._tool_records.setdefault(record.tool_call_id, record)
        index = self._call_group.get(record.tool_call_id)
        if index is not None and self._answered(self._group_data[index], record.tool_call_id):
            self._refresh(index)

    def add_evidence(self, evidence: Evidence) -> None:
        self.evidence_count += 1
        if evidence.type is EvidenceType.LLM_OUTPUT:
            summarized = evidence.metadata.get(SUMMARY_OF)
            if isinstance(summarized, str) and summarized not in self._summaries:
                self._summaries[summarized] = evidence.content
                index = self._message_group.get(summarized)
                if index is not None:
                    self._refresh(index)
            return
        if "original_of" in evidence.metadata:
            return
        call_id = evidence.links.tool_call_id
        if call_id:
            if evidence.type is EvidenceType.RAG_DOC:
                self._rag_by_call.setdefault(call_id, []).append(evidence)
            elif evidence.type is EvidenceType.TOOL_RESULT:
                self._result_by_call.setdefault(call_id, []).append(evidence)
            else:
                return
            self._evidence_call[evidence.evidence_id] = call_id
            index = self._call_group.get(call_id)
            if index is not None and self._answered(self._group_data[index], call_id):
                self._refresh(index)
            return
        tier = evidence_priority(evidence)
        try:
            candidate = self._evidence_candidate(evidence, tier)
            tokens = candidate.live.tokens
        except Exception as exc:  # one bad evidence must not stop the turn
            self._errors.append(
                ("evidence_derive_failed", f"evidence {evidence.evidence_id}: {exc!r}")
            )
            return
        self._evidence_slot[evidence.evidence_id] = (tier, len(self.evidence_tiers[tier]))
        self.evidence_tiers[tier].append(candidate)
        self._evidence_of[candidate.block_id] = evidence
        self.evidence_texts[candidate.block_id] = evidence.content.strip()
        cum = self._evidence_cum[tier]
        cum.append(cum[-1] + tokens)

    def _evidence_candidate(self, evidence: Evidence, tier: Priority) -> Candidate:
        candidate = Candidate(
            f"ev:{evidence.evidence_id}",
            BlockType.EVIDENCE,
            "evidence",
            tier,
            self.evidence_count - 1,
            _at(evidence.created_at),
            partial(self._render_evidence, evidence),
        )
        return candidate

    def _render_evidence(self, evidence: Evidence, level: LevelOfDetail) -> Rendering:
        return self._section(level, fence_evidence(evidence, shorten(evidence.content, level)))

    def evidence_pointer(self, block_id: str, original_id: str) -> Rendering:
        """The evidence block ``block_id`` with its own provenance but, instead of its text,
        a pointer to the evidence ``original_id`` that holds the same text and is sent whole
        (two sources returning one passage: the text goes once, both sources are cited)."""
        key = (block_id, original_id)
        rendering = self._pointers.get(key)
        if rendering is None:
            evidence = self._evidence_of[block_id]
            pointer = SAME_TEXT_POINTER.format(evidence_id=original_id)
            rendering = self._section(LevelOfDetail.LIVE, fence_evidence(evidence, pointer))
            self._pointers[key] = rendering
        return rendering

    def drain_errors(self) -> list[tuple[str, str]]:
        """Errors met while deriving since the last call, as ``(reason, detail)``."""
        errors, self._errors = self._errors, []
        return errors

    # -- queries --------------------------------------------------------------------------

    def turn_of(self, message_id: str) -> int | None:
        """The index of the group a user message ``message_id`` opens (None when it opens
        none: unknown, or the Observation of a ReAct step)."""
        index = self._message_group.get(message_id)
        if index is None or self._group_data[index].head.message_id != message_id:
            return None
        return index if self.opens_turn(index) else None

    def evidence_slot(self, evidence_id: str) -> tuple[Priority, int] | None:
        """The tier and the place in it of the evidence block of ``evidence_id`` (None when
        the evidence has no block of its own, or the index does not hold it)."""
        return self._evidence_slot.get(evidence_id)

    def evidence_home(self, evidence_id: str) -> Candidate | None:
        """The block a model reads the evidence ``evidence_id`` in: its own, or the group of
        the tool call it is linked to (its result shows it); None when the index holds
        neither."""
        slot = self._evidence_slot.get(evidence_id)
        if slot is not None:
            return self.evidence_tiers[slot[0]][slot[1]]
        index = self._call_group.get(self._evidence_call.get(evidence_id, ""))
        return self.groups[index] if index is not None else None

    def group_of(self, message_id: str) -> int | None:
        """The index of the group message ``message_id`` renders in (its head, a tool result
        of the head's calls, the Observation of a ReAct step); None for a message in none (a
        system message) or one the index does not hold."""
        return self._message_group.get(message_id)

    def call_group(self, tool_call_id: str) -> int | None:
        """The index of the group whose assistant message made the tool call."""
        return self._call_group.get(tool_call_id)

    def opens_turn(self, index: int) -> bool:
        """Whether ``groups[index]`` is a user message (a turn starts there)."""
        return self._group_data[index].head.role is Role.USER

    def group_tokens(self, start: int, stop: int) -> int:
        """Live tokens of ``groups[start:stop]``."""
        self.settle()
        stale = self._stale
        if stale is not None and stop > stale:
            # groups re-rendered since (a result or summary arrived): their sums, once
            cum, groups, lives = self._cum, self.groups, self._live
            for i in range(stale, len(groups)):
                live = lives[i] = groups[i].live
                cum[i + 1] = cum[i] + live.tokens
            self._stale = None
        return self._cum[stop] - self._cum[start]

    def live_start(self, low: int, stop: int, room: int) -> int:
        """The first group ``i >= low`` such that ``groups[i:stop]`` fit in ``room`` tokens at
        Live (``stop`` when not even the newest one does): a binary search of the sums."""
        if self.group_tokens(low, stop) <= room:  # brings the sums up to date
            return low
        cum = self._cum
        return bisect_left(cum, cum[stop] - room, low, stop)

    def lives(self, start: int, stop: int) -> list[Rendering]:
        """The Live renderings of ``groups[start:stop]``."""
        self.group_tokens(start, stop)  # brings them up to date
        return self._live[start:stop]  # type: ignore[return-value]  # none is None after it

    def evidence_tokens(self, tier: Priority, start: int, stop: int) -> int:
        cum = self._evidence_cum[tier]
        return cum[stop] - cum[start]

    def first_group_after(self, message_index: int) -> int:
        """The index of the first group whose head message comes after ``message_index``."""
        lo, hi = 0, len(self.groups)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.groups[mid].position <= message_index:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def section_tokens(self, text: str) -> int:
        return self.estimator.estimate_text(text, self.model_hint) + SECTION_JOIN_TOKENS

    # -- rendering ------------------------------------------------------------------------

    def _section(self, level: LevelOfDetail, text: str) -> Rendering:
        return Rendering(level, (), text, self.section_tokens(text))

    def _text(self, message: Message, level: LevelOfDetail) -> str:
        if message.lod is not None:
            return message.text_at(level)
        shortened = shorten(message.content, level)
        summary = self._summaries.get(message.message_id or "")
        if summary is None or level is LevelOfDetail.LIVE:
            return shortened
        if level is not LevelOfDetail.SUMMARY:
            summary = shorten(summary, level)
        return summary if len(summary) < len(shortened) else shortened

    # -- model-written summaries -----------------------------------------------------------

    def has_summary(self, message_id: str) -> bool:
        return message_id in self._summaries

    def summarizable(self, block_ids: Iterable[str], min_tokens: int) -> list[Message]:
        """The messages of the blocks ``block_ids`` worth a model-written summary: text of
        their own (no app-supplied levels), at least ``min_tokens`` long, none yet."""
        out: list[Message] = []
        for block_id in dict.fromkeys(block_ids):
            index = self._message_group.get(block_id.removeprefix("msg:"))
            if index is None or self.groups[index].block_id != block_id:
                continue
            data = self._group_data[index]
            members = [data.head, *data.results.values()]
            if data.observation is not None:
                members.append(data.observation)
            for message in members:
                if (
                    message.message_id
                    and message.lod is None
                    and message.message_id not in self._summaries
                    and self.estimator.estimate_text(message.content, self.model_hint) >= min_tokens
                ):
                    out.append(message)
        return out

    def _answered(self, data: _Group, call_id: str) -> bool:
        """Whether a tool call has its result: a tool message, or (a run recorded with
        ``record_tool_call`` and no tool message) a ``tool_result`` evidence linked to it,
        once a later user message closed the call's turn. Within the turn the framework's
        tool message is still to come (an integration records the run first): rendering the
        evidence meanwhile would hand the framework a result text it never produced."""
        if call_id in data.results:
            return True
        if call_id not in self._result_by_call:
            return False
        if self.last_user_group is None or data.index >= self.last_user_group:
            self._evidence_answered.add(data.index)
            return False
        return True

    def _tool_text(
        self, call_id: str, name: str | None, result: Message | None, level: LevelOfDetail
    ) -> str:
        evidences = self._rag_by_call.get(call_id)
        sources: list[Evidence] = []  # documents sent after the tool's own text
        if evidences and result is not None:
            held = quoting(result.content, evidences)
            if held is None:  # an answer made from them: the answer, then the documents
                sources, evidences = evidences, None
            elif held and level is not LevelOfDetail.LIVE:
                evidences = None  # the tool's own text, shortened
            elif held:  # the tool's own text, the documents it quotes fenced in place
                return fenced_in_place(self._text(result, level), evidences)
        if result is None:
            answers = self._result_by_call.get(call_id)
            if not evidences:
                evidences = answers
            elif answers and all(quoting(a.content, evidences) is None for a in answers):
                # no result message, but the run's recorded output is an answer made from the
                # documents (a query engine returning directly): the answer, then them
                evidences = [*answers, *evidences]
        if evidences:
            return "\n\n".join(_fenced_documents(evidences, level))
        if result is None:
            return ""
        text = self._text(result, level)
        documents = "".join("\n\n" + block for block in _fenced_documents(sources, level))
        if not self.fence_tool_results:
            return text + documents
        recorded = self._result_by_call.get(call_id)
        record = self._tool_records.get(call_id)
        status = record.status.value if record is not None else None
        if status is None and recorded:
            status = recorded[0].metadata.get("status")
        evidence_id = recorded[0].evidence_id if recorded else None
        if evidence_id is None and record is not None and record.result_evidence_ids:
            # a result the session held already (the same output of an earlier call) was not
            # stored again: the run names the evidence it was deduplicated to
            evidence_id = record.result_evidence_ids[0]
        own = fence_tool_result(
            text,
            evidence_id=evidence_id,
            tool=result.name or name,
            status=status if isinstance(status, str) else None,
        )
        return own + documents

    def _render_group(self, data: _Group, level: LevelOfDetail) -> Rendering:
        head = data.head
        author = head.author
        if head.role is Role.USER:
            text, media = self._text(head, level), head.parts
            if data.index in self._quotes.prompts:
                text = without_quoted(text, self._quotes.prompts[data.index])
            if media and level is not LevelOfDetail.LIVE:
                text, media = without_media(text, media), None
            parts: tuple[MessagePart, ...] = (
                MessagePart(
                    role=Role.USER, content=text, parts=media, name=head.name, author=author
                ),
            )
        else:
            calls = [c for c in head.tool_calls or () if self._answered(data, c.tool_call_id)]
            quoted = data.index in self._quotes.answers
            text = QUOTED_ANSWER if quoted else self._text(head, level)
            if not calls and not text.strip():
                return Rendering(level, (), "", 0)
            built = [
                MessagePart(
                    role=Role.ASSISTANT,
                    content=text,
                    tool_calls=calls or None,
                    name=head.name,
                    author=author,
                )
            ]
            for call in calls:
                record = self._tool_records.get(call.tool_call_id)
                result = data.results.get(call.tool_call_id)
                content = self._tool_text(call.tool_call_id, call.name, result, level)
                media = result.parts if result is not None else None
                if media and level is not LevelOfDetail.LIVE:
                    content, media = without_media(content, media), None
                built.append(
                    MessagePart(
                        role=Role.TOOL,
                        content=content,
                        tool_call_id=call.tool_call_id,
                        name=(result.name if result is not None else None) or call.name,
                        is_error=record is not None and record.status is not ToolCallStatus.SUCCESS,
                        parts=media,
                        author=author,
                    )
                )
            observation = data.observation
            if observation is not None:
                text, media = self._text(observation, level), observation.parts
                if media and level is not LevelOfDetail.LIVE:
                    text, media = without_media(text, media), None
                built.append(MessagePart(role=Role.USER, content=text, parts=media, author=author))
            parts = tuple(built)
        tokens = sum(self.estimator.estimate_part(p, self.model_hint) for p in parts)
        if head.role is Role.ASSISTANT and author is not None:
            tokens += self._peer_reserve(parts, author, tokens)
        return Rendering(level, parts, "", tokens)

    def _peer_reserve(self, parts: tuple[MessagePart, ...], author: Author, tokens: int) -> int:
        """What the block ``parts`` (``tokens``) written by agent ``author`` costs more when
        another agent of the session reads it as that agent's words: one user message
        ``[<agent> wrote:]`` with its tool calls and results as text (see
        :func:`~ce.core.integration.peer_turns_as_user`). Counted with the block whoever
        reads it (an agent that has not written in the session yet reads it so too), so the
        budget holds for every agent of a session agents share."""
        if author.kind is not AuthorKind.AGENT:
            return 0
        as_peer = MessagePart(
            role=Role.USER, content=peer_turn_text(to_openai_messages(parts), author.id)
        )
        return max(0, self.estimator.estimate_part(as_peer, self.model_hint) - tokens)

    def _refresh(self, index: int) -> None:
        """Render ``groups[index]`` again when next needed; the sums after it are brought up
        to date when next read (a session read whole refreshes many groups: each costs O(1)
        here, not a pass over the groups after it)."""
        self.groups[index].invalidate()
        if self._stale is None or index < self._stale:
            self._stale = index
