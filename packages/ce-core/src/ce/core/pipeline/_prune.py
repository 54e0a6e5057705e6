"""GreedyPriorityPruner: spend a token budget on candidate blocks.

Rules, in order:

1. ``must`` blocks (the instruction, the newest user message and the run's in-flight tool chain,
   plus any block whose priority the config lists as must-keep) are kept. When they do not fit,
   the in-flight tool results are degraded (Summary, then Gist) before giving up with
   :class:`~ce.core.errors.BudgetExceededError`. The retrieved documents they point to
   (a prompt that quoted a document holds a pointer to it) come next, outside the evidence
   share, each at the richest level that fits (see ``_pointed``).
2. The rest of the budget is spent tier by tier (high, medium, low). In a tier: context blocks
   (memory, task state, summary, custom blocks), then conversation newest first, then evidence
   newest first; evidence altogether may use at most ``evidence_share`` of what the must
   blocks leave. Conversation priority follows recency: the newest ``recent_high`` blocks are
   high, the next ``3 * recent_high`` medium, older ones low.
3. A block that does not fit at Live is degraded to Summary, then Gist, before it is dropped.
   A block past its priority's TTL is dropped.
4. Conversation stays a contiguous recent window that starts at a turn (a user message: the
   answers before the oldest kept question are given back): once a conversation block is
   dropped, every older one is dropped with it, in ONE decision whose ``block_count`` says
   how many blocks it covers (likewise messages covered by the rolling summary or removed by
   the app, and the older evidence of a tier once the budget, or the evidence share of it, is
   exhausted or 8 blocks in a row did not fit). The kept window is reported the same way:
   neighbouring messages kept (or degraded) for the same reason at the same level share one
   range decision, and the conversation's decisions come oldest first. So a turn costs work
   proportional to what is kept, not to the history, its report is a few decisions, and it
   still accounts for every candidate.

Everything is deterministic: same candidates, budget and rules give the same result.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from ce.core.errors import BudgetExceededError
from ce.core.pipeline._index import Candidate, Rendering, SessionIndex
from ce.core.pipeline._pointed import keep_pointed
from ce.core.pipeline._quotes import QUOTED_REASON
from ce.core.pipeline._same_text import SameTexts
from ce.core.schema import LevelOfDetail, Priority, PruneDecision

__all__ = [
    "REMOVED_BY_APP",
    "GreedyPriorityPruner",
    "PruneBudget",
    "PruneRequest",
    "PruneResult",
    "PruneRules",
]

_TIERS = (Priority.HIGH, Priority.MEDIUM, Priority.LOW)

REMOVED_BY_APP = "removed by the app"
"""The reason of the decision about the oldest messages the app removed from its history
(``ContextEngine.cut_history``): not sent, nothing stands for them."""
_UNANSWERED = "unanswered tool call: no result message or result evidence"
_MIN_EVIDENCE_TOKENS = 16
# Newest-first evidence walks stop after this many blocks in a row did not fit: what is
# older is dropped in one decision, so a turn never visits every evidence of a long session.
_MAX_EVIDENCE_MISSES = 8


@dataclass(frozen=True)
class PruneBudget:
    """``max_tokens``: what the kept blocks may cost in all."""

    max_tokens: int


@dataclass(frozen=True)
class PruneRules:
    """``must_keep_priorities`` are never dropped; ``ttl_seconds`` per priority; ``now`` is the
    instant TTLs are measured from (the turn's clock reading, for determinism);
    ``recent_high`` is how many newest conversation blocks count as high priority;
    ``evidence_share`` is the fraction of the budget left after the must blocks that
    evidence blocks may use, so retrieved documents cannot crowd out the conversation."""

    must_keep_priorities: tuple[Priority, ...] = (Priority.MUST,)
    ttl_seconds: dict[Priority, int] | None = None
    now: datetime | None = None
    recent_high: int = 6
    evidence_share: float = 0.5


@dataclass
class PruneRequest:
    """The candidates of one call.

    ``must``: blocks that must be kept (``degradable`` ones may be degraded when they alone do
    not fit). ``context``: memory / state / summary / custom blocks. Conversation comes from
    ``index.groups[hidden:tail_start]`` (``hidden`` groups are covered by the rolling summary,
    or the first ``removed`` of them removed by the app);
    evidence from ``index.evidence_tiers``. ``fixed_tokens`` are spent before any block (message
    overheads, reply priming); ``evidence_preamble_tokens`` are charged with the first evidence.
    """

    index: SessionIndex
    must: list[Candidate]
    degradable: set[str]
    context: list[Candidate]
    hidden: int
    tail_start: int
    fixed_tokens: int = 0
    evidence_preamble_tokens: int = 0
    excluded: dict[str, str] = field(default_factory=dict)
    """Evidence block ids left out before pruning (a resolved conflict), with the reason."""
    pinned: frozenset[int] = frozenset()
    """Conversation groups before ``tail_start`` that are in ``must`` (a run's own blocks,
    when other runs wrote to the session since its question): the history walk passes them
    by, and the history's range decisions leave them out."""
    removed: int = 0
    """How many of the ``hidden`` groups (the first ones) the app removed from its history
    rather than the rolling summary covering them (reported as :data:`REMOVED_BY_APP`)."""
    removed_evidences: int = 0
    """How many of the index's first evidences the app removed with its history when it
    cleared it: never sent (reported as :data:`REMOVED_BY_APP`)."""


@dataclass
class PruneResult:
    """``kept``: the chosen rendering of every kept block; ``decisions``: one per candidate
    (or per range of candidates); ``used_tokens``: the cost of ``kept`` plus fixed tokens."""

    kept: list[tuple[Candidate, Rendering]] = field(default_factory=list)
    decisions: list[PruneDecision] = field(default_factory=list)
    used_tokens: int = 0
    evidence_kept: int = 0
    history_open: bool = False
    """The history walk reached the oldest conversation block with room left: an older one
    (a session's blocks before the index's first) could still have been kept."""
    evidence_open: bool = False
    """An evidence tier's walk reached its oldest block with room left (likewise)."""


def _decision(
    block_id: str,
    action: _Action,
    reason: str,
    tokens: int,
    *,
    count: int = 1,
    level: LevelOfDetail | None = None,
    saved: int = 0,
) -> PruneDecision:
    # the validating constructor: pydantic-core builds it faster than model_construct
    return PruneDecision(
        block_id=block_id,
        action=action,
        reason=reason,
        token_estimate=tokens,
        block_count=count,
        level=level.value if level else None,
        saved_tokens=saved,
    )


_Action = Literal["kept", "dropped", "degraded"]
# a history group's outcome: action, reason, tokens, level, tokens saved by degrading
_Outcome = tuple[_Action, str, int, LevelOfDetail | None, int]
_LIVE = LevelOfDetail.LIVE
_NO_RESULT: _Outcome = ("dropped", _UNANSWERED, 0, None, 0)


def _walk_ranges(walk: dict[int, _Outcome], index: SessionIndex) -> list[tuple[int, PruneDecision]]:
    """The history walk's outcomes as decisions: neighbouring groups with the same action,
    reason and level share one range decision (``first..last``, ``block_count``), so the
    report of a long kept window is a few decisions, not one per message."""
    out: list[tuple[int, PruneDecision]] = []
    positions = sorted(walk)
    i, count = 0, len(positions)
    while i < count:
        first = positions[i]
        action, reason, tokens, level, saved = walk[first]
        j = i + 1
        while j < count and positions[j] == first + j - i:
            outcome = walk[positions[j]]
            if outcome[0] != action or outcome[1] != reason or outcome[3] != level:
                break
            tokens += outcome[2]
            saved += outcome[4]
            j += 1
        last = positions[j - 1]
        block_id = index.groups[first].block_id
        if last != first:
            block_id = f"{block_id}..{index.groups[last].block_id}"
        decision = _decision(
            block_id, action, reason, tokens, count=j - i, level=level, saved=saved
        )
        out.append((first, decision))
        i = j
    return out


class _Run:
    """The state of one pruning pass."""

    def __init__(self, request: PruneRequest, budget: PruneBudget, rules: PruneRules) -> None:
        self.request = request
        self.rules = rules
        self.result = PruneResult()
        self.remaining = budget.max_tokens - request.fixed_tokens
        self.evidence_room = 0
        self.budget = budget
        # the history walk's outcome per group index (decided in one pass, reported as ranges)
        self.at: int | None = None
        self.walk: dict[int, _Outcome] = {}
        self.same_texts = SameTexts(request.index)  # kept evidence blocks by text

    def decide(
        self,
        candidate: Candidate,
        action: _Action,
        reason: str,
        tokens: int,
        level: LevelOfDetail | None = None,
        saved: int = 0,
    ) -> None:
        if self.at is not None:
            self.walk[self.at] = (action, reason, tokens, level, saved)
        else:
            self.result.decisions.append(
                _decision(candidate.block_id, action, reason, tokens, level=level, saved=saved)
            )

    def expired(self, candidate: Candidate, priority: Priority) -> int | None:
        ttl = (self.rules.ttl_seconds or {}).get(priority)
        now = self.rules.now
        if ttl is None or now is None or candidate.at is None:
            return None
        return ttl if now - candidate.at > timedelta(seconds=ttl) else None

    def keep(
        self,
        candidate: Candidate,
        rendering: Rendering,
        reason: str,
        extra: int = 0,
        saved: int = 0,
    ) -> None:
        """Keep ``candidate`` as ``rendering``, charging ``extra`` tokens besides it;
        ``saved``: what a Live-level rendering other than the block's own Live one saves (a
        pointer to a block that holds its text)."""
        if candidate.kind == "conversation" and not rendering.parts:
            # an assistant message of nothing but tool calls that have no result: nothing of
            # it reaches the model, and the report says so
            self.decide(candidate, "dropped", _UNANSWERED, 0)
            return
        cost = rendering.tokens + extra
        self.remaining -= cost
        self.result.kept.append((candidate, rendering))
        if rendering.level is LevelOfDetail.LIVE:
            self.decide(candidate, "kept", reason, cost, rendering.level, saved)
        else:
            saved = candidate.live.tokens - rendering.tokens
            self.decide(candidate, "degraded", reason, cost, rendering.level, saved)

    def redo(
        self, kept_at: int, decided_at: int, rendering: Rendering, reason: str, extra: int
    ) -> None:
        """Send the block kept ``kept_at``-th (decided ``decided_at``-th) as ``rendering``
        instead, with the decision saying ``reason`` (evidence whose text another block now
        holds: see :class:`SameTexts`)."""
        candidate, before = self.result.kept[kept_at]
        self.remaining -= rendering.tokens - before.tokens
        self.result.kept[kept_at] = (candidate, rendering)
        self.result.decisions[decided_at] = _decision(
            candidate.block_id,
            "kept",
            reason,
            rendering.tokens + extra,
            level=rendering.level,
            saved=candidate.live.tokens - rendering.tokens,
        )

    def try_fit(
        self,
        candidate: Candidate,
        priority: Priority,
        extra: int = 0,
        room: int | None = None,
        note: str = "",
    ) -> bool:
        """Keep ``candidate`` at the richest level that fits in ``room`` (default: what is
        left of the budget); False when it was dropped. ``note`` ends the decision's reason."""
        left = self.remaining if room is None else min(room, self.remaining)
        ttl = self.expired(candidate, priority)
        live = candidate.live
        if ttl is not None:
            self.decide(
                candidate,
                "dropped",
                f"expired: older than the {ttl} s TTL of priority {priority.value}",
                live.tokens,
            )
            return False
        if live.tokens + extra <= left:
            reason = f"fits (priority {priority.value})"
            if self.at is not None and self.at in self.request.index.quoted:
                reason += QUOTED_REASON
            self.keep(candidate, live, reason + note, extra)
            return True
        for cheaper in candidate.cheaper():
            if cheaper.tokens + extra <= left:
                self.keep(
                    candidate,
                    cheaper,
                    f"degraded (priority {priority.value}): live needs {live.tokens + extra}"
                    f" tokens, {left} left{note}",
                    extra,
                )
                return True
        self.decide(
            candidate,
            "dropped",
            f"does not fit at any level (priority {priority.value}): {left} tokens left{note}",
            live.tokens,
        )
        return False

    def tier_end(self, tier: Priority) -> int | None:
        """The rank (0: the newest conversation block) where ``tier`` ends, None for the
        lowest: the newest ``recent_high`` blocks are high, the next ``3 * recent_high``
        medium, older ones low."""
        high = self.rules.recent_high
        return {Priority.HIGH: high, Priority.MEDIUM: 4 * high}.get(tier)


def _unpinned(start: int, stop: int, pinned: frozenset[int]) -> list[tuple[int, int]]:
    """``range(start, stop)`` without the ``pinned`` groups, as ``(start, stop)`` runs (work
    proportional to the pinned groups, not to the range)."""
    runs = []
    for group in sorted(g for g in pinned if start <= g < stop):
        if group > start:
            runs.append((start, group))
        start = group + 1
    if start < stop:
        runs.append((start, stop))
    return runs


def _evidence_span(blocks: Sequence[Candidate], start: int, stop: int) -> str:
    """The block id of ``blocks[start:stop]``: one id, or ``first..last``."""
    first = blocks[start].block_id
    return first if stop - start == 1 else f"{first}..{blocks[stop - 1].block_id}"


def _span(index: SessionIndex, start: int, stop: int) -> str:
    """The block id of ``groups[start:stop]``: one id, or ``first..last``."""
    first = index.groups[start].block_id
    return first if stop - start == 1 else f"{first}..{index.groups[stop - 1].block_id}"


class GreedyPriorityPruner:
    """Keeps ``must``, then spends the budget by priority and recency (see the module doc)."""

    def prune(self, request: PruneRequest, budget: PruneBudget, rules: PruneRules) -> PruneResult:
        run = _Run(request, budget, rules)
        index = request.index
        must_keep = set(rules.must_keep_priorities)
        self._keep_must(
            run, [*request.must, *(c for c in request.context if c.priority in must_keep)]
        )
        pointed = keep_pointed(run)
        run.evidence_room = int(run.remaining * rules.evidence_share)

        cursor = request.tail_start - 1
        conversation_open = True
        for tier in _TIERS:
            if tier in must_keep:
                continue
            for candidate in request.context:
                if candidate.priority is tier:
                    run.try_fit(candidate, tier)
            if conversation_open:
                cursor, conversation_open = self._walk(run, cursor, tier)
            self._evidence(run, tier, pointed.get(tier, set()))
        run.result.history_open = conversation_open and cursor < 0
        history: list[tuple[int, PruneDecision]] = []  # (first group, decision)
        cursor = self._start_at_a_turn(run, cursor, history)
        for start, stop in _unpinned(request.hidden, cursor + 1, request.pinned):
            history.append(
                (
                    start,
                    _decision(
                        _span(index, start, stop),
                        "dropped",
                        "older than a dropped block: the kept history stays contiguous",
                        index.group_tokens(start, stop),
                        count=stop - start,
                    ),
                )
            )
        removed = min(request.removed, request.hidden)
        for start, stop, reason in (
            (0, removed, REMOVED_BY_APP),
            (removed, request.hidden, "covered by the rolling summary"),
        ):
            if stop > start:
                first, last = index.groups[start], index.groups[stop - 1]
                history.append(
                    (
                        start,
                        _decision(
                            f"{first.block_id}..{last.block_id}",
                            "dropped",
                            reason,
                            index.group_tokens(start, stop),
                            count=stop - start,
                        ),
                    )
                )
        history.extend(_walk_ranges(run.walk, index))
        history.sort(key=lambda item: item[0])
        run.result.decisions.extend(decision for _, decision in history)
        run.result.used_tokens = budget.max_tokens - run.remaining
        return run.result

    def _walk(self, run: _Run, cursor: int, tier: Priority) -> tuple[int, bool]:
        """Walk the conversation newest first from group ``cursor`` while its groups are of
        ``tier``; the next group to decide and whether the walk may go on. Groups that fit at
        Live are decided right here (the common case): with no TTL, the run of them that fits
        (down to the next pinned group) is found at once from the index's sums; the others (a
        TTL to check, a degraded level to find) go through :meth:`_Run.try_fit`."""
        request = run.request
        index = request.index
        groups = index.groups
        pinned = request.pinned
        walk = run.walk
        kept = run.result.kept
        stop = request.hidden - 1  # the walk ends before this group
        end = run.tier_end(tier)
        if end is not None:
            stop = max(stop, request.tail_start - 1 - end)
        ttl = (run.rules.ttl_seconds or {}).get(tier)
        fits = f"fits (priority {tier.value})"
        while cursor > stop:
            if cursor in pinned:  # kept with the must blocks
                cursor -= 1
                continue
            if ttl is None:  # the run down to the next pinned group that fits at Live
                low = max((g + 1 for g in pinned if g < cursor), default=stop + 1)
                first = index.live_start(max(low, stop + 1), cursor + 1, run.remaining)
                if first <= cursor:
                    run.remaining -= index.group_tokens(first, cursor + 1)
                    span = range(cursor, first - 1, -1)
                    lives = index.lives(first, cursor + 1)[::-1]
                    kept.extend(
                        (groups[i], live) for i, live in zip(span, lives, strict=True) if live.parts
                    )
                    quoted = index.quoted
                    for i, live in zip(span, lives, strict=True):
                        reason = fits + QUOTED_REASON if i in quoted else fits
                        walk[i] = (
                            ("kept", reason, live.tokens, _LIVE, 0) if live.parts else _NO_RESULT
                        )
                    cursor = first - 1
                    continue
            # a group with a TTL to check, or one that does not fit at Live
            run.at = cursor
            fitted = run.try_fit(groups[cursor], tier)
            run.at = None
            if not fitted:
                return cursor - 1, False
            cursor -= 1
        return cursor, True

    def _start_at_a_turn(
        self, run: _Run, cursor: int, history: list[tuple[int, PruneDecision]]
    ) -> int:
        """When the budget cut the history (``cursor``: the newest conversation block not
        decided yet), the kept window must not open with answers whose question was dropped:
        give back the kept blocks before its first user message, in one decision (added to
        ``history``). Returns ``cursor``."""
        request, index = run.request, run.request.index
        walk = run.walk
        pinned = request.pinned
        first = cursor + 1
        while first < request.tail_start and (
            first in pinned or walk.get(first, ("dropped",))[0] == "dropped"
        ):
            first += 1  # blocks that did not fit (each has its own decision), pinned ones
        if first <= request.hidden:
            return cursor  # nothing was cut (or only the summary's range precedes)
        stop = first
        while stop < request.tail_start and not index.opens_turn(stop):
            stop += 1
        for start, end in _unpinned(first, stop, pinned):
            tokens = sum(walk.pop(i)[2] for i in range(start, end) if i in walk)
            dropped = {index.groups[i].block_id for i in range(start, end)}
            run.result.kept = [(c, r) for c, r in run.result.kept if c.block_id not in dropped]
            run.remaining += tokens
            history.append(
                (
                    start,
                    _decision(
                        _span(index, start, end),
                        "dropped",
                        "turn boundary: the user message it answers was dropped",
                        tokens,
                        count=end - start,
                    ),
                )
            )
        return cursor

    def _keep_must(self, run: _Run, must: Sequence[Candidate]) -> None:
        chosen = [c.live for c in must]
        total = sum(r.tokens for r in chosen)
        degradable = run.request.degradable
        for i, candidate in enumerate(must):
            if total <= run.remaining:
                break
            if candidate.block_id not in degradable:
                continue
            for cheaper in candidate.cheaper():
                total -= chosen[i].tokens - cheaper.tokens
                chosen[i] = cheaper
                if total <= run.remaining:
                    break
        if total > run.remaining:
            raise BudgetExceededError(
                f"the must-keep blocks need {total} tokens even degraded, but the budget leaves "
                f"{run.remaining} (budget {run.budget.max_tokens}, {run.request.fixed_tokens} "
                "fixed)"
            )
        for candidate, rendering in zip(must, chosen, strict=False):
            reason = (
                "must keep"
                if rendering.level is LevelOfDetail.LIVE
                else (f"must keep, degraded: live needs {candidate.live.tokens} tokens")
            )
            run.keep(candidate, rendering, reason)

    def _evidence(self, run: _Run, tier: Priority, pointed: set[int]) -> None:
        """Walk ``tier``'s evidence newest first (``pointed``: the places of the blocks the
        prompt points to, decided before)."""
        index = run.request.index
        blocks = index.evidence_tiers[tier]
        texts, same = index.evidence_texts, run.same_texts
        # the tier's blocks are in the session's order: those the app cleared come first
        cleared = run.request.removed_evidences
        first = bisect_left(blocks, cleared, key=lambda block: block.position) if cleared else 0
        if first:
            run.result.decisions.append(
                _decision(
                    _evidence_span(blocks, 0, first),
                    "dropped",
                    REMOVED_BY_APP,
                    index.evidence_tokens(tier, 0, first),
                    count=first,
                )
            )
        misses = 0
        for position in range(len(blocks) - 1, first - 1, -1):
            if position in pointed:
                continue
            room = min(run.remaining, run.evidence_room)
            if room < _MIN_EVIDENCE_TOKENS or misses >= _MAX_EVIDENCE_MISSES:
                share = run.evidence_room < run.remaining
                reason = (
                    f"evidence share of the budget ({run.rules.evidence_share:.0%}) used"
                    if share
                    else "budget exhausted"
                ) + f" before older {tier.value}-priority evidence"
                for start, stop in _unpinned(first, position + 1, frozenset(pointed)):
                    run.result.decisions.append(
                        _decision(
                            _evidence_span(blocks, start, stop),
                            "dropped",
                            reason,
                            index.evidence_tokens(tier, start, stop),
                            count=stop - start,
                        )
                    )
                break
            candidate = blocks[position]
            left_out = run.request.excluded.get(candidate.block_id)
            if left_out is not None:
                run.decide(candidate, "dropped", left_out, candidate.live.tokens)
                continue
            preamble = run.request.evidence_preamble_tokens if not run.result.evidence_kept else 0
            before = run.remaining
            text = texts[candidate.block_id]
            if (text in same.first and same.keep(run, candidate, text, room, tier)) or run.try_fit(
                candidate, tier, preamble, room
            ):
                run.result.evidence_kept += 1
                run.evidence_room -= before - run.remaining
                misses = 0
                if text not in same.first:
                    kept, rendering = run.result.kept[-1]
                    if kept is candidate and rendering.level is _LIVE:  # kept whole by try_fit
                        same.first[text] = candidate
            else:
                misses += 1
        else:  # every block of the tier was visited and the walk could have gone on
            if (
                not cleared
                and min(run.remaining, run.evidence_room) >= _MIN_EVIDENCE_TOKENS
                and (misses < _MAX_EVIDENCE_MISSES)
            ):
                run.result.evidence_open = True
