"""Which evidences and context blocks a store's list methods return."""

from __future__ import annotations

from dataclasses import dataclass

from ce.core.primitives import parse_iso
from ce.core.schema import BlockType, ContextBlock, Evidence, EvidenceType, Priority, SourceKind

__all__ = ["BlockFilter", "EvidenceFilter", "filter_blocks", "filter_evidences"]

_PRIORITY_RANK = {Priority.MUST: 0, Priority.HIGH: 1, Priority.MEDIUM: 2, Priority.LOW: 3}


@dataclass
class EvidenceFilter:
    """Which evidences :meth:`Store.list_evidences` returns (all criteria must hold)."""

    types: list[EvidenceType] | None = None
    source_kinds: list[SourceKind] | None = None
    since: str | None = None
    until: str | None = None
    tags: dict[str, str] | None = None
    limit: int | None = None


@dataclass
class BlockFilter:
    """Which context blocks :meth:`Store.list_context_blocks` returns."""

    block_types: list[BlockType] | None = None
    priorities: list[Priority] | None = None
    min_priority: Priority | None = None
    limit: int | None = None


def filter_evidences(evidences: list[Evidence], flt: EvidenceFilter | None) -> list[Evidence]:
    """Apply ``flt`` to evidences given in insertion order."""
    if flt is None:
        return list(evidences)
    since = parse_iso(flt.since) if flt.since else None
    until = parse_iso(flt.until) if flt.until else None
    out: list[Evidence] = []
    for ev in evidences:
        if flt.types is not None and ev.type not in flt.types:
            continue
        if flt.source_kinds is not None and ev.source.kind not in flt.source_kinds:
            continue
        if since or until:
            if not ev.created_at:
                continue
            created = parse_iso(ev.created_at)
            if since and created < since:
                continue
            if until and created > until:
                continue
        if flt.tags and any(str(ev.metadata.get(k)) != v for k, v in flt.tags.items()):
            continue
        out.append(ev)
        if flt.limit is not None and len(out) >= flt.limit:
            break
    return out


def filter_blocks(blocks: list[ContextBlock], flt: BlockFilter | None) -> list[ContextBlock]:
    """Apply ``flt`` to blocks given in stored order."""
    if flt is None:
        return list(blocks)
    out: list[ContextBlock] = []
    for block in blocks:
        if flt.block_types is not None and block.block_type not in flt.block_types:
            continue
        if flt.priorities is not None and block.priority not in flt.priorities:
            continue
        if (
            flt.min_priority is not None
            and _PRIORITY_RANK[block.priority] > _PRIORITY_RANK[flt.min_priority]
        ):
            continue
        out.append(block)
        if flt.limit is not None and len(out) >= flt.limit:
            break
    return out
