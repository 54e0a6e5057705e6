"""Result types returned by stores and the engine."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ce.core.schema._document import Author, Parts, Summary, ToolCallRequest
from ce.core.schema._enums import BlockType, Priority, Role

__all__ = [
    "AssembledInput",
    "ConflictRecord",
    "MessagePart",
    "PrepareResult",
    "PruneDecision",
    "PutResult",
    "RedactionRecord",
    "RenderedBlock",
    "Report",
    "TurnRecord",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PutResult(_Model):
    """Outcome of a store write; ``version`` is the session version after the write and
    ``epoch`` the session's epoch (see :class:`~ce.core.stores.base.SessionUpdate`) when the
    store keeps one."""

    success: bool
    version: int
    error: str | None = None
    epoch: str | None = None


class RenderedBlock(_Model):
    block_id: str
    block_type: BlockType
    priority: Priority
    rendered_content: str
    token_estimate: int


class MessagePart(_Model):
    """One message of an assembled model input, keeping tool-call structure.

    ``is_error`` marks a tool result whose call did not succeed (its recorded status is not
    ``success``); renderers that have an error flag (Anthropic ``is_error``) carry it over.
    ``parts`` are the message's images, files and audio in order with its text, as on
    :class:`~ce.core.schema.Message` (``None``: text only). ``author`` is who wrote the
    recorded message it renders, when the session knows (an agent's turn in a multi-agent
    session; a tool result carries the author of the call it answers); renderers do not
    send it, a plugin may show another agent's turns as theirs (see
    :func:`ce.core.integration.peer_turns_as_user`).
    """

    role: Role
    content: str
    tool_calls: list[ToolCallRequest] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    parts: Parts | None = None
    author: Author | None = None


class AssembledInput(_Model):
    parts: list[MessagePart]
    text: str | None = None
    total_tokens: int


class PruneDecision(_Model):
    """What the pruner did with one candidate block, or with ``block_count`` consecutive
    conversation blocks that share the decision (``block_id`` then names the range, e.g.
    ``msg:<first>..msg:<last>``), so that a long history costs one decision, not thousands.
    ``level`` is the Level of Detail a kept or degraded block renders at; ``saved_tokens``
    what a degraded block, or one kept as a pointer to another that holds its text, saves
    against its Live rendering."""

    block_id: str
    action: Literal["kept", "dropped", "degraded"]
    reason: str
    token_estimate: int
    block_count: int = 1
    level: str | None = None
    saved_tokens: int = 0


class ConflictRecord(_Model):
    evidence_ids: list[str]
    field_path: str
    resolution: str
    detail: str = ""


class RedactionRecord(_Model):
    evidence_id: str
    rules_applied: list[str]
    fields_redacted: int


class Report(_Model):
    turn_id: str
    new_evidence_ids: list[str] = Field(default_factory=list)
    new_block_ids: list[str] = Field(default_factory=list)
    prune_decisions: list[PruneDecision] = Field(default_factory=list)
    conflicts: list[ConflictRecord] = Field(default_factory=list)
    redactions: list[RedactionRecord] = Field(default_factory=list)
    token_budget: int = 0
    token_used: int = 0
    degradations: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


class PrepareResult(_Model):
    assembled_input: AssembledInput
    report: Report
    session_version: int | None = None


class TurnRecord(_Model):
    """What a store keeps about one ``prepare_turn`` / ``prepare_call`` beside the document:
    enough to replay it (the history length it saw, the summary, the config and the tool
    schemas) and the report it produced. Never holds message content.

    ``config_id`` names the config snapshot (a digest of it); the snapshot itself is in
    ``config`` of the first turn record of the session that used it (an engine writes it once
    per session and config), and empty in the others: read it with
    :func:`ce.core.stores.turn_config`. ``tokenizer`` names what counted the call's tokens
    (:func:`ce.core.tokens.tokenizer_name`; None in records written before it was kept)."""

    turn_id: str
    kind: Literal["turn", "call"]
    at: str
    message_count: int
    evidence_count: int
    summary: Summary | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    config_id: str | None = None
    tool_schemas: list[dict[str, Any]] = Field(default_factory=list)
    report: Report
    tokenizer: str | None = None
