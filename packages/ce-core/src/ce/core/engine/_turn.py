"""Selecting and assembling one model input from a session (shared by prepare and replay)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ce.core.config import RuntimeConfig
from ce.core.errors import BudgetExceededError
from ce.core.pipeline import (
    EVIDENCE_PREAMBLE,
    REMOVED_BY_APP,
    Assembler,
    Candidate,
    ConflictTracker,
    DefaultRenderer,
    GreedyPriorityPruner,
    JsonFieldDetector,
    PruneBudget,
    PruneRequest,
    PruneRules,
    Rendering,
    Resolution,
    SessionEvidenceResolver,
    SessionIndex,
    resolve_conflicts,
    shorten,
    without_dangling,
)
from ce.core.schema import (
    AssembledInput,
    BlockType,
    ConflictRecord,
    Evidence,
    LevelOfDetail,
    MessagePart,
    Priority,
    PruneDecision,
    Role,
    SessionDocument,
    Summary,
)
from ce.core.state import NOTEBOOK_BLOCK_ID, MemoryNotebookWidget, StateView, TaskListWidget

__all__ = ["Selection", "Unread", "select_and_assemble"]

_CONTEXT_ORDER = {
    BlockType.INSTRUCTION: 0,
    BlockType.MEMORY: 1,
    BlockType.STATE: 2,
    BlockType.PLAN: 3,
    BlockType.CONVERSATION: 4,
    BlockType.EVIDENCE: 5,
}


@dataclass
class Selection:
    """The assembled input of one call and how it was decided."""

    assembled: AssembledInput
    decisions: list[PruneDecision]
    budget: int
    candidate_count: int
    evidence_kept: int
    degradations: list[tuple[str, str]] = field(default_factory=list)
    conflicts: list[ConflictRecord] = field(default_factory=list)
    degraded_blocks: list[str] = field(default_factory=list)  # conversation blocks below Live
    short: bool = False
    """The index holds the session's newest part only, and more of it could have been kept:
    select again from a longer part."""


@dataclass(frozen=True)
class Unread:
    """What a selection from the newest part of a session did not read: how many messages
    and evidences are stored before it, the evidences among those that may state facts
    (conflicts are found across the whole session) and how many of those messages are
    system messages."""

    messages: int = 0
    evidences: int = 0
    fact_sources: tuple[Evidence, ...] = ()
    system_messages: int = 0


def _text_candidate(
    index: SessionIndex,
    block_id: str,
    block_type: BlockType,
    priority: Priority,
    text: str,
    position: int,
) -> Candidate:
    def build(level: LevelOfDetail) -> Rendering:
        shown = text if block_type is BlockType.INSTRUCTION else shorten(text, level)
        return Rendering(level, (), shown, index.section_tokens(shown))

    return Candidate(block_id, block_type, "context", priority, position, None, build)


async def _context_candidates(
    index: SessionIndex, doc: SessionDocument, degradations: list[tuple[str, str]]
) -> list[Candidate]:
    view = StateView(doc)
    out: list[Candidate] = []
    notebook = MemoryNotebookWidget().render_live_screen(view)
    if notebook:
        out.append(
            _text_candidate(index, NOTEBOOK_BLOCK_ID, BlockType.MEMORY, Priority.HIGH, notebook, 0)
        )
    tasks = TaskListWidget().render_live_screen(view)
    if tasks:
        out.append(_text_candidate(index, "widget:tasks", BlockType.STATE, Priority.HIGH, tasks, 1))
    renderer = DefaultRenderer(index.estimator, index.model_hint)
    resolver = SessionEvidenceResolver(doc.evidences)
    for position, block in enumerate(doc.context_blocks, start=2):
        if block.block_id == NOTEBOOK_BLOCK_ID:
            continue
        rendered = await renderer.render_block(block, resolver, degraded=degradations)
        if rendered.rendered_content:
            out.append(
                _text_candidate(
                    index,
                    block.block_id,
                    block.block_type,
                    block.priority,
                    rendered.rendered_content,
                    position,
                )
            )
    summary = doc.session.summary
    if summary is not None and summary.source == "engine":  # an app's cut renders nothing
        text = f"## Summary of earlier conversation\n{summary.content}"
        out.append(
            _text_candidate(
                index, "summary", BlockType.CONVERSATION, Priority.HIGH, text, len(out) + 2
            )
        )
    return out


async def select_and_assemble(
    index: SessionIndex,
    doc: SessionDocument,
    config: RuntimeConfig,
    *,
    now: datetime | None,
    tool_schemas: list[dict[str, Any]] | None = None,
    unread: Unread | None = None,
    own_run: Iterable[int] = (),
) -> Selection:
    """Derive, prune, render and assemble the input for the session's current state.

    The call's run starts at the session's newest user message: from there on every block
    is kept (degraded if need be), so a run's in-flight tool chain reaches its model whole.
    ``own_run``: the groups of this call's own run when other runs wrote to the session since
    its question (its question, its tool calls with their results): they are kept likewise.

    ``index`` must hold every record of ``doc``. ``doc`` and ``index`` may hold the newest
    part of the session only (``unread`` says what they lack): the selection is then the
    same as from the whole session unless it is ``short``. Raises
    :class:`BudgetExceededError` when the tool schemas or the must-keep blocks alone exceed
    the budget.
    """
    unread = unread or Unread()
    index.settle()
    estimator, hint = index.estimator, index.model_hint
    tools_tokens = estimator.estimate_tools(tool_schemas or [], hint)
    budget = config.budget.context_tokens - tools_tokens
    if budget <= 0:
        raise BudgetExceededError(
            f"the tool schemas alone need {tools_tokens} tokens of the "
            f"{config.budget.context_tokens}-token budget"
        )
    degradations: list[tuple[str, str]] = []
    must: list[Candidate] = []
    instruction = index.instruction
    if instruction is not None:
        must.append(
            _text_candidate(
                index, "instruction", BlockType.INSTRUCTION, Priority.MUST, instruction.content, -1
            )
        )
    context = await _context_candidates(index, doc, degradations)
    resolution = Resolution()
    if config.conflicts.enabled:
        tracker = _conflict_tracker(index, doc, config.conflicts.entity_keys, unread)
        known = tracker.lookup(doc.evidences)
        taken_back = doc.session.summary
        if taken_back is not None and taken_back.withdrawn:
            known = _Sent(known, taken_back)
        resolution = resolve_conflicts(tracker.conflicts(), known, config.conflicts.policy)
        if resolution.note:
            context.append(
                _text_candidate(
                    index,
                    "conflicts",
                    BlockType.STATE,
                    Priority.HIGH,
                    resolution.note,
                    len(context) + 2,
                )
            )
    groups = index.groups
    tail_start = index.last_user_group if index.last_user_group is not None else len(groups)
    summary = doc.session.summary
    clear = summary.cleared if summary is not None else None
    if clear and tail_start < len(groups) and groups[tail_start].position < clear.messages:
        tail_start = len(groups)  # the newest question was cleared: no run goes on
    hidden = removed = 0
    cleared = clear.evidences if clear is not None else 0
    if summary is not None:
        hidden = min(index.first_group_after(summary.message_index_range.to_index), tail_start)
        if summary.removed_by_app:
            removed = min(index.first_group_after(summary.removed_by_app - 1), hidden)
    pinned = frozenset(g for g in own_run if hidden <= g < tail_start)
    tail = groups[tail_start:]
    must.extend(groups[g] for g in sorted(pinned))
    must.extend(tail)
    request = PruneRequest(
        index=index,
        must=must,
        degradable={c.block_id for c in tail[1:]} | {groups[g].block_id for g in pinned},
        pinned=pinned,
        context=context,
        hidden=hidden,
        removed=removed,
        removed_evidences=max(0, cleared - unread.evidences),
        tail_start=tail_start,
        fixed_tokens=estimator.reply_priming(hint)
        + estimator.estimate_message(Role.SYSTEM, "", hint),
        evidence_preamble_tokens=index.section_tokens(EVIDENCE_PREAMBLE),
        excluded={f"ev:{e}": reason for e, reason in resolution.excluded.items()},
    )
    ttl = {Priority(k): v for k, v in (config.prune.ttl_seconds or {}).items()}
    rules = PruneRules(
        must_keep_priorities=tuple(config.prune.must_keep_priorities),
        ttl_seconds=ttl or None,
        now=now,
        recent_high=config.prune.recent_messages_high,
        evidence_share=config.prune.evidence_share,
    )
    result = GreedyPriorityPruner().prune(request, PruneBudget(budget), rules)
    kept = result.kept
    decisions = result.decisions
    covered = summary is not None and summary.message_index_range.to_index >= unread.messages - 1
    short = (result.history_open and unread.messages > 0 and not covered) or (
        result.evidence_open and unread.evidences > 0
    )
    cut = summary.removed_by_app if summary is not None else 0
    decisions = [*_unread_decisions(unread, covered, cut, cleared), *decisions]
    if summary is not None and summary.withdrawn:
        decisions.extend(_withdrawn_decisions(summary, index.withdrawn_evidences))
    assembler = Assembler(estimator)
    while True:
        kept = without_dangling(kept, index)
        assembled = _assemble(assembler, kept, hint)
        if assembled.total_tokens <= budget:
            break
        # Counting each system section on its own can miss a token where sections join; give
        # back the last optional section kept until the exact count fits.
        removable = [i for i, (c, _) in enumerate(kept) if c.kind in ("context", "evidence")]
        removable = [i for i in removable if kept[i][0].priority is not Priority.MUST]
        if not removable:
            raise BudgetExceededError(
                f"the assembled input needs {assembled.total_tokens} tokens, budget {budget}"
            )
        candidate, _rendering = kept.pop(removable[-1])
        decisions = [
            d
            if d.block_id != candidate.block_id
            else d.model_copy(
                update={
                    "action": "dropped",
                    "reason": "removed after the exact count of the assembled input",
                    "level": None,
                }
            )
            for d in decisions
        ]
    candidates = (
        len(must)
        + len(context)
        + tail_start
        + sum(len(tier) for tier in index.evidence_tiers.values())
        + unread.messages
        + unread.evidences
    )
    return Selection(
        assembled=assembled,
        decisions=decisions,
        budget=budget,
        candidate_count=candidates,
        evidence_kept=sum(1 for c, _ in kept if c.kind == "evidence"),
        degradations=degradations,
        conflicts=resolution.records,
        degraded_blocks=[
            c.block_id
            for c, r in kept
            if c.kind == "conversation" and r.level is not LevelOfDetail.LIVE
        ],
        short=short,
    )


def _withdrawn_decisions(summary: Summary, evidence_ids: list[str]) -> list[PruneDecision]:
    """One decision for each span of turns the app took back (see ``WithdrawnTurns``), and
    one for the evidences that came with them (``evidence_ids``, in the session's order)."""
    decisions = [
        PruneDecision(
            block_id=f"withdrawn:{span.from_index}..{span.to_index - 1}",
            action="dropped",
            reason=f"{REMOVED_BY_APP}: the app went back to an earlier point of its"
            f" conversation; {span.to_index - span.from_index} messages taken back",
            token_estimate=0,
            block_count=span.to_index - span.from_index,
        )
        for span in summary.withdrawn
    ]
    if evidence_ids:
        first, last = evidence_ids[0], evidence_ids[-1]
        decisions.append(
            PruneDecision(
                block_id=f"ev:{first}" if first == last else f"ev:{first}..ev:{last}",
                action="dropped",
                reason=f"{REMOVED_BY_APP}: retrieved for turns the app took back",
                token_estimate=0,
                block_count=len(evidence_ids),
            )
        )
    return decisions


def _unread_decisions(
    unread: Unread, covered: bool, removed: int = 0, removed_evidences: int = 0
) -> list[PruneDecision]:
    """The decisions about what a selection from the newest part of a session did not read:
    older than what it kept (or covered by the rolling summary; the first ``removed``
    messages and ``removed_evidences`` evidences of them removed by the app), so not read
    from the store."""
    out = []
    spans = []
    if unread.messages:
        removed = min(removed, unread.messages)
        if removed:
            spans.append((0, removed, REMOVED_BY_APP))
        if unread.messages > removed:
            reason = "covered by the rolling summary" if covered else "older than the kept history"
            spans.append((removed, unread.messages, reason))
    for start, stop, reason in spans:
        out.append(
            PruneDecision(
                block_id=f"history:{start}..{stop - 1}",
                action="dropped",
                reason=f"{reason}: {stop - start} older messages not read (nor counted)",
                token_estimate=0,
                block_count=stop - start,
            )
        )
    removed_evidences = min(removed_evidences, unread.evidences)
    spans = []
    if removed_evidences:
        spans.append((0, removed_evidences, REMOVED_BY_APP))
    if unread.evidences > removed_evidences:
        spans.append((removed_evidences, unread.evidences, "older than the evidence kept"))
    for start, stop, reason in spans:
        out.append(
            PruneDecision(
                block_id=f"evidences:{start}..{stop - 1}",
                action="dropped",
                reason=f"{reason}: {stop - start} evidences not read (nor counted)",
                token_estimate=0,
                block_count=stop - start,
            )
        )
    return out


class _Sent(Mapping[str, Evidence]):
    """The evidences of ``evidences`` that may be sent: not those that came with turns the
    app took back (their facts conflict with nothing)."""

    def __init__(self, evidences: Mapping[str, Evidence], summary: Summary) -> None:
        self._evidences = evidences
        self._summary = summary

    def __getitem__(self, evidence_id: str) -> Evidence:
        evidence = self._evidences[evidence_id]
        if self._summary.withdraws_evidence(evidence):
            raise KeyError(evidence_id)
        return evidence

    def __iter__(self) -> Iterator[str]:
        withdrawn = self._summary.withdraws_evidence
        return (k for k, e in self._evidences.items() if not withdrawn(e))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _conflict_tracker(
    index: SessionIndex, doc: SessionDocument, entity_keys: tuple[str, ...], unread: Unread
) -> ConflictTracker:
    """The index's tracker of conflicting facts for ``entity_keys``, caught up with the
    session's evidences (each one read once; a new tracker after a compliance delete)."""
    tracker = index.conflict_trackers.get(entity_keys)
    if tracker is None or not tracker.catch_up(doc.evidences):
        tracker = ConflictTracker(JsonFieldDetector(entity_keys))
        tracker.seed(unread.fact_sources)
        tracker.catch_up(doc.evidences)
        index.conflict_trackers[entity_keys] = tracker
    return tracker


def _assemble(
    assembler: Assembler, kept: list[tuple[Candidate, Rendering]], hint: str | None
) -> AssembledInput:
    sections = [(c, r) for c, r in kept if c.kind != "conversation"]
    context = sorted(
        (item for item in sections if item[0].kind == "context"),
        key=lambda item: (_CONTEXT_ORDER.get(item[0].block_type, 9), item[0].position),
    )
    evidence = sorted(
        (item for item in sections if item[0].kind == "evidence"),
        key=lambda item: item[0].position,
    )
    texts = [r.text for _, r in context]
    if evidence:
        texts.append(EVIDENCE_PREAMBLE)
        texts.extend(r.text for _, r in evidence)
    conversation: list[MessagePart] = []
    tokens = 0  # each rendering holds the count of its parts
    for _, rendering in sorted(
        ((c, r) for c, r in kept if c.kind == "conversation"), key=lambda item: item[0].position
    ):
        conversation.extend(rendering.parts)
        tokens += rendering.tokens
    return assembler.assemble(texts, conversation, hint, conversation_tokens=tokens)
