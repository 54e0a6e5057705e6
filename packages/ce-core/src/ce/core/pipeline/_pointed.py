"""Retrieved documents a prompt points to.

A prompt that quoted a retrieved document whole holds a :func:`~ce.core.pipeline.document_pointer`
instead of its text, and the document goes once, fenced as evidence. Two rules keep the model
from reading a pointer to nothing:

* the documents the call's own prompt points to (its must-keep blocks: the instruction, the
  newest user message, the run's in-flight messages) are part of that prompt: they are kept
  right after it, before any other block and outside the evidence share of the budget, at the
  richest level that fits (see :func:`keep_pointed`);
* a pointer to a document the input does not hold (dropped for the budget, or rendered in a
  block that was dropped) says that it was left out (see :func:`without_dangling`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ce.core.pipeline._index import Candidate, Rendering, SessionIndex
from ce.core.pipeline._levels import POINTER_PREFIX
from ce.core.schema import LevelOfDetail, Priority

if TYPE_CHECKING:
    from ce.core.pipeline._prune import _Run

__all__ = ["LEFT_OUT_POINTER", "POINTED_NOTE", "keep_pointed", "without_dangling"]

LEFT_OUT_POINTER = "[retrieved document left out]"
"""What a pointer to a document the input does not hold reads as instead."""

POINTED_NOTE = (
    "; the prompt points to it: decided right after the prompt, outside the evidence share"
)
"""Added to the decision of a document the call's prompt points to."""

_POINTER = re.compile(re.escape(POINTER_PREFIX) + r"([^\]]+)\]")


def _texts(rendering: Rendering) -> Iterable[str]:
    if rendering.text:
        yield rendering.text
    for part in rendering.parts:
        yield part.content


def _points(index: SessionIndex, candidate: Candidate, rendering: Rendering) -> bool:
    """Whether ``candidate`` rendered as ``rendering`` may hold a document pointer (on every
    call: a conversation block is looked up, not read; evidence never holds one)."""
    if candidate.kind == "conversation":
        return candidate.block_id in index.pointing
    return candidate.kind != "evidence" and POINTER_PREFIX in rendering.text


def _pointed_ids(index: SessionIndex, kept: Iterable[tuple[Candidate, Rendering]]) -> list[str]:
    """The evidence ids the blocks ``kept`` point to, each once, in the order they first
    do."""
    ids: dict[str, None] = {}
    for candidate, rendering in kept:
        if _points(index, candidate, rendering):
            for text in _texts(rendering):
                ids.update(dict.fromkeys(_POINTER.findall(text)))
    return list(ids)


def keep_pointed(run: _Run) -> dict[Priority, set[int]]:
    """Decide the evidence blocks the must-keep blocks kept so far point to, before any other
    block: each at the richest level that fits what is left of the budget. Returns, per tier,
    the places of the blocks decided (the tier walks pass them by)."""
    decided: dict[Priority, set[int]] = {}
    request = run.request
    index = request.index
    ids = _pointed_ids(index, run.result.kept)
    if not ids:
        return decided
    same = run.same_texts
    for evidence_id in ids:
        slot = index.evidence_slot(evidence_id)
        if slot is None:  # rendered with its tool call's result, or not held: not a block
            continue
        tier, place = slot
        candidate = index.evidence_tiers[tier][place]
        if candidate.block_id in request.excluded:  # a resolved conflict: the walk says so
            continue
        decided.setdefault(tier, set()).add(place)
        preamble = request.evidence_preamble_tokens if not run.result.evidence_kept else 0
        text = index.evidence_texts[candidate.block_id]
        if text in same.first:
            kept = same.keep(run, candidate, text, run.remaining, tier)
        else:
            kept = run.try_fit(candidate, tier, preamble, note=POINTED_NOTE)
            if kept and run.result.kept[-1][1].level is LevelOfDetail.LIVE:
                same.first[text] = candidate  # kept whole: a later copy points to it
        if kept:
            run.result.evidence_kept += 1
    return decided


def without_dangling(
    kept: Sequence[tuple[Candidate, Rendering]], index: SessionIndex
) -> list[tuple[Candidate, Rendering]]:
    """``kept`` with every pointer to a document that no kept block holds replaced by
    :data:`LEFT_OUT_POINTER` (the blocks with one rendered again, and counted again)."""
    sent = {candidate.block_id for candidate, _ in kept}

    def held(match: re.Match[str]) -> str:
        home = index.evidence_home(match.group(1))
        return match.group(0) if home is not None and home.block_id in sent else LEFT_OUT_POINTER

    out = list(kept)
    for i, (candidate, rendering) in enumerate(kept):
        if not _points(index, candidate, rendering):
            continue
        if rendering.text:
            text = _POINTER.sub(held, rendering.text)
            if text != rendering.text:
                tokens = index.section_tokens(text)
                out[i] = (candidate, Rendering(rendering.level, (), text, tokens))
            continue
        parts = tuple(
            part.model_copy(update={"content": _POINTER.sub(held, part.content)})
            if POINTER_PREFIX in part.content
            else part
            for part in rendering.parts
        )
        if any(a.content != b.content for a, b in zip(parts, rendering.parts, strict=True)):
            estimate = index.estimator.estimate_part
            tokens = sum(estimate(part, index.model_hint) for part in parts)
            out[i] = (candidate, Rendering(rendering.level, parts, "", tokens))
    return out
