"""A FunctionAgent with two tools (one fails) and a query engine tool over an offline
VectorStoreIndex, driven sync, async and streaming through the one-line install: what the model
received on the first and the post-tool call, and what the session document holds."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.llms import mock
from llama_index.core.objects import ObjectIndex
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.tools import FunctionTool, QueryEngineTool
from llama_index.llms.openai import OpenAI
from llamaindex_fakes import NestingLLM, Reply, ScriptedLLM

import ce.llamaindex
from ce.core.engine import ContextEngine
from ce.core.schema import EvidenceType, Role, ToolCallStatus
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.core.testing.assertions import fenced, unfenced

SYSTEM = "You are the weather agent."
CALLS = [
    ("call_w", "get_weather", {"city": "Paris"}),
    ("call_f", "flaky", {"x": 1}),
    ("call_s", "search_docs", {"input": "autumn"}),
]


def agent_script(messages: list[dict[str, Any]]) -> Reply:
    if messages[-1]["role"] == "tool":
        return "Paris is sunny.", []
    return "", CALLS


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}"


def flaky(x: int) -> str:
    """A tool that fails."""
    raise ValueError("kaboom")


class KeepParis(BaseNodePostprocessor):
    """A reranker stand-in: keeps the Paris document and rescores it."""

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        return [
            NodeWithScore(node=n.node, score=0.75)
            for n in nodes
            if n.node.metadata["source"] == "kb://paris"
        ]


def search_tool() -> QueryEngineTool:
    documents = [
        Document(text="Paris is mild in autumn.", metadata={"source": "kb://paris"}, doc_id="p"),
        Document(text="Oslo is cold in autumn.", metadata={"source": "kb://oslo"}, doc_id="o"),
    ]
    index = VectorStoreIndex.from_documents(documents, embed_model=MockEmbedding(embed_dim=8))
    synthesizer = ScriptedLLM(script=lambda m: ("Paris is mild in autumn.", []), seen=[])
    engine = index.as_query_engine(
        llm=synthesizer, similarity_top_k=2, node_postprocessors=[KeepParis()]
    )
    return QueryEngineTool.from_defaults(
        engine, name="search_docs", description="Search the knowledge base."
    )


def make_agent(llm: Any, streaming: bool) -> FunctionAgent:
    return FunctionAgent(
        tools=[
            FunctionTool.from_defaults(get_weather),
            FunctionTool.from_defaults(flaky),
            search_tool(),
        ],
        llm=llm,
        system_prompt=SYSTEM,
        streaming=streaming,
    )


async def _run(agent: FunctionAgent, engine: ContextEngine, session_id: str) -> str:
    with engine.session(session_id):
        handler = agent.run(user_msg="weather in Paris?")
        async for _ in handler.stream_events():
            pass
        result = await handler
    return str(result.response.content)


@pytest.mark.parametrize("path", ["sync", "async", "stream"])
async def test_agent_tool_loop_is_injected_and_recorded(path: str, engine: ContextEngine) -> None:
    ce.llamaindex.install(engine)
    await engine.update_notebook("sess-1", "NOTEBOOK-MARK")
    llm = ScriptedLLM(script=agent_script, seen=[])
    agent = make_agent(llm, streaming=path == "stream")
    if path == "sync":  # a blocking caller: no event loop in its thread
        answer = await asyncio.to_thread(lambda: asyncio.run(_run(agent, engine, "sess-1")))
    else:
        answer = await _run(agent, engine, "sess-1")
    assert answer == "Paris is sunny."

    # what the model received: the engine's input on the first and on the post-tool call
    first, second = llm.seen
    assert [m.role.value for m in first] == ["system", "user"]
    assert SYSTEM in str(first[0].content) and "NOTEBOOK-MARK" in str(first[0].content)
    assert first[1].content == "weather in Paris?"
    assert [m.role.value for m in second] == ["system", "user", "assistant", "tool", "tool", "tool"]
    assert "NOTEBOOK-MARK" in str(second[0].content)
    tools = {m.additional_kwargs["tool_call_id"]: str(m.content) for m in second[3:]}
    # each tool result as the tool returned it, fenced with its tool and status
    assert unfenced(tools["call_w"]) == "Sunny in Paris"
    assert (fenced(tools["call_w"]) or {}).get("tool") == "get_weather"
    assert (fenced(tools["call_w"]) or {}).get("status") == "success"
    assert "kaboom" in tools["call_f"] and (fenced(tools["call_f"]) or {}).get("status") == "error"

    # what the session document holds
    doc = await engine.get_session("sess-1")
    roles = [m.role for m in doc.session.messages if m.role is not Role.SYSTEM]
    assert roles == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.TOOL, Role.TOOL, Role.ASSISTANT]
    assert doc.session.messages[-1].content == "Paris is sunny."
    assert doc.session.messages[-1].invocation is not None
    records = {r.tool_call_id: r for r in doc.session.tool_state.tool_calls}
    assert set(records) == {"call_w", "call_f", "call_s"}
    assert records["call_w"].status is ToolCallStatus.SUCCESS
    assert records["call_f"].status is ToolCallStatus.ERROR
    assert records["call_s"].status is ToolCallStatus.SUCCESS
    assert records["call_w"].args_digest == {"city": "Paris"}
    assert all(r.duration_ms is not None and r.duration_ms >= 0 for r in records.values())
    # the hits after the query engine's postprocessor, linked to the tool call
    rag = [e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert [(e.source.uri, e.confidence) for e in rag] == [("kb://paris", 0.75)]
    assert rag[0].links is not None and rag[0].links.tool_call_id == "call_s"
    assert rag[0].metadata["doc_id"] == "p"
    assert f'id="{rag[0].evidence_id}"' in tools["call_s"]
    # usage counted once per model call: the agent's two here, the query engine's synthesis
    # in its own child scope under the tool call (not part of the agent's conversation)
    usage = doc.session.model_usage
    counts = [(u.prompt_tokens, u.completion_tokens) for u in usage]
    assert counts == [(20, 5), (60, 5)]
    assert len(await engine.list_turns("sess-1")) == 2
    streamed = [u.first_token_latency_ms is not None for u in usage]
    assert streamed == ([True, True] if path == "stream" else [False] * 2)
    (child,) = [s for s in await engine.store.list_sessions() if s.startswith("sess-1/")]
    assert child.startswith("sess-1/call_s/")
    nested = await engine.get_session(child)
    assert [u.first_token_latency_ms for u in nested.session.model_usage] == [None]
    assert [m.role for m in nested.session.messages if m.role is not Role.SYSTEM] == [
        Role.USER,
        Role.ASSISTANT,
    ]


def _nesting_llms() -> list[Any]:
    def weather_only(messages: list[dict[str, Any]]) -> Reply:
        return ("Paris is sunny.", []) if messages[-1]["role"] == "tool" else ("", CALLS[:1])

    llms: list[Any] = [NestingLLM(script=weather_only, seen=[])]
    if hasattr(mock, "MockFunctionCallingLLM"):  # llama-index-core >= 0.14.1
        llms.append(mock.MockFunctionCallingLLM())
    return llms


@pytest.mark.parametrize("llm", _nesting_llms(), ids=lambda llm: type(llm).__name__)
async def test_nested_chat_spans_are_recorded_once(llm: Any, engine: ContextEngine) -> None:
    """An LLM whose achat calls its own chat (as LlamaIndex's MockFunctionCallingLLM does)
    opens two chat spans and emits two sets of LLM events per call: one model call, one
    injection, one reply."""
    ce.llamaindex.install(engine, session_id="s-nest")
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(get_weather)],
        llm=llm,
        system_prompt=SYSTEM,
        streaming=False,
    )
    result = await agent.run(user_msg="weather in Paris?")
    assert str(result.response.content) in ("Tool calls complete.", "Paris is sunny.")
    doc = await engine.get_session("s-nest")
    usage = doc.session.model_usage
    assert len(usage) == 2  # the tool-call step and the answer, not four
    assert len({u.model_usage_id for u in usage}) == 2
    if isinstance(llm, NestingLLM):
        assert [(u.prompt_tokens, u.completion_tokens) for u in usage] == [(20, 5), (40, 5)]
    assert len(await engine.list_turns("s-nest")) == 2
    replies = [m for m in doc.session.messages if m.role is Role.ASSISTANT]
    assert len(replies) == 2


def convert(amount: float) -> str:
    """Convert USD to EUR."""
    return f"{amount * 0.9:.2f} EUR"


def _converting(body: dict[str, Any]) -> ScriptedResponse:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return ScriptedResponse(text=f"That is {last['content']}.")
    return ScriptedResponse(tool_calls=[("call_c", "convert", json.dumps({"amount": 10}))])


async def _convert_twice(server: ScriptedOpenAIServer) -> list[list[dict[str, Any]]]:
    """Two turns in session ``ann`` of an agent that picks ``convert`` with its tool
    retriever (an ``ObjectIndex`` of tools over a ``VectorStoreIndex``)."""
    tools = ObjectIndex.from_objects(
        [FunctionTool.from_defaults(convert)],
        index_cls=VectorStoreIndex,
        embed_model=MockEmbedding(embed_dim=8),
    )
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(get_weather)],
        tool_retriever=tools.as_retriever(similarity_top_k=1),
        llm=OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test"),
        system_prompt=SYSTEM,
    )
    for question in ("Convert 10 USD.", "And again?"):
        with instrument_tags({"ce_session_id": "ann"}):
            await agent.run(question)
    return [r["messages"] for r in server.requests]


async def test_an_agents_tool_retrieval_is_no_evidence(engine: ContextEngine) -> None:
    """A ``FunctionAgent``'s ``tool_retriever`` picks the tools of each step: the tools it
    retrieves reach the model as tool schemas only, as LlamaIndex sends them, never as
    retrieved documents of the session (in the system prompt of every call after)."""
    with ScriptedOpenAIServer(_converting) as server:
        native = await _convert_twice(server)
    with ScriptedOpenAIServer(_converting) as server:
        ce.llamaindex.install(engine)
        requests = await _convert_twice(server)
        tools = [[t["function"]["name"] for t in r["tools"]] for r in server.requests]
    first_turn = [[{**m, "content": unfenced(m["content"])} for m in r] for r in requests[:2]]
    assert first_turn == native[:2]
    assert [r[0] for r in requests] == [{"role": "system", "content": SYSTEM}] * 4
    assert tools == [["get_weather", "convert"]] * 4
    await engine.flush()
    doc = await engine.get_session("ann")
    assert [e.type for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC] == []
    assert len(doc.session.tool_state.tool_calls) == 2  # the tool runs are recorded
