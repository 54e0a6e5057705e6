"""Wire level: an unchanged FunctionAgent app over llama-index-llms-openai's OpenAI, pointed at
the scripted OpenAI server; one line of install. The exact request bodies show the engine's
input on every call, the post-tool calls included, streaming or not."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.chat_engine import ContextChatEngine
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.query_engine import CitationQueryEngine, RetrieverQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.core.tools import FunctionTool, QueryEngineTool
from llama_index.llms.openai import OpenAI

import ce.llamaindex
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.formats import from_openai_messages
from ce.core.schema import EvidenceType
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, deterministic_engine
from ce.core.testing.assertions import assert_tool_pairs_intact
from ce.core.tokens import TiktokenEstimator
from ce.llamaindex import LlamaIndexPlugin

SYSTEM = "You answer from the knowledge base."
CANARY = "alice.canary@example.com"
BUDGET = BudgetConfig(max_input_tokens=900, reserved_reply_tokens=100)
FILLER = "Background detail that matters little. " * 40


class KB(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        query = query_bundle.query_str
        text = f"Fact about {query}: it is documented. {FILLER}"
        node = TextNode(text=text, metadata={"source": f"kb://{query}"})
        return [NodeWithScore(node=node, score=0.8)]


async def search_kb(query: str) -> str:
    """Search the knowledge base."""
    return "\n".join(n.node.get_content() for n in await KB().aretrieve(query))


def script(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return ScriptedResponse(text="Here is what the knowledge base says.")
    topic = f"topic{sum(m['role'] == 'user' for m in messages)}"
    call_id = f"call_{len(messages)}_{topic}"
    return ScriptedResponse(tool_calls=[(call_id, "search_kb", json.dumps({"query": topic}))])


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=BUDGET))
    yield engine
    await engine.close()


def _tokens(request: dict[str, Any]) -> int:
    estimator = TiktokenEstimator()
    parts = from_openai_messages(request["messages"])
    return sum(estimator.estimate_message(p.role, p.content, "gpt-4o") for p in parts)


async def test_every_request_body_is_the_engines_input(engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(script) as server:
        # the app, unchanged
        llm = OpenAI(
            model="gpt-4o",
            api_base=server.base_url,
            api_key="sk-test",
            additional_kwargs={"stream_options": {"include_usage": True}},
        )
        tools = [FunctionTool.from_defaults(search_kb)]
        agents = [
            FunctionAgent(tools=tools, llm=llm, system_prompt=SYSTEM, streaming=streaming)
            for streaming in (False, True, False)
        ]
        # the one line
        ce.llamaindex.install(engine)
        try:
            for n, agent in enumerate(agents):
                question = f"Question {n}: tell me more. Mail me at {CANARY} please."
                with instrument_tags({"ce_session_id": "wire"}):
                    handler = agent.run(user_msg=question)
                    async for _ in handler.stream_events():
                        pass
                    await handler
        finally:
            LlamaIndexPlugin().uninstall()
        requests = server.requests

    assert len(requests) == 6  # per question: the first call and the post-tool call
    assert [r.get("stream", False) for r in requests] == [False, False, True, True, False, False]
    doc = await engine.get_session("wire")
    rag = {e.source.uri: e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC}
    assert set(rag) == {"kb://topic1", "kb://topic2", "kb://topic3"}
    assert all(e.links is not None and e.links.tool_call_id for e in rag.values())
    usage = doc.session.model_usage
    assert [(u.prompt_tokens, u.completion_tokens) for u in usage] == [(10, 5)] * 6
    assert all((u.provider, u.model) == ("openai", "gpt-4o") for u in usage)
    turns = await engine.list_turns("wire")
    assert len(turns) == len(requests)
    for index, (request, turn) in enumerate(zip(requests, turns, strict=True)):
        text = json.dumps(request)
        assert CANARY not in text  # redacted before it reaches the wire
        assert request["model"] == "gpt-4o"
        assert [t["function"]["name"] for t in request["tools"]] == ["search_kb"]
        messages = request["messages"]
        assert messages[0]["role"] == "system" and messages[0]["content"].startswith(SYSTEM)
        assert sum(m["role"] == "system" for m in messages) == 1
        parts = from_openai_messages(messages)
        assert_tool_pairs_intact(parts)
        # within the budget the engine reported for this very call
        assert turn.report is not None
        assert turn.report.token_used <= BUDGET.max_input_tokens - BUDGET.reserved_reply_tokens
        assert _tokens(request) <= BUDGET.max_input_tokens - BUDGET.reserved_reply_tokens
        last = messages[-1]
        if index % 2 == 0:  # first call of a question: the newest user message, redacted
            assert last["role"] == "user" and "[REDACTED:email]" in last["content"]
        else:  # post-tool call: the tool result is the retrieved doc, fenced with its id
            assert last["role"] == "tool"
            uri = f"kb://topic{index // 2 + 1}"
            assert f'id="{rag[uri].evidence_id}"' in last["content"]
            assert f'uri="{uri}"' in last["content"]
            assert messages[-2]["tool_calls"][0]["id"] == last["tool_call_id"]
    # the budget forced the engine to leave older history out of the last calls
    assert len(requests[-1]["messages"]) < 1 + 3 * 3 + 1
    assert any(d.action != "kept" for t in turns for d in t.report.prune_decisions)


POLICY = (
    "REFUND-7731: annual plans are refunded within 30 days of purchase; after that the refund "
    "is prorated by the months left, minus a processing fee of five percent."
)


class BothIndexes(BaseRetriever):
    """An app's retriever asking two indexes that both hold the refund policy (a handbook
    and a help-centre FAQ, scored differently)."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [
            NodeWithScore(node=TextNode(text=POLICY, metadata={"source": source}), score=score)
            for source, score in (("kb://handbook/refunds", 0.9), ("faq://returns", 0.7))
        ]


