"""Conflicting evidence: two evidences that state different values for the same field of the
same entity (an order's status from a tool and from a wiki page), found as evidences arrive and
resolved per call by the configured policy.

The default detector reads facts from a JSON evidence (a tool result, a JSON document): every
object holding one of the entity keys (``order_id``, ...) with a scalar value states its other
scalar fields for that entity (``order_id=A-1001`` / ``status`` / ``"shipped"``); a document
states one fact through its metadata ``entity`` (``"order_id=A-1001"``), ``field`` and
``value`` (its content when it has no ``value``). Any object with a ``facts(evidence)`` method
can replace it.
"""

from __future__ import annotations

import itertools
import json
from collections import ChainMap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ce.core.schema import ConflictRecord, Evidence, EvidenceType
from ce.core.schema._document import may_state_facts

__all__ = [
    "ConflictDetector",
    "ConflictTracker",
    "Fact",
    "JsonFieldDetector",
    "Resolution",
    "resolve_conflicts",
]

Policy = Literal["keep_both_and_warn", "prefer_tool_over_rag", "prefer_latest_by_at"]

_MAX_VALUE_CHARS = 200
_MAX_DEPTH = 6


@dataclass(frozen=True)
class Fact:
    """One evidence stating ``value`` for ``field`` of ``entity``."""

    entity: str
    field: str
    value: str
    evidence_id: str


class ConflictDetector(Protocol):
    def facts(self, evidence: Evidence) -> list[Fact]: ...


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and not (
        isinstance(value, str) and len(value) > _MAX_VALUE_CHARS
    )


class JsonFieldDetector:
    """Facts from JSON objects keyed by an entity key, and from a document's metadata."""

    def __init__(self, entity_keys: Sequence[str]) -> None:
        self.entity_keys = tuple(entity_keys)

    def facts(self, evidence: Evidence) -> list[Fact]:
        if not may_state_facts(evidence):
            return []
        out: list[Fact] = []
        meta = evidence.metadata
        entity, name = meta.get("entity"), meta.get("field")
        if isinstance(entity, str) and isinstance(name, str) and entity and name:
            value = meta.get("value", evidence.content.strip())
            if _scalar(value):
                out.append(Fact(entity, name, json.dumps(value), evidence.evidence_id))
        text = evidence.content.lstrip()
        if text[:1] in ("{", "["):
            try:
                data = json.loads(text)
            except ValueError:
                return out
            self._walk(data, evidence.evidence_id, out, 0)
        return out

    def _walk(self, data: Any, evidence_id: str, out: list[Fact], depth: int) -> None:
        if depth > _MAX_DEPTH:
            return
        if isinstance(data, list):
            for item in data:
                self._walk(item, evidence_id, out, depth + 1)
            return
        if not isinstance(data, Mapping):
            return
        key = next((k for k in self.entity_keys if _scalar(data.get(k))), None)
        if key is not None:
            entity = f"{key}={data[key]}"
            for name, value in data.items():
                if name not in self.entity_keys and _scalar(value):
                    out.append(Fact(entity, str(name), json.dumps(value), evidence_id))
        for value in data.values():
            if isinstance(value, (Mapping, list)):
                self._walk(value, evidence_id, out, depth + 1)


@dataclass
class ConflictTracker:
    """The facts of a session's evidences, taken in as they arrive (each evidence read
    once), grouped by entity and field; ``conflicts()`` lists the groups that hold more than
    one value.

    A tracker over the newest part of a session first takes in (:meth:`seed`) the evidences
    stored before that part that may state facts, so it finds the same conflicts as a tracker
    that read the whole session."""

    detector: ConflictDetector
    seen: list[str] = field(default_factory=list)
    groups: dict[tuple[str, str], dict[str, list[str]]] = field(default_factory=dict)
    conflicting: set[tuple[str, str]] = field(default_factory=set)
    earlier: dict[str, Evidence] = field(default_factory=dict)

    def seed(self, evidences: Iterable[Evidence]) -> None:
        """Take in evidences stored before every one :meth:`catch_up` will read, in stored
        order (an evidence passed to both is read once)."""
        for evidence in evidences:
            if evidence.evidence_id not in self.earlier:
                self.earlier[evidence.evidence_id] = evidence
                self._take(evidence)

    def catch_up(self, evidences: Mapping[str, Evidence]) -> bool:
        """Take in the evidences added since the last call; False when the session lost one
        it had (a compliance delete): build a new tracker then."""
        count = len(self.seen)
        if len(evidences) < count or (count and self.seen[-1] not in evidences):
            return False
        if len(evidences) == count:
            return True
        new = len(evidences) - count
        if isinstance(evidences, dict):  # the newest ones, without walking the older
            ids = list(itertools.islice(reversed(evidences), new))[::-1]
        else:
            ids = list(evidences)[count:]
        for evidence_id in ids:
            self.seen.append(evidence_id)
            if evidence_id not in self.earlier:
                self._take(evidences[evidence_id])
        return True

    def lookup(self, evidences: Mapping[str, Evidence]) -> Mapping[str, Evidence]:
        """The evidences the conflicts name: ``evidences`` (the session's, as passed to
        :meth:`catch_up`) and the seeded ones."""
        if not self.earlier:
            return evidences
        return ChainMap(evidences if isinstance(evidences, dict) else dict(evidences), self.earlier)

    def _take(self, evidence: Evidence) -> None:
        evidence_id = evidence.evidence_id
        for fact in self.detector.facts(evidence):
            key = (fact.entity, fact.field)
            values = self.groups.setdefault(key, {})
            holders = values.setdefault(fact.value, [])
            if evidence_id not in holders:
                holders.append(evidence_id)
            if len(values) > 1:
                self.conflicting.add(key)

    def conflicts(self) -> list[tuple[tuple[str, str], dict[str, list[str]]]]:
        return [(key, self.groups[key]) for key in sorted(self.conflicting)]


