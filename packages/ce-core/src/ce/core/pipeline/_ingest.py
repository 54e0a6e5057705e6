"""Evidence ingestion: redaction, dedup key, confidence."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ce.core.errors import InvariantViolationError, RedactionError
from ce.core.primitives import Clock, Hasher, IdGenerator
from ce.core.redaction import RegexRedactor
from ce.core.schema import (
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    RedactionRecord,
)

__all__ = ["EvidenceIngestor", "IngestOptions", "PreparedEvidence"]


@dataclass(frozen=True)
class IngestOptions:
    """``confidence`` given here wins over a ``score`` in the metadata, which is taken as
    the confidence only when it lies in [0, 1] (a similarity, a probability; a raw BM25 score
    or a distance says nothing about confidence and stays a score) and ``score_is_confidence``
    holds (false: the score is on a scale of its own even where it lies in [0, 1], as every
    score of a retrieval is when one of them lies outside); ``args_digest`` makes a tool
    result's dedup key its tool and arguments instead of its content."""

    redact: bool = True
    dedup: bool = True
    confidence: float | None = None
    args_digest: dict[str, Any] | None = None
    score_is_confidence: bool = True


@dataclass
class PreparedEvidence:
    """An evidence ready to store, with its dedup key (None: do not deduplicate) and what
    happened on the way: a redaction record and ``(reason, detail)`` degradations."""

    evidence: Evidence
    dedup_key: str | None
    original: Evidence | None = None
    redaction: RedactionRecord | None = None
    degradations: list[tuple[str, str]] = field(default_factory=list)


class EvidenceIngestor:
    """Turns raw content into an :class:`Evidence`: redacts content and metadata (unless
    redaction is off), computes the dedup key from ``source.uri`` + content hash (or the
    tool's args digest) and the confidence. On failure it degrades: a failed
    redaction stores the text unredacted with ``metadata.has_sensitive = true``
    (``redaction_failed``); a failed hash skips dedup (``dedup_skipped``)."""

    def __init__(
        self,
        redactor: RegexRedactor | None,
        hasher: Hasher,
        ids: IdGenerator,
        clock: Clock,
        *,
        dual_store: bool = False,
    ) -> None:
        self._redactor = redactor
        self._hasher = hasher
        self._ids = ids
        self._clock = clock
        self._dual_store = dual_store

    def prepare(
        self,
        content: str,
        source: EvidenceSource,
        evidence_type: EvidenceType,
        links: EvidenceLinks | None = None,
        metadata: dict[str, Any] | None = None,
        options: IngestOptions | None = None,
    ) -> PreparedEvidence:
        _check_input(content, source, evidence_type)
        opts = options or IngestOptions()
        meta = dict(metadata or {})
        degradations: list[tuple[str, str]] = []
        confidence = opts.confidence
        score = meta.get("score")
        if (
            confidence is None
            and opts.score_is_confidence
            and isinstance(score, (int, float))
            and not isinstance(score, bool)
            and 0.0 <= score <= 1.0
        ):
            confidence = float(score)
        evidence_id = self._ids.generate()

        key: str | None = None
        if opts.dedup:
            try:
                if opts.args_digest is not None:
                    basis = f"args|{source.name}|" + json.dumps(opts.args_digest, sort_keys=True)
                else:
                    basis = f"content|{source.kind.value}|{source.uri}|{content}"
                key = f"{evidence_type.value}|{self._hasher.digest(basis)}"
            except Exception as exc:
                degradations.append(("dedup_skipped", f"hashing failed: {exc!r}"))

        text, redaction, original = content, None, None
        keyed = {} if key is None else {"dedup_key": key}  # a digest: nothing to redact
        if self._redactor is not None and opts.redact:
            try:
                result = self._redactor.redact_text(content)
                meta_redacted, meta_rules = self._redactor.redact_value(meta)
                # a document's path or URL (a user's folder, a signed link) is sent with it
                named, source_rules = (
                    self._redactor.redact_value([source.name, source.uri])
                    if source.name or source.uri
                    else ([], [])
                )
            except RedactionError as exc:
                degradations.append(("redaction_failed", str(exc)))
                meta["has_sensitive"] = True
            else:
                rules = sorted(set(result.applied_rules) | set(meta_rules) | set(source_rules))
                if rules:
                    redaction = RedactionRecord(
                        evidence_id=evidence_id,
                        rules_applied=rules,
                        fields_redacted=int(result.has_sensitive)
                        + len(meta_rules)
                        + len(source_rules),
                    )
                    if self._dual_store:
                        original = Evidence(
                            evidence_id=f"{evidence_id}:original",
                            type=evidence_type,
                            source=source,
                            content=content,
                            metadata={**meta, **keyed, "original_of": evidence_id},
                            links=links or EvidenceLinks(),
                            created_at=self._clock.now_iso(),
                        )
                text, meta = result.redacted_text, meta_redacted
                if source_rules:
                    source = source.model_copy(update={"name": named[0], "uri": named[1]})
        meta.update(keyed)
        evidence = Evidence(
            evidence_id=evidence_id,
            type=evidence_type,
            source=source,
            content=text,
            confidence=confidence,
            metadata=meta,
            links=links or EvidenceLinks(),
            created_at=self._clock.now_iso(),
        )
        return PreparedEvidence(evidence, key, original, redaction, degradations)


def _check_input(content: object, source: object, evidence_type: object) -> None:
    """Raise :class:`InvariantViolationError` naming the argument of an evidence that is not
    of its type (a URL string passed as the source, say), before anything is stored."""
    wrong = [
        f"{name} must be {kind.__name__}, got {type(value).__name__} {value!r:.60}"
        for name, value, kind in (
            ("content", content, str),
            ("source", source, EvidenceSource),
            ("evidence_type", evidence_type, EvidenceType),
        )
        if not isinstance(value, kind)
    ]
    if wrong:
        hint = "" if isinstance(source, EvidenceSource) else " (EvidenceSource(kind=..., uri=...))"
        raise InvariantViolationError("; ".join(wrong) + hint)
