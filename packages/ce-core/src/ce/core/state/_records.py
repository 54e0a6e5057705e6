"""What the AgentState writers take: an aggregated model output and tool results."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ce.core.schema import (
    Author,
    ContentPart,
    LodSections,
    ModelInvocation,
    Ref,
    Section,
    ToolCallRequest,
    ToolCallStatus,
    ToolProvider,
)

__all__ = ["ModelOutput", "TokenUsage", "ToolResult"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenUsage(_Record):
    """Token counts a model reported for one output."""

    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ModelOutput(_Record):
    """One aggregated model output: the input of :meth:`AgentState.append_model_output`.

    Built by :class:`DeltaAccumulator` from a stream, or directly by a caller. A valid output
    has text or tool calls, and an ``invocation`` with a non-empty provider and model. Tool
    calls keep ``raw_arguments`` verbatim; ``arguments`` is the parsed object or
    ``parse_error`` says why it did not parse.

    ``thinking``, ``error`` and the latencies describe the call but are not part of the
    history message: ``thinking`` is not persisted, ``error`` and the latencies go into the
    :class:`~ce.core.schema.ModelUsage` record written when ``usage`` is given.
    """

    text: str = ""
    thinking: str = ""
    tool_calls: list[ToolCallRequest] = Field(default_factory=list)
    invocation: ModelInvocation | None = None
    usage: TokenUsage | None = None
    finish_reason: str | None = None
    error: str | None = None
    latency_ms: int | None = Field(default=None, ge=0)
    first_token_latency_ms: int | None = Field(default=None, ge=0)
    author: Author | None = None
    name: str | None = None
    """The participant name the message goes with (OpenAI ``name``: an agent's, in a
    multi-agent app); sent and counted with it."""
    refs: list[Ref] | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    message_id: str | None = None


class ToolResult(_Record):
    """The terminal result of one tool call: the input of :meth:`AgentState.append_tool_results`.

    ``content`` is the Live rendering (text or sections); ``lod`` may add cheaper Summary/Gist
    renderings. ``name`` defaults to the name the call was declared with and must match it
    when given. When ``content`` is empty, the tool message carries ``error`` instead.
    ``provider`` defaults to ``ToolProvider(kind="other")``. ``parts`` are the result's
    images, files and audio (see :class:`ce.core.schema.TextPart`).
    """

    tool_call_id: str
    name: str = ""
    content: str | list[Section] = ""
    lod: LodSections | None = None
    status: ToolCallStatus = ToolCallStatus.SUCCESS
    duration_ms: int = Field(default=0, ge=0)
    error: str = ""
    provider: ToolProvider | None = None
    result_evidence_ids: list[str] = Field(default_factory=list)
    task_id: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    message_id: str | None = None
    parts: list[ContentPart] | None = None
