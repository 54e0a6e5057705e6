"""Evidences with the same text, sent once in a pruning pass.

Two retrievers, sources or indexes returning one passage give the session two evidences with
one text. The pass keeps one of them whole and each other one it keeps as its own fenced block
(its id and source) holding :data:`~ce.core.pipeline._quotes.SAME_TEXT_POINTER`. The whole
copy is the oldest one kept: a prompt that quoted the text names the oldest evidence of it
(see the engine's quoted documents), so its pointer leads to the text itself. The evidence is
walked newest first, so when an older copy is met after a newer one was kept, the older one
takes the text over (when that fits) and the others are kept again as pointers to it. Copies
are decided once kept, so a pointer never names a block left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ce.core.pipeline._index import Candidate, Rendering, SessionIndex
from ce.core.pipeline._quotes import SAME_TEXT_REASON
from ce.core.schema import Priority

if TYPE_CHECKING:
    from ce.core.pipeline._prune import _Run

__all__ = ["SameTexts"]


@dataclass
class _Copy:
    """One kept evidence block of a text: where the pass holds it, and the tokens its cost
    includes besides its rendering (the evidence section's preamble, for the first kept)."""

    candidate: Candidate
    kept_at: int
    decided_at: int
    extra: int

    @property
    def evidence_id(self) -> str:
        return _evidence_id(self.candidate)


def _evidence_id(candidate: Candidate) -> str:
    """The evidence an evidence block (``ev:<id>``) renders."""
    return candidate.block_id.removeprefix("ev:")


@dataclass
class _Group:
    whole: _Copy
    pointers: list[_Copy] = field(default_factory=list)


class SameTexts:
    """The kept evidence blocks of one pruning pass, grouped by text. ``first``: the first
    block of each text the pass kept whole (noted by the pruner as it keeps one: nothing else
    is built until a second block of that text comes, which is rare)."""

    def __init__(self, index: SessionIndex) -> None:
        self._index = index
        self.first: dict[str, Candidate] = {}
        self._groups: dict[str, _Group] = {}

    def keep(self, run: _Run, candidate: Candidate, text: str, room: int, tier: Priority) -> bool:
        """Keep ``candidate``, a block of ``text`` (one of :attr:`first`), within ``room``:
        as the whole copy, the others pointing to it (when it is older than that copy: a
        higher-priority tier, walked first, may hold a newer one), or else as a pointer to
        the whole copy. False when it expired, or neither fits or costs less than the text
        (a short text goes whole each time)."""
        if run.expired(candidate, tier) is not None:
            return False
        group = self._groups.get(text)
        if group is None:
            group = self._groups[text] = _Group(self._held(run, self.first[text]))
        older = candidate.position < group.whole.candidate.position  # tiers go by confidence
        if older and self._take_over(run, group, candidate, room):
            return True
        whole = group.whole.evidence_id
        pointer = self._index.evidence_pointer(candidate.block_id, whole)
        if pointer.tokens > room or pointer.tokens >= candidate.live.tokens:
            return False
        saved = candidate.live.tokens - pointer.tokens
        run.keep(candidate, pointer, SAME_TEXT_REASON.format(evidence_id=whole), saved=saved)
        group.pointers.append(self._newest(run))
        return True

    def _take_over(self, run: _Run, group: _Group, candidate: Candidate, room: int) -> bool:
        members = [group.whole, *group.pointers]
        new_id = _evidence_id(candidate)
        renders: list[Rendering] = []
        delta = candidate.live.tokens
        for member in members:
            pointer = self._index.evidence_pointer(member.candidate.block_id, new_id)
            if pointer.tokens >= member.candidate.live.tokens:
                return False
            renders.append(pointer)
            delta += pointer.tokens - run.result.kept[member.kept_at][1].tokens
        if delta > room:
            return False
        reason = SAME_TEXT_REASON.format(evidence_id=new_id)
        for member, pointer in zip(members, renders, strict=True):
            run.redo(member.kept_at, member.decided_at, pointer, reason, member.extra)
        run.keep(candidate, candidate.live, "fits; the other blocks of its text point here")
        group.whole, group.pointers = self._newest(run), members
        return True

    @staticmethod
    def _copy(run: _Run, kept_at: int, decided_at: int) -> _Copy:
        candidate, rendering = run.result.kept[kept_at]
        extra = run.result.decisions[decided_at].token_estimate - rendering.tokens
        return _Copy(candidate, kept_at, decided_at, extra)

    @classmethod
    def _newest(cls, run: _Run) -> _Copy:
        """The block the pass kept last."""
        return cls._copy(run, len(run.result.kept) - 1, len(run.result.decisions) - 1)

    @classmethod
    def _held(cls, run: _Run, candidate: Candidate) -> _Copy:
        """Where the pass holds ``candidate``, kept earlier."""
        kept = run.result.kept
        kept_at = next(i for i in range(len(kept) - 1, -1, -1) if kept[i][0] is candidate)
        decisions = run.result.decisions
        block_id = candidate.block_id
        decided_at = next(
            i for i in range(len(decisions) - 1, -1, -1) if decisions[i].block_id == block_id
        )
        return cls._copy(run, kept_at, decided_at)
