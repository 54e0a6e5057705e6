"""CrewAI memory: what an agent recalls before its request is recorded as ``rag_doc``
evidence (one per memory, its score as confidence) in the run's session; CrewAI's own
memory-extraction call after the answer runs in a child scope, not in the user's
conversation. Offline: the memory's embedder is a function of the app's own and its store
CrewAI's local LanceDB under the tests' data directory; the memory is written with its scope,
categories and importance given, so CrewAI asks no model for them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from crew_apps import llm
from crewai import Agent
from crewai.events import crewai_event_bus
from crewai.memory.unified_memory import Memory

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.schema import EvidenceType, Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

MARK = "NOTEBOOK-MARK-3307"


def _embed(texts: list[str]) -> list[list[float]]:
    return [[1.0, float(len(t) % 5), 0.5] for t in texts]


def _script(body: dict[str, Any]) -> ScriptedResponse:
    if "Relevant memories" in json.dumps(body["messages"]):
        return ScriptedResponse(text="You like window seats.")
    return ScriptedResponse(text='{"memories": []}')  # CrewAI's memory extraction: nothing


async def test_recalled_memories_are_rag_doc_evidence(
    engine: ContextEngine, tmp_path: Path
) -> None:
    recall = Memory.recall
    ce.crewai.install(engine, session_id="s-mem")
    await engine.update_notebook("s-mem", MARK)
    with ScriptedOpenAIServer(_script) as server:
        memory = Memory(embedder=_embed, llm=llm(server), storage=str(tmp_path / "memory"))
        record = memory.remember(
            "The user prefers window seats.", scope="/user", categories=["travel"], importance=0.9
        )
        assert record is not None
        agent = Agent(role="Assistant", goal="g", backstory="b", llm=llm(server), memory=memory)
        output = await asyncio.to_thread(agent.kickoff, "Which seat do I like?")
        crewai_event_bus.flush()
        requests = server.requests
    assert output.raw == "You like window seats."
    answer = next(r for r in requests if "Relevant memories" in json.dumps(r["messages"]))
    assert MARK in json.dumps(answer["messages"])
    doc = await engine.get_session("s-mem")
    assert doc is not None
    (hit,) = [e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert hit.content == "The user prefers window seats."
    assert hit.source.uri == f"crewai-memory:/user/{record.id}"
    assert hit.confidence is not None and 0 < hit.confidence <= 1
    # the extraction call (if CrewAI made one) is not part of the user's conversation
    contents = " ".join(m.content for m in doc.session.messages if m.role is Role.USER)
    assert "memory statements" not in contents
    extraction = [r for r in requests if r is not answer]
    assert len(extraction) == 1
    assert all(MARK not in json.dumps(r["messages"]) for r in extraction)
    ce.crewai.uninstall()
    assert Memory.recall is recall
