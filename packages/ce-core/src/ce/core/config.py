"""Runtime configuration of the engine.

Policies live here, never in the persisted schema. Every field has a default; override what you
need, e.g. ``RuntimeConfig(model_hint="gpt-4o", budget=BudgetConfig(max_input_tokens=16_000))``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ce.core.schema import Priority

__all__ = [
    "BudgetConfig",
    "ConflictConfig",
    "ObservabilityConfig",
    "PruneConfig",
    "RedactionConfig",
    "RedactionRules",
    "RenderConfig",
    "RuntimeConfig",
    "SummaryConfig",
]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BudgetConfig(_Config):
    """``max_input_tokens`` of the model minus ``reserved_reply_tokens`` is what the input may
    use (before the tool schemas a call sends are subtracted)."""

    max_input_tokens: int = Field(default=8192, gt=0)
    reserved_reply_tokens: int = Field(default=1024, ge=0)

    @model_validator(mode="after")
    def _check(self) -> BudgetConfig:
        if self.reserved_reply_tokens >= self.max_input_tokens:
            raise ValueError("reserved_reply_tokens must be smaller than max_input_tokens")
        return self

    @property
    def context_tokens(self) -> int:
        return self.max_input_tokens - self.reserved_reply_tokens


class PruneConfig(_Config):
    """``must_keep_priorities`` are never dropped; ``ttl_seconds`` maps a priority name
    (``"low"``…) to the age after which its blocks are dropped; ``recent_messages_high`` is how
    many newest conversation messages get ``high`` priority (the rest ``medium``/``low``);
    ``evidence_share`` caps the part of the budget (after the must-keep blocks) that
    retrieved and other standalone evidence may use."""

    must_keep_priorities: tuple[Priority, ...] = (Priority.MUST,)
    ttl_seconds: dict[str, int] | None = None
    recent_messages_high: int = Field(default=6, ge=0)
    evidence_share: float = Field(default=0.5, ge=0.0, le=1.0)


class RedactionRules(_Config):
    """User rules added to the built-in ones: ``patterns`` are regular expressions (named
    ``custom_0``, ``custom_1``… in reports unless given as ``name=regex``); ``field_paths``
    are JSON keys whose values are always redacted in tool arguments; ``dictionaries`` are
    literal strings to redact."""

    patterns: tuple[str, ...] = ()
    field_paths: tuple[str, ...] = ()
    dictionaries: tuple[str, ...] = ()


class RedactionConfig(_Config):
    """Redaction is on by default. ``store_redacted_only``: the store never receives the
    original; ``dual_store``: the original is kept too, in the evidence's metadata-free
    ``original`` shadow record (for audit stores with stricter access)."""

    enabled: bool = True
    mode: Literal["store_redacted_only", "dual_store"] = "store_redacted_only"
    rules: RedactionRules | None = None
    builtin_rules: tuple[str, ...] | None = None


class ObservabilityConfig(_Config):
    emit_events: bool = True
    include_reports_in_store: bool = True


class SummaryConfig(_Config):
    """Model-written summaries; they need an ``LlmAdapter`` on the engine to run.

    The rolling summary (``enabled``) replaces the oldest part of a long conversation. Block
    summaries (``blocks``, off by default) give a long message (a tool result, a long answer:
    at least ``block_min_tokens``) a Summary level written by the model instead of its leading
    sentences or JSON outline: computed once, after the call that first had to degrade the
    message (never while a call waits), stored as ``llm_output`` evidence with its
    ``model_usage`` (stage ``summarize``), and used from the next call on."""

    enabled: bool = True
    max_summary_tokens: int = Field(default=512, gt=0)
    trigger_message_count: int = Field(default=20, gt=0)
    trigger_token_threshold: int = Field(default=4096, gt=0)
    preserve_recent_messages: int = Field(default=5, ge=0)
    blocks: bool = False
    block_min_tokens: int = Field(default=300, gt=0)
    block_max_tokens: int = Field(default=150, gt=0)


class ConflictConfig(_Config):
    """Evidences stating different values for one field of one entity (``order_id=A-1001``
    ``status``): found in JSON evidence under one of ``entity_keys`` and in documents'
    metadata ``entity`` / ``field`` / ``value``, and resolved per call by ``policy``:
    ``keep_both_and_warn`` keeps both and shows a short note in the context;
    ``prefer_tool_over_rag`` leaves out the documents contradicting a tool result;
    ``prefer_latest_by_at`` keeps the newest evidence's value. Every conflict is in the
    call's report (``Report.conflicts``)."""

    enabled: bool = True
    policy: Literal["keep_both_and_warn", "prefer_tool_over_rag", "prefer_latest_by_at"] = (
        "keep_both_and_warn"
    )
    entity_keys: tuple[str, ...] = (
        "order_id",
        "ticket_id",
        "invoice_id",
        "account_id",
        "customer_id",
        "user_id",
        "sku",
    )


class RenderConfig(_Config):
    """How records read to the model. ``fence_tool_results``: every tool result goes to the
    model inside an ``<evidence>`` fence naming its evidence id (when the run was recorded),
    its tool and its status, so a web page or an e-mail a tool returned reads as data, never
    as instructions, and an answer can cite it by id; off, a tool message carries the tool's
    text as it was."""

    fence_tool_results: bool = True


class RuntimeConfig(_Config):
    """Everything that steers one call of the engine."""

    model_hint: str | None = None
    provider_hint: str | None = None
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    prune: PruneConfig = Field(default_factory=PruneConfig)
    redaction: RedactionConfig = Field(default_factory=RedactionConfig)
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig)
    summary: SummaryConfig = Field(default_factory=SummaryConfig)
    conflicts: ConflictConfig = Field(default_factory=ConflictConfig)
    render: RenderConfig = Field(default_factory=RenderConfig)