async def test_a_passage_two_indexes_return_is_sent_once_citing_both(
    engine: ContextEngine,
) -> None:
    """A ContextChatEngine over two indexes that both hold a passage: its system prompt
    quotes the passage twice and the session holds it as two evidences (two sources). Every
    request body holds it once, fenced whole under one id, which the prompt's copies and the
    other source's block point to."""
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="Within 30 days.")) as server:
        llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
        chat = ContextChatEngine.from_defaults(retriever=BothIndexes(), llm=llm)
        ce.llamaindex.install(engine)
        try:
            with instrument_tags({"ce_session_id": "two-indexes"}):
                chat.chat("Can I get a refund on an annual plan?")
                await chat.achat("And on a monthly plan?")
        finally:
            LlamaIndexPlugin().uninstall()
        requests = server.requests
    doc = await engine.get_session("two-indexes")
    policies = {
        e.source.uri: e.evidence_id
        for e in doc.evidences.values()
        if e.type is EvidenceType.RAG_DOC and e.content == POLICY
    }
    assert set(policies) == {"kb://handbook/refunds", "faq://returns"}
    assert len(requests) == 2
    for request in requests:
        assert json.dumps(request).count("REFUND-7731") == 1  # the passage once
        system = request["messages"][0]["content"]
        assert all(f'uri="{uri}"' in system for uri in policies)  # both sources cited
        prompt, _, evidence = system.partition("## Evidence")
        blocks = dict(
            re.findall(r'<evidence id="([^"]+)"[^>]*>\n(.*?)\n</evidence>', evidence, re.S)
        )
        (whole,) = [i for i in policies.values() if blocks.get(i) == POLICY]
        (other,) = set(policies.values()) - {whole}
        assert whole in blocks[other] and "REFUND" not in blocks[other]
        assert f"[retrieved document: evidence {whole}]" in prompt
        assert other not in prompt  # the prompt never points at a pointer


@contextmanager
def _query_engine(
    engine: ContextEngine, retriever: BaseRetriever, session_id: str, answer: str, **kwargs: Any
) -> Iterator[tuple[RetrieverQueryEngine, ScriptedOpenAIServer]]:
    """A RetrieverQueryEngine over ``retriever`` with OpenAI on the scripted server (which
    answers ``answer``), the plugin installed, inside ``session_id``."""
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text=answer)) as server:
        llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
        query_engine = RetrieverQueryEngine.from_args(retriever=retriever, llm=llm, **kwargs)
        ce.llamaindex.install(engine)
        try:
            with instrument_tags({"ce_session_id": session_id}):
                yield query_engine, server
        finally:
            LlamaIndexPlugin().uninstall()


