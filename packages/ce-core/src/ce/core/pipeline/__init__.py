"""The context pipeline: ingest -> derive -> prune -> render ->
assemble, plus the rolling summarizer. Pure computation is synchronous; I/O is async."""

from ce.core.pipeline._conflicts import (
    ConflictDetector,
    ConflictTracker,
    Fact,
    JsonFieldDetector,
    Resolution,
    resolve_conflicts,
)
from ce.core.pipeline._index import (
    SECTION_JOIN_TOKENS,
    SUMMARY_OF,
    Candidate,
    Rendering,
    SessionIndex,
    evidence_priority,
)
from ce.core.pipeline._ingest import EvidenceIngestor, IngestOptions, PreparedEvidence
from ce.core.pipeline._levels import (
    EVIDENCE_PREAMBLE,
    LEVELS,
    QUOTED_MIN_CHARS,
    document_pointer,
    fence_evidence,
    fence_tool_result,
    quotes_document,
    shorten,
)
from ce.core.pipeline._pointed import LEFT_OUT_POINTER, without_dangling
from ce.core.pipeline._prune import (
    GreedyPriorityPruner,
    PruneBudget,
    PruneRequest,
    PruneResult,
    PruneRules,
)
from ce.core.pipeline._react import (
    canonical_step,
    is_observation,
    is_react_step,
    transcript_parts,
)
from ce.core.pipeline._render import (
    Assembler,
    DefaultRenderer,
    EvidenceResolver,
    Renderer,
    RenderHints,
    SessionEvidenceResolver,
)
from ce.core.pipeline._summarize import (
    LlmAdapter,
    LlmRequest,
    LlmResponse,
    LlmSummarizer,
    Summarizer,
    SummaryDraft,
    should_summarize,
    summary_range_end,
)

__all__ = [
    "EVIDENCE_PREAMBLE",
    "LEFT_OUT_POINTER",
    "LEVELS",
    "QUOTED_MIN_CHARS",
    "SECTION_JOIN_TOKENS",
    "SUMMARY_OF",
    "Assembler",
    "Candidate",
    "ConflictDetector",
    "ConflictTracker",
    "DefaultRenderer",
    "EvidenceIngestor",
    "EvidenceResolver",
    "Fact",
    "GreedyPriorityPruner",
    "IngestOptions",
    "JsonFieldDetector",
    "LlmAdapter",
    "LlmRequest",
    "LlmResponse",
    "LlmSummarizer",
    "PreparedEvidence",
    "PruneBudget",
    "PruneRequest",
    "PruneResult",
    "PruneRules",
    "RenderHints",
    "Renderer",
    "Rendering",
    "Resolution",
    "SessionEvidenceResolver",
    "SessionIndex",
    "Summarizer",
    "SummaryDraft",
    "canonical_step",
    "document_pointer",
    "evidence_priority",
    "fence_evidence",
    "fence_tool_result",
    "is_observation",
    "is_react_step",
    "quotes_document",
    "resolve_conflicts",
    "shorten",
    "should_summarize",
    "summary_range_end",
    "transcript_parts",
    "without_dangling",
]
