"""Rolling summary through an injected LLM adapter."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ce.core.config import SummaryConfig
from ce.core.errors import SummarizerError
from ce.core.pipeline._levels import shorten
from ce.core.schema import LevelOfDetail, Message, MessagePart, Role, Summary

__all__ = [
    "LlmAdapter",
    "LlmRequest",
    "LlmResponse",
    "LlmSummarizer",
    "Summarizer",
    "SummaryDraft",
    "should_summarize",
    "summary_range_end",
]


@dataclass(frozen=True)
class LlmRequest:
    messages: list[MessagePart]
    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 0.3


@dataclass(frozen=True)
class LlmResponse:
    content: str
    model: str
    provider: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    latency_ms: int = 0


@runtime_checkable
class LlmAdapter(Protocol):
    """The SDK's own model calls (summaries) go through this; the host's calls never do."""

    async def generate(self, request: LlmRequest) -> LlmResponse: ...


@dataclass(frozen=True)
class SummaryDraft:
    """A new summary text for ``messages[0:to_index+1]`` and the call that produced it."""

    content: str
    to_index: int
    response: LlmResponse


def should_summarize(messages_since: int, tokens_since: int, config: SummaryConfig) -> bool:
    """True when the messages not yet summarized pass either trigger of ``config``."""
    return config.enabled and (
        messages_since > config.trigger_message_count
        or tokens_since > config.trigger_token_threshold
    )


def summary_range_end(messages: Sequence[Message], start: int, stop: int) -> int | None:
    """The last index a summary may cover within ``messages[start:stop]`` without separating
    a tool call from its results (``None`` when nothing can be covered)."""
    end = stop - 1
    while end >= start:
        following = messages[end + 1] if end + 1 < len(messages) else None
        if following is None or following.role is not Role.TOOL:
            return end
        end -= 1
    return None


@runtime_checkable
class Summarizer(Protocol):
    async def summarize(
        self,
        messages: Sequence[Message],
        existing: Summary | None,
        config: SummaryConfig,
        *,
        start: int,
        to_index: int,
    ) -> SummaryDraft: ...


_PROMPT = (
    "You maintain the running summary of a conversation between a user, an assistant and its "
    "tools, for an assistant that will continue it without the old messages. Keep facts, "
    "decisions, open questions, names, numbers and ids; drop pleasantries. Write at most "
    "{limit} tokens. Reply with the updated summary only."
)


class LlmSummarizer:
    """Incremental: folds ``messages[start:to_index+1]`` into the existing summary's text."""

    def __init__(self, adapter: LlmAdapter, model: str | None = None) -> None:
        self._adapter = adapter
        self._model = model

    async def summarize(
        self,
        messages: Sequence[Message],
        existing: Summary | None,
        config: SummaryConfig,
        *,
        start: int,
        to_index: int,
    ) -> SummaryDraft:
        lines = []
        for message in messages[start : to_index + 1]:
            if message.role is Role.SYSTEM:
                continue
            label = message.role.value + (f" ({message.name})" if message.name else "")
            text = shorten(message.content, LevelOfDetail.SUMMARY)
            calls = ", ".join(f"{c.name}({c.raw_arguments})" for c in message.tool_calls or ())
            lines.append(f"{label}: {text}" + (f" [calls: {calls}]" if calls else ""))
        previous = existing.content if existing else "(none yet)"
        request = LlmRequest(
            messages=[
                MessagePart(
                    role=Role.SYSTEM, content=_PROMPT.format(limit=config.max_summary_tokens)
                ),
                MessagePart(
                    role=Role.USER,
                    content=f"Summary so far:\n{previous}\n\nNew messages:\n" + "\n".join(lines),
                ),
            ],
            model=self._model,
            max_tokens=config.max_summary_tokens,
        )
        started = time.monotonic()
        try:
            response = await self._adapter.generate(request)
        except Exception as exc:
            raise SummarizerError(f"summary generation failed: {exc!r}") from exc
        if not response.content.strip():
            raise SummarizerError("the summary adapter returned an empty summary")
        if not response.latency_ms:
            elapsed = int((time.monotonic() - started) * 1000)
            response = LlmResponse(**{**response.__dict__, "latency_ms": elapsed})
        return SummaryDraft(content=response.content.strip(), to_index=to_index, response=response)