def _policy_sent_once(request: dict[str, Any]) -> tuple[str, str]:
    """A query engine's request over ``BothIndexes``: the passage once, fenced whole, both
    sources cited. Its prompt (the last message) and the pointer to that block."""
    assert json.dumps(request).count("REFUND-7731") == 1  # the passage once
    system, prompt = request["messages"][0]["content"], request["messages"][-1]["content"]
    blocks = dict(re.findall(r'<evidence id="([^"]+)"[^>]*>\n(.*?)\n</evidence>', system, re.S))
    uris = re.findall(r'uri="([^"]+)"', system)
    assert sorted(uris) == ["faq://returns", "kb://handbook/refunds"]  # both cited
    (whole,) = [i for i, body in blocks.items() if body == POLICY]
    return prompt, f"[retrieved document: evidence {whole}]"


async def test_a_query_engines_prompt_sends_a_passage_two_indexes_return_once(
    engine: ContextEngine,
) -> None:
    """A RetrieverQueryEngine over two indexes that both hold a passage: LlamaIndex's
    question-answering prompt quotes it twice (once per source). Its synthesizer's model call
    runs in a session of its own, which gets the nodes the prompt quotes as evidence before the
    call: every request holds the passage once, fenced whole under one id that both of the
    prompt's copies point to, with both sources cited; the query's session keeps its hits."""
    with _query_engine(engine, BothIndexes(), "query-two-indexes", "Within 30 days.") as (
        query_engine,
        server,
    ):
        query_engine.query("Can I get a refund on an annual plan?")
        await query_engine.aquery("And on a monthly plan?")
    requests = server.requests
    assert len(requests) == 2
    for request in requests:
        prompt, pointer = _policy_sent_once(request)
        assert prompt.count(pointer) == 2
        assert "Can I get a refund" in prompt or "monthly plan" in prompt
    doc = await engine.get_session("query-two-indexes")
    assert {e.source.uri for e in doc.evidences.values() if e.content == POLICY} == {
        "kb://handbook/refunds",
        "faq://returns",
    }


async def test_a_citation_query_engine_sends_a_passage_two_indexes_return_once(
    engine: ContextEngine,
) -> None:
    """A CitationQueryEngine over two indexes that both hold a passage labels each copy as a
    source of its own (``Source 1:`` / ``Source 2:`` before the text). Every request holds the
    passage once, fenced whole with both sources cited; both labels stay in the prompt, each
    before a pointer to that block, so the model's ``[1]`` and ``[2]`` still name them."""
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="Within 30 days [1].")) as server:
        llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
        query_engine = CitationQueryEngine(retriever=BothIndexes(), llm=llm)
        ce.llamaindex.install(engine)
        try:
            with instrument_tags({"ce_session_id": "cite-two-indexes"}):
                answer = query_engine.query("Can I get a refund on an annual plan?")
                await query_engine.aquery("And on a monthly plan?")
        finally:
            LlamaIndexPlugin().uninstall()
        requests = server.requests
    assert [n.node.get_content().split("\n")[0] for n in answer.source_nodes] == [
        "Source 1:",
        "Source 2:",
    ]
    assert len(requests) == 2
    for request in requests:
        prompt, pointer = _policy_sent_once(request)
        assert f"Source 1:\n{pointer}" in prompt and f"Source 2:\n{pointer}" in prompt


SHIPPING = "SHIPPING-11: parcels ship within two business days from the central warehouse."
RETURNS = "RETURNS-22: returns are accepted within sixty days with the original receipt."