@dataclass
class Resolution:
    """What the policy decided for one call: the evidences left out of the input, the
    records for the report, and the note shown in the context (``keep_both_and_warn``)."""

    excluded: dict[str, str] = field(default_factory=dict)  # evidence id -> reason
    records: list[ConflictRecord] = field(default_factory=list)
    note: str = ""


def _describe(values: Mapping[str, list[str]], evidences: Mapping[str, Evidence]) -> str:
    parts = []
    for value, holders in values.items():
        kinds = sorted({evidences[e].type.value for e in holders if e in evidences})
        parts.append(f"{value} ({', '.join(kinds)}: {', '.join(holders)})")
    return " vs ".join(parts)


def _winner(
    values: Mapping[str, list[str]], evidences: Mapping[str, Evidence], policy: Policy
) -> str | None:
    """The value the policy keeps, or None when it cannot choose (keep both)."""
    if policy == "prefer_tool_over_rag":

        def kinds(value: str) -> set[EvidenceType]:
            return {evidences[e].type for e in values[value] if e in evidences}

        tool = [v for v in values if EvidenceType.TOOL_RESULT in kinds(v)]
        return tool[0] if len(tool) == 1 else None
    if policy == "prefer_latest_by_at":

        def latest(value: str) -> str:
            return max(evidences[e].created_at or "" for e in values[value] if e in evidences)

        ordered = sorted(values, key=latest)
        if len(ordered) > 1 and latest(ordered[-1]) == latest(ordered[-2]):
            return None  # a tie: keep both
        return ordered[-1]
    return None


def resolve_conflicts(
    conflicts: Iterable[tuple[tuple[str, str], dict[str, list[str]]]],
    evidences: Mapping[str, Evidence],
    policy: Policy,
) -> Resolution:
    """Apply ``policy`` to each conflict: ``prefer_tool_over_rag`` keeps the value a tool
    result states and leaves out the documents stating another; ``prefer_latest_by_at`` keeps
    the value of the newest evidence; ``keep_both_and_warn`` (and a policy that cannot choose:
    no single tool value, a tie in time) keeps every evidence and adds a short visible note."""
    out = Resolution()
    notes: list[str] = []
    for (entity, name), values in conflicts:
        present = {v: [e for e in h if e in evidences] for v, h in values.items()}
        present = {v: h for v, h in present.items() if h}
        if len(present) < 2:
            continue
        detail = _describe(present, evidences)
        winner = _winner(present, evidences, policy)
        ids = [e for holders in present.values() for e in holders]
        if winner is None:
            notes.append(f"- {entity} {name}: {detail}")
            resolution = "keep_both_and_warn"
        else:
            keep = set(present[winner])
            for evidence_id in ids:
                if evidence_id not in keep:
                    out.excluded[evidence_id] = (
                        f"conflict on {entity} {name}: {policy} kept {winner}"
                    )
            resolution = policy
        out.records.append(
            ConflictRecord(
                evidence_ids=ids,
                field_path=f"{entity}.{name}",
                resolution=resolution,
                detail=detail,
            )
        )
    if notes:
        out.note = (
            "## Conflicting evidence\n"
            "These evidences state different values for the same field; weigh their sources:\n"
            + "\n".join(notes)
        )
    return out
