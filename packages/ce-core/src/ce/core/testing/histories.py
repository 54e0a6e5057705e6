"""Random session histories written through the engine's public API, for property tests and
the payload fuzz benchmark: questions and answers, parallel tool calls whose results arrive as
tool messages or as recorded runs with result evidence, failed runs, calls never answered,
text tool use (ReAct steps and their observations); questions with pictures on request."""

from __future__ import annotations

import base64
import random
import struct
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ce.core.schema import (
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    ImagePart,
    Message,
    ModelInvocation,
    ProviderKind,
    Role,
    SourceKind,
    TextPart,
    ToolCall,
    ToolCallRequest,
    ToolCallStatus,
    ToolProvider,
)

if TYPE_CHECKING:
    from ce.core.engine import ContextEngine

__all__ = ["FLOWS", "as_passed", "png_data_url", "write_random_history"]

FLOWS = ("answer", "messages", "records", "unanswered", "mixed", "error", "react")
"""What an assistant turn does: answer, or call tools answered by tool messages, by recorded
runs, never, a mix of the three, or with failing runs, or use tools through text (ReAct steps
each answered by an ``Observation:`` user message, the last one maybe not yet)."""

_INVOCATION = ModelInvocation(provider="openai", model="gpt-4o")
_WORDS = ("order", "status", "ships", "Oslo", "refund", "invoice", "pending", "42", "the")


def _text(rng: random.Random, marker: str, words: int) -> str:
    return f"{marker} " + " ".join(rng.choice(_WORDS) for _ in range(words))


def as_passed(messages: Iterable[Message]) -> list[Message]:
    """Stored messages as a framework passes its history back on its next call: objects of
    its own with the same role, text and tool ids, without the session's message ids (what a
    cold worker's first ``prepare_call`` receives)."""
    return [
        Message(
            role=m.role,
            content=m.content,
            tool_calls=m.tool_calls,
            tool_call_id=m.tool_call_id,
            name=m.name,
        )
        for m in messages
    ]


def png_data_url(width: int, height: int) -> str:
    """A ``data:image/png`` URL of ``width`` x ``height`` pixels: a PNG signature and header,
    all the token counter reads (not a decodable picture)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    body = struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + body).decode()


def _question(rng: random.Random, t: int, images: float) -> Message | str:
    text = _text(rng, f"U{t}", rng.randint(1, 60))
    if images <= 0 or rng.random() >= images:
        return text
    pictures = [
        ImagePart(
            url=png_data_url(rng.randint(1, 3000), rng.randint(1, 3000)),
            detail=rng.choice(("auto", "low", "high")),
        )
        for _ in range(rng.randint(1, 3))
    ]
    return Message(role=Role.USER, content=text, parts=[TextPart(), *pictures])


async def write_random_history(
    engine: ContextEngine,
    session_id: str,
    rng: random.Random,
    turns: int,
    *,
    images: float = 0.0,
) -> None:
    """Write ``turns`` random turns into ``session_id`` (see the module docstring); the last
    one may leave tool calls without results. With ``images`` > 0, that share of the questions
    carries one to three pictures of random sizes and detail (``0``: the histories are the
    same as without the option)."""
    await engine.set_system_instruction(session_id, "Answer briefly.")
    for t in range(turns):
        await engine.prepare_turn(session_id, _question(rng, t, images))
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
        if flow == "react":
            for step in range(rng.randint(1, 3)):
                action = (
                    f'Thought: look up {t}.{step}\nAction: search\nAction Input: {{"q": "{t}"}}'
                )
                await engine.commit_assistant_message(
                    session_id,
                    Message(role=Role.ASSISTANT, content=action, invocation=_INVOCATION),
                )
                if rng.random() < 0.85:
                    observation = _text(rng, f"Observation: O{t}x{step}", rng.randint(1, 120))
                    await engine.prepare_call(
                        session_id, [Message(role=Role.USER, content=observation)]
                    )
            if rng.random() < 0.5:
                answer = f"Thought: done.\nAnswer: F{t} done"
                await engine.commit_assistant_message(
                    session_id,
                    Message(role=Role.ASSISTANT, content=answer, invocation=_INVOCATION),
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