class TwoPolicies(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [
            NodeWithScore(node=TextNode(text=text, metadata={"source": uri}), score=0.8)
            for text, uri in ((SHIPPING, "kb://shipping"), (RETURNS, "kb://returns"))
        ]


@pytest.mark.parametrize("mode", ["refine", "compact"])
async def test_a_query_whose_documents_differ_keeps_llamaindexs_prompt(
    mode: str, engine: ContextEngine
) -> None:
    """Documents that all differ are the synthesizer call's own content: its prompt goes as
    LlamaIndex built it, each document inline once, no evidence block (they do not compete
    for the evidence share of the budget); a refine call holds only its own node."""
    with _query_engine(engine, TwoPolicies(), "differ", "An answer.", response_mode=mode) as (
        query_engine,
        server,
    ):
        await query_engine.aquery("What are the policies?")
    requests = server.requests
    assert len(requests) == (2 if mode == "refine" else 1)
    for request in requests:
        body = json.dumps(request)
        assert "<evidence" not in body and "[retrieved document" not in body
        assert body.count("SHIPPING-11") <= 1 and body.count("RETURNS-22") <= 1
    if mode == "refine":
        first, second = (json.dumps(r) for r in requests)
        assert "SHIPPING-11" in first and "RETURNS-22" not in first
        assert "RETURNS-22" in second and "SHIPPING-11" not in second


class ShortTwice(BaseRetriever):
    """One text too short to be taken for a quoted document, from two sources."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [
            NodeWithScore(node=TextNode(text="Yes, 30 days.", metadata={"source": uri}), score=0.8)
            for uri in ("kb://short", "faq://short")
        ]


async def test_a_short_text_two_sources_return_stays_in_the_prompt(engine: ContextEngine) -> None:
    """A text shorter than the engine's quoted-document rule allows is not made evidence:
    the engine would not replace it in the prompt, so an evidence block would only add a
    copy. The prompt goes as LlamaIndex built it."""
    with _query_engine(engine, ShortTwice(), "short", "Yes.") as (query_engine, server):
        await query_engine.aquery("Refunds?")
    (request,) = server.requests
    body = json.dumps(request)
    assert "<evidence" not in body and "[retrieved document" not in body
    assert body.count("Yes, 30 days.") == 2  # LlamaIndex's own two copies, as without us


def _refund_agent_script(body: dict[str, Any]) -> ScriptedResponse:
    if body.get("tools") and body["messages"][-1]["role"] == "user":
        arguments = json.dumps({"input": "annual plan refund"})
        return ScriptedResponse(tool_calls=[("call_1", "refunds", arguments)])
    return ScriptedResponse(text="Within 30 days.")


async def test_an_agents_query_engine_tool_over_two_indexes_sends_the_passage_once(
    engine: ContextEngine,
) -> None:
    """An agent whose tool is a query engine over two indexes that both hold a passage: the
    synthesizer's request and the agent's request after the tool (whose result carries the
    query's documents) each hold the passage once, both sources cited."""
    with ScriptedOpenAIServer(_refund_agent_script) as server:
        llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
        query_engine = RetrieverQueryEngine.from_args(retriever=BothIndexes(), llm=llm)
        tool = QueryEngineTool.from_defaults(
            query_engine, name="refunds", description="Refund policies."
        )
        agent = FunctionAgent(tools=[tool], llm=llm, system_prompt="You help with refunds.")
        ce.llamaindex.install(engine)
        try:
            with instrument_tags({"ce_session_id": "refund-agent"}):
                await agent.run("Can I get a refund on an annual plan?")
        finally:
            LlamaIndexPlugin().uninstall()
        first, synthesis, after_tool = server.requests
    assert "REFUND-7731" not in json.dumps(first)
    for request in (synthesis, after_tool):
        body = json.dumps(request)
        assert body.count("REFUND-7731") == 1
        assert "kb://handbook/refunds" in body and "faq://returns" in body
    (tool_message,) = [m for m in after_tool["messages"] if m["role"] == "tool"]
    blocks = dict(
        re.findall(
            r'<evidence id="([^"]+)"[^>]*>\n(.*?)\n</evidence>', tool_message["content"], re.S
        )
    )
    (whole,) = [i for i, body in blocks.items() if body == POLICY]
    assert f"[same text as evidence {whole}]" in blocks.values()
