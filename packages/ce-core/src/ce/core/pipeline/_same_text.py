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
        return self.candidate.block_id.removeprefix("ev:")


@dataclass
class _Group:
    whole: _Copy
    pointers: list[_Copy] = field(default_factory=list)


class SameTexts:
    """The kept evidence blocks of one pruning pass, grouped by text."""

    def __init__(self, index: SessionIndex) -> None:
        self._index = index
        self._groups: dict[str, _Group] = {}

    def kept_whole(self, run: _Run, candidate: Candidate) -> None:
        """Note ``candidate``, just kept at its Live level (the pass's newest kept block), as
        the whole copy of its text if it has none yet."""
        text = self._index.evidence_text(candidate.block_id)
        if text not in self._groups:
            self._groups[text] = _Group(self._copy(run, candidate))

    def keep(self, run: _Run, candidate: Candidate, room: int) -> bool:
        """Keep ``candidate`` within ``room`` as a copy of a text the pass kept already: as
        the whole copy, the others pointing to it (when it is older than that copy: a
        higher-priority tier, walked first, may hold a newer one), or else as a pointer to the
        whole copy. False when its text was not kept, or neither fits or
        costs less than the text (a short text goes whole each time)."""
        if not self._groups:
            return False
        group = self._groups.get(self._index.evidence_text(candidate.block_id))
        if group is None:
            return False
        older = candidate.position < group.whole.candidate.position  # tiers go by confidence
        if older and self._take_over(run, group, candidate, room):
            return True
        whole = group.whole.evidence_id
        pointer = self._index.evidence_pointer(candidate.block_id, whole)
        if pointer.tokens > room or pointer.tokens >= candidate.live.tokens:
            return False
        run.keep(candidate, pointer, SAME_TEXT_REASON.format(evidence_id=whole))
        group.pointers.append(self._copy(run, candidate))
        return True

    def _take_over(self, run: _Run, group: _Group, candidate: Candidate, room: int) -> bool:
        members = [group.whole, *group.pointers]
        new_id = candidate.block_id.removeprefix("ev:")
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
        group.whole, group.pointers = self._copy(run, candidate), members
        return True

    @staticmethod
    def _copy(run: _Run, candidate: Candidate) -> _Copy:
        kept_at, decided_at = len(run.result.kept) - 1, len(run.result.decisions) - 1
        extra = run.result.decisions[decided_at].token_estimate - run.result.kept[kept_at][1].tokens
        return _Copy(candidate, kept_at, decided_at, extra)
