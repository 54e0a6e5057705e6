"""Random session histories written through the engine's public API, for property tests and
the payload fuzz benchmark: questions and answers, parallel tool calls whose results arrive as
tool messages or as recorded runs with result evidence, failed runs, calls never answered."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from ce.core.schema import (
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    Message,
    ModelInvocation,
    ProviderKind,
    Role,
    SourceKind,
    ToolCall,
    ToolCallRequest,
    ToolCallStatus,
    ToolProvider,
)

if TYPE_CHECKING:
    from ce.core.engine import ContextEngine

__all__ = ["FLOWS", "write_random_history"]

FLOWS = ("answer", "messages", "records", "unanswered", "mixed", "error")
"""What an assistant turn does: answer, or call tools answered by tool messages, by recorded
runs, never, a mix of the three, or with failing runs."""

_INVOCATION = ModelInvocation(provider="openai", model="gpt-4o")
_WORDS = ("order", "status", "ships", "Oslo", "refund", "invoice", "pending", "42", "the")


def _text(rng: random.Random, marker: str, words: int) -> str:
    return f"{marker} " + " ".join(rng.choice(_WORDS) for _ in range(words))


async def write_random_history(
    engine: ContextEngine, session_id: str, rng: random.Random, turns: int
) -> None:
    """Write ``turns`` random turns into ``session_id`` (see the module docstring); the last
    one may leave tool calls without results."""
    await engine.set_system_instruction(session_id, "Answer briefly.")
    for t in range(turns):
        await engine.prepare_turn(session_id, _text(rng, f"U{t}", rng.randint(1, 60)))
        flow = rng.choice(FLOWS)
        if flow == "answer":
            await engine.commit_assistant_message(
                session_id,
                Message(
                    role=Role.ASSISTANT,
                    content=_text(rng, f"A{t}", rng.randint(1, 80)),
                    invocation=_INVOCATION,
                ),
            )
            continue
        ids = [f"C{t}x{j}" for j in range(rng.randint(1, 3))]
        requests = [
            ToolCallRequest(
                tool_call_id=i, name=rng.choice(("lookup", "search")), raw_arguments="{}"
            )
            for i in ids
        ]
        await engine.commit_assistant_message(
            session_id,
            Message(role=Role.ASSISTANT, content="", tool_calls=requests, invocation=_INVOCATION),
        )
        for j, request in enumerate(requests):
            how = flow if flow not in ("mixed", "error") else ("messages", "records", "none")[j % 3]
            if flow == "error":
                how = "messages" if j % 2 == 0 else "records"
            body = _text(rng, f"R{request.tool_call_id}R", rng.randint(1, 120))
            if how == "messages":
                tool = Message(
                    role=Role.TOOL,
                    content=body,
                    tool_call_id=request.tool_call_id,
                    name=request.name,
                    meta={"status": "error"} if flow == "error" else {},
                )
                await engine.prepare_call(session_id, [tool])
            elif how == "records":
                evidence = await engine.ingest_evidence(
                    session_id,
                    body,
                    EvidenceSource(kind=SourceKind.TOOL, name=request.name),
                    EvidenceType.TOOL_RESULT,
                    links=EvidenceLinks(tool_call_id=request.tool_call_id),
                )
                await engine.record_tool_call(
                    session_id,
                    ToolCall(
                        tool_call_id=request.tool_call_id,
                        tool=request.name,
                        provider=ToolProvider(kind=ProviderKind.OTHER),
                        status=ToolCallStatus.ERROR if flow == "error" else ToolCallStatus.SUCCESS,
                    ),
                    result_evidence_ids=[evidence.evidence_id],
                )
        if rng.random() < 0.5 and flow != "unanswered":
            await engine.commit_assistant_message(
                session_id,
                Message(role=Role.ASSISTANT, content=f"F{t} done", invocation=_INVOCATION),
            )
