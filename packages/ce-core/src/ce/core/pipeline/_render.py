"""Rendering blocks with their evidence refs, and assembling the final input."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ce.core.errors import EvidenceNotFoundError, SelectorResolveError
from ce.core.pipeline._levels import fence_evidence
from ce.core.schema import (
    AssembledInput,
    ContextBlock,
    Evidence,
    MessagePart,
    RenderedBlock,
    Role,
)
from ce.core.selectors import RefSelector
from ce.core.tokens import TokenEstimator

__all__ = [
    "Assembler",
    "DefaultRenderer",
    "EvidenceResolver",
    "RenderHints",
    "Renderer",
    "SessionEvidenceResolver",
]


@dataclass(frozen=True)
class RenderHints:
    """``max_chars``: cut a rendered block to this many characters."""

    max_chars: int | None = None


@runtime_checkable
class EvidenceResolver(Protocol):
    """Loads an evidence's text (narrowed by a selector) for rendering."""

    async def resolve(self, evidence_id: str, selector: str | None = None) -> str: ...
    def get(self, evidence_id: str) -> Evidence | None: ...


class SessionEvidenceResolver:
    """Resolves refs against ONE session's evidences only, so one session's evidence can never
    render into another's input. Unknown ids raise :class:`EvidenceNotFoundError`; a selector
    that does not apply raises :class:`SelectorResolveError`."""

    def __init__(self, evidences: Mapping[str, Evidence], selector: RefSelector | None = None):
        self._evidences = evidences
        self._selector = selector or RefSelector()

    def get(self, evidence_id: str) -> Evidence | None:
        return self._evidences.get(evidence_id)

    async def resolve(self, evidence_id: str, selector: str | None = None) -> str:
        evidence = self._evidences.get(evidence_id)
        if evidence is None:
            raise EvidenceNotFoundError(f"evidence {evidence_id!r} is not in this session")
        if not selector:
            return evidence.content
        return self._selector.extract(evidence.content, selector)


@runtime_checkable
class Renderer(Protocol):
    async def render_block(
        self,
        block: ContextBlock,
        resolver: EvidenceResolver,
        hints: RenderHints | None = None,
        degraded: list[tuple[str, str]] | None = None,
    ) -> RenderedBlock: ...


class DefaultRenderer:
    """Renders a block as its content followed by each ref's evidence excerpt, fenced with the
    evidence's provenance. A ref whose selector fails falls back to the whole block content
    (``selector_resolve_failed``); a ref to a missing evidence renders nothing
    (``evidence_not_found``); both are appended to ``degraded`` as ``(reason, detail)``."""

    def __init__(self, estimator: TokenEstimator, model_hint: str | None = None) -> None:
        self._estimator = estimator
        self._hint = model_hint

    async def render_block(
        self,
        block: ContextBlock,
        resolver: EvidenceResolver,
        hints: RenderHints | None = None,
        degraded: list[tuple[str, str]] | None = None,
    ) -> RenderedBlock:
        pieces = [block.content] if block.content else []
        for ref in block.refs:
            try:
                excerpt = await resolver.resolve(ref.evidence_id, ref.selector)
            except EvidenceNotFoundError as exc:
                if degraded is not None:
                    degraded.append(("evidence_not_found", f"block {block.block_id}: {exc}"))
                continue
            except SelectorResolveError as exc:
                if degraded is not None:
                    degraded.append(("selector_resolve_failed", f"block {block.block_id}: {exc}"))
                continue
            evidence = resolver.get(ref.evidence_id)
            pieces.append(fence_evidence(evidence, excerpt) if evidence else excerpt)
        text = "\n\n".join(pieces)
        if hints and hints.max_chars is not None and len(text) > hints.max_chars:
            text = text[: hints.max_chars]
        return RenderedBlock(
            block_id=block.block_id,
            block_type=block.block_type,
            priority=block.priority,
            rendered_content=text,
            token_estimate=self._estimator.estimate_text(text, self._hint),
        )


class Assembler:
    """Puts the system sections (instruction, memory, state, summary, evidence) into ONE
    leading system message and appends the conversation parts as they are; ``total_tokens``
    is the exact count of the result with the model's reply priming."""

    def __init__(self, estimator: TokenEstimator) -> None:
        self._estimator = estimator

    def assemble(
        self,
        system_sections: Sequence[str],
        conversation: Sequence[MessagePart],
        model_hint: str | None = None,
        *,
        with_text: bool = False,
        conversation_tokens: int | None = None,
    ) -> AssembledInput:
        """``conversation_tokens``, when given, is what the caller already counted of
        ``conversation`` (the sum of :meth:`TokenEstimator.estimate_part` of its parts): only
        the system message is counted then."""
        parts: list[MessagePart] = []
        sections = [s for s in system_sections if s]
        if sections:
            parts.append(MessagePart(role=Role.SYSTEM, content="\n\n".join(sections)))
        parts.extend(conversation)
        if conversation_tokens is None:
            total = sum(self._estimator.estimate_part(p, model_hint) for p in parts)
        else:
            total = conversation_tokens
            if sections:
                total += self._estimator.estimate_part(parts[0], model_hint)
        total += self._estimator.reply_priming(model_hint)
        text = "\n\n".join(f"{p.role.value}: {p.content}" for p in parts) if with_text else None
        return AssembledInput(parts=parts, text=text, total_tokens=total)
