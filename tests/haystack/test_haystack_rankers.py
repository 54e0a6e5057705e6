"""ce-haystack in RAG pipelines that drop documents after retrieval (a ranker's ``top_k``, a
filter): the model receives the documents the pipeline passes on to the prompt, each once,
and never those it dropped; the session's evidence is those documents only (the real
Haystack on the scripted OpenAI server)."""

from __future__ import annotations

from typing import Any

import pytest
from haystack import Document, Pipeline, component
from haystack.components.builders import ChatPromptBuilder
from haystack.components.rankers import LostInTheMiddleRanker
from haystack.dataclasses import ChatMessage
from hs_apps import FixedRetriever, generator, wire

import ce.haystack
from ce.core.engine import ContextEngine
from ce.core.integration import SESSION_KEY
from ce.core.schema import EvidenceType
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

DOCS = tuple(
    (f"doc://d{i}", f"DOC-{i}: note number {i} on the Oslo weather this weekend.", 0.9 - i / 10)
    for i in range(4)
)
TEMPLATE = [
    ChatMessage.from_system("Answer from the documents."),
    ChatMessage.from_user(
        "Documents:\n{% for d in documents %}{{ d.content }}\n{% endfor %}Question: {{ query }}"
    ),
]


@component
class KeepEven:
    """A filter of the app's own: passes on the documents whose number is even."""

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, Any]:
        return {"documents": [d for d in documents if int(d.content[4]) % 2 == 0]}


@component
class QueryRanker:
    """A reranker taking the query (as a cross-encoder does): the ``top_k`` best, rescored."""

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document]) -> dict[str, Any]:
        best = sorted(documents, key=lambda d: d.content, reverse=True)[: self.top_k]
        return {"documents": [Document(content=d.content, meta=d.meta, score=0.5) for d in best]}


RANKERS = {
    "lost in the middle": lambda: LostInTheMiddleRanker(top_k=2),
    "filter": KeepEven,
    "reranker": lambda: QueryRanker(top_k=2),
}


def _rag(server: ScriptedOpenAIServer, ranker: str, session_id: str) -> Pipeline:
    pipeline = Pipeline(metadata={SESSION_KEY: session_id})
    pipeline.add_component("retriever", FixedRetriever(DOCS))
    pipeline.add_component("ranker", RANKERS[ranker]())
    pipeline.add_component(
        "prompt", ChatPromptBuilder(template=TEMPLATE, required_variables=["documents", "query"])
    )
    pipeline.add_component("llm", generator(server))
    pipeline.connect("retriever.documents", "ranker.documents")
    pipeline.connect("ranker.documents", "prompt.documents")
    pipeline.connect("prompt.prompt", "llm.messages")
    return pipeline


def _data(query: str, ranker: str) -> dict[str, Any]:
    data: dict[str, Any] = {"retriever": {"query": query}, "prompt": {"query": query}}
    if ranker == "reranker":
        data["ranker"] = {"query": query}
    return data


def _docs_in(request: dict[str, Any]) -> dict[str, int]:
    """How often each of ``DOCS`` is in ``request``'s body."""
    return {uri: wire(request).count(content) for uri, content, _ in DOCS}


@pytest.mark.parametrize("path", ["run", "run_async"])
@pytest.mark.parametrize("ranker", list(RANKERS))
async def test_documents_a_ranker_dropped_never_reach_the_model(
    ranker: str, path: str, engine: ContextEngine
) -> None:
    questions = ("Weather in Oslo?", "And on Sunday?")

    async def bodies(install: bool) -> list[dict[str, Any]]:
        with ScriptedOpenAIServer(lambda _: ScriptedResponse(text="Rain.")) as server:
            pipeline = _rag(server, ranker, f"s-{ranker}")
            if install:
                ce.haystack.install(engine)
            for question in questions:
                if path == "run":
                    pipeline.run(_data(question, ranker))
                else:
                    await pipeline.run_async(_data(question, ranker))
            if install:
                ce.haystack.uninstall()
            return server.requests

    native = await bodies(False)
    kept = {uri for uri, count in _docs_in(native[0]).items() if count}
    assert 0 < len(kept) < len(DOCS)  # the app's ranker dropped some
    for request in await bodies(True):
        # the kept ones once (fenced as evidence), the dropped ones never, on every turn
        assert _docs_in(request) == {uri: int(uri in kept) for uri, _, _ in DOCS}
    doc = await engine.get_session(f"s-{ranker}")
    hits = [e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert {e.source.uri for e in hits} == kept


async def test_a_run_that_only_retrieves_records_what_its_ranker_passed_on(
    engine: ContextEngine,
) -> None:
    pipeline = Pipeline(metadata={SESSION_KEY: "s-retrieve"})
    pipeline.add_component("retriever", FixedRetriever(DOCS))
    pipeline.add_component("ranker", LostInTheMiddleRanker(top_k=1))
    pipeline.connect("retriever.documents", "ranker.documents")
    ce.haystack.install(engine)
    result = pipeline.run({"retriever": {"query": "Oslo?"}})
    (passed,) = result["ranker"]["documents"]
    doc = await engine.get_session("s-retrieve")
    hits = [e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert [(e.source.uri, e.content) for e in hits] == [(passed.meta["source"], passed.content)]
