"""Writes ``layout<N>.db``: a session ``layout<N>`` stored by the SQLite layout of ``PRAGMA
user_version = N``, for the upgrade tests in ``test_cold_start.py``: layout 3 (ce-core before
partial reads, commit 5874991), layout 4 (before token counts were kept, commit 1961fa5).

Run it with that ce-core on the path (``git worktree add ../old 1961fa5`` and
``PYTHONPATH=../old/packages/ce-core/src python tests/core/data/make_layout.py 4``); the
records it writes use only what the layouts share.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.schema import (
    BlockType,
    ContextBlock,
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    ModelInvocation,
    Priority,
    ProviderKind,
    Ref,
    SourceKind,
    ToolCall,
    ToolCallRequest,
    ToolCallStatus,
    ToolProvider,
)
from ce.core.state import AgentState, ModelOutput, ToolResult
from ce.core.stores import SQLiteStore

HERE = Path(__file__).parent
INV = ModelInvocation(provider="openai", model="gpt-4o")
STATUSES = ("shipped", "pending", "lost")


async def main(layout: int) -> None:
    name = f"layout{layout}"
    path = HERE / f"{name}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    store = SQLiteStore(path)
    state = AgentState(name, clock=SteppingClock(), id_generator=SequentialIdGenerator("m"))
    state.set_system_instruction("You answer questions about orders.")
    await store.commit(name, state.take_changes())
    for turn in range(60):
        state.append_model_input(f"question {turn} about order A-1 " + "alpha " * (turn % 7))
        source = EvidenceSource(kind=SourceKind.RAG, uri=f"kb://doc-{turn}")
        if turn % 4 == 0:
            call = f"call-{turn}"
            state.append_model_output(
                ModelOutput(
                    tool_calls=[
                        ToolCallRequest(tool_call_id=call, name="lookup", raw_arguments="{}")
                    ],
                    invocation=INV,
                )
            )
            result = {"order_id": "A-1", "status": STATUSES[turn % 3], "turn": turn}
            state.append_tool_results(
                [ToolResult(tool_call_id=call, name="lookup", content=json.dumps(result))]
            )
            state.record_tool_call(
                ToolCall(
                    tool_call_id=call,
                    tool="lookup",
                    provider=ToolProvider(kind=ProviderKind.OTHER),
                    status=ToolCallStatus.ERROR if turn % 8 == 4 else ToolCallStatus.SUCCESS,
                )
            )
            state.add_evidence(
                Evidence(
                    evidence_id=f"result-{turn}",
                    type=EvidenceType.TOOL_RESULT,
                    source=EvidenceSource(kind=SourceKind.TOOL, name="lookup"),
                    content=json.dumps(result),
                    links=EvidenceLinks(tool_call_id=call),
                )
            )
        state.add_evidence(
            Evidence(
                evidence_id=f"doc-{turn}",
                type=EvidenceType.RAG_DOC,
                source=source,
                content=f"Document {turn} on shipping policies. " * (3 + turn % 5),
                confidence=(turn % 4) / 4,
            )
        )
        if turn % 10 == 5:
            state.add_evidence(
                Evidence(
                    evidence_id=f"wiki-{turn}",
                    type=EvidenceType.RAG_DOC,
                    source=source,
                    content=f"The wiki says A-1 is {STATUSES[(turn + 1) % 3]}.",
                    metadata={"entity": "order_id=A-1", "field": "status"},
                    confidence=0.9,
                )
            )
        answer = state.append_model_output(
            ModelOutput(text=f"answer {turn} " + "beta " * (turn % 11), invocation=INV)
        )
        if turn % 15 == 3:
            state.add_evidence(
                Evidence(
                    evidence_id=f"gist-{turn}",
                    type=EvidenceType.LLM_OUTPUT,
                    source=EvidenceSource(kind=SourceKind.LLM, name="summarizer"),
                    content=f"gist of answer {turn}",
                    metadata={"summary_of": answer.message_id},
                )
            )
        if turn == 0:
            state.put_context_block(
                ContextBlock(
                    block_id="pinned",
                    block_type=BlockType.MEMORY,
                    priority=Priority.HIGH,
                    content="Pinned policy.",
                    refs=[Ref(evidence_id="doc-0")],
                )
            )
        await store.commit(name, state.take_changes())
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
