"""CrewAI knowledge: each hit of an agent's knowledge query is recorded as ``rag_doc``
evidence (content, source, score as confidence) in the crew's session, and the query
rewrite CrewAI asks the model for runs in a child scope (it is CrewAI's, not the agent's
conversation). Offline: the knowledge base is a storage of the app's own (CrewAI's
``BaseKnowledgeStorage``), so no embedder or vector database is involved."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from crew_apps import llm
from crewai import Agent, Crew, Task
from crewai.events import crewai_event_bus
from crewai.knowledge.knowledge import Knowledge
from crewai.knowledge.storage.base_knowledge_storage import BaseKnowledgeStorage

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.schema import EvidenceType
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

DOCS = [
    {
        "id": "d1",
        "content": "Paris averages 21 C in June.",
        "score": 0.92,
        "metadata": {"source": "doc://climate/paris"},
    },
    {"id": "d2", "content": "Lyon is warmer than Paris.", "score": 0.61, "metadata": {}},
]


class ListStorage(BaseKnowledgeStorage):
    """A knowledge base that returns the same documents for every query."""

    collection_name: str = "climate"

    def search(
        self,
        query: list[str],
        limit: int = 5,
        metadata_filter: Any = None,
        score_threshold: float = 0.6,
    ) -> list[Any]:
        return [dict(d) for d in DOCS]

    async def asearch(
        self,
        query: list[str],
        limit: int = 5,
        metadata_filter: Any = None,
        score_threshold: float = 0.6,
    ) -> list[Any]:
        return self.search(query, limit)

    def save(self, documents: list[str]) -> None: ...
    async def asave(self, documents: list[str]) -> None: ...
    def reset(self) -> None: ...
    async def areset(self) -> None: ...


def _script(body: dict[str, Any]) -> ScriptedResponse:
    text = json.dumps(body["messages"])
    if "Additional Information" in text:
        return ScriptedResponse(text="Pack light: 21 C.")
    return ScriptedResponse(text="paris june temperature")  # CrewAI's query rewrite


async def test_knowledge_hits_are_rag_doc_evidence(engine: ContextEngine) -> None:
    ce.crewai.install(engine, session_id="s-know")
    with ScriptedOpenAIServer(_script) as server:
        agent = Agent(role="Planner", goal="g", backstory="b", llm=llm(server))
        agent.knowledge = Knowledge(collection_name="climate", sources=[], storage=ListStorage())
        task = Task(name="plan", description="What to pack for Paris?", expected_output="x")
        task.agent = agent
        output = await asyncio.to_thread(Crew(agents=[agent], tasks=[task]).kickoff)
        crewai_event_bus.flush()
        requests = server.requests
    assert output.raw == "Pack light: 21 C."
    assert len(requests) == 2
    answer_request = json.dumps(requests[1]["messages"])
    assert "Paris averages 21 C in June." in answer_request
    assert "paris june temperature" not in answer_request  # the rewrite stayed apart
    doc = await engine.get_session("s-know")
    assert doc is not None
    hits = {e.source.uri: e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC}
    assert set(hits) == {"doc://climate/paris", "crewai-knowledge:climate/d2"}
    assert hits["doc://climate/paris"].content == "Paris averages 21 C in June."
    assert hits["doc://climate/paris"].confidence == 0.92
    assert hits["crewai-knowledge:climate/d2"].confidence == 0.61
    rewrites = [s for s in await engine.list_sessions() if s.startswith("s-know/")]
    assert len(rewrites) == 1


async def test_no_hits_are_recorded_after_uninstall(engine: ContextEngine) -> None:
    query = Knowledge.query
    ce.crewai.install(engine, session_id="s-gone").uninstall()
    assert Knowledge.query is query
    knowledge = Knowledge(collection_name="climate", sources=[], storage=ListStorage())
    assert len(knowledge.query(["paris"])) == 2
    assert await engine.list_sessions() == []
