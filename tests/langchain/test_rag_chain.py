"""A LangChain RAG chain (retriever | format docs into the system prompt, or into the human
message | ChatOpenAI): the plugin records the retrieved documents as evidence and the prompt
quotes them, so the model would get them twice. It gets each once, fenced with its evidence
id, the prompt pointing at it (ChatOpenAI on the scripted OpenAI server, sync and async)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from operator import itemgetter
from typing import Any

import pytest

pytest.importorskip("langchain_openai")

from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import ce.langchain
from ce.core import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import EvidenceType
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, deterministic_engine

POLICY = "Refunds are accepted within 30 days of delivery for unopened items. " * 5
SHIPPING = "Orders ship within two business days from the Oslo warehouse. " * 5


class Handbook(BaseRetriever):
    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [
            Document(page_content=POLICY.strip(), metadata={"source": "kb://refunds"}),
            Document(page_content=SHIPPING.strip(), metadata={"source": "kb://shipping"}),
        ]


def _chain(server: ScriptedOpenAIServer) -> Any:
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "Answer from the handbook excerpts below.\n\n{context}"),
            ("human", "{question}"),
        ]
    )
    model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")

    def excerpts(docs: list[Document]) -> str:
        return "\n\n".join(d.page_content for d in docs)

    return (
        {"context": Handbook() | excerpts, "question": RunnablePassthrough()}
        | prompt
        | model
        | StrOutputParser()
    )


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o"))
    yield engine
    await engine.close()


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_a_rag_chain_sends_each_document_once_as_evidence(
    path: str, engine: ContextEngine
) -> None:
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="30 days.")) as server:
        chain = _chain(server)
        ce.langchain.install(engine, session_id="rag")
        question = "Can I return an unopened order?"
        if path == "sync":
            answer = chain.invoke(question)
        else:
            answer = await chain.ainvoke(question)
        ce.langchain.uninstall()
        (request,) = server.requests
    assert answer == "30 days."
    doc = await engine.get_session("rag")
    rag = {
        e.content: e.evidence_id for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC
    }
    assert set(rag) == {POLICY.strip(), SHIPPING.strip()}
    system = request["messages"][0]["content"]
    assert request["messages"][0]["role"] == "system"
    for text, evidence_id in rag.items():
        assert system.count(text) == 1
        fence = re.search(rf'<evidence id="{evidence_id}"[^>]*>(.*?)</evidence>', system, re.S)
        assert fence is not None and text in fence.group(1)
        assert f"evidence {evidence_id}" in system.split("## Evidence")[0]
    assert system.startswith("Answer from the handbook excerpts below.")
    assert json.dumps(request).count("Refunds are accepted within 30 days") == 5  # one copy


class ByTopic(BaseRetriever):
    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        text, source = (POLICY, "kb://refunds") if "refund" in query else (SHIPPING, "kb://ship")
        return [Document(page_content=text.strip(), metadata={"source": source})]


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_documents_formatted_into_the_human_message_are_sent_once(
    path: str, engine: ContextEngine
) -> None:
    # Context: {context} / Question: {question} as the human message, the app's history of
    # bare questions and answers: each turn's document once, fenced, on every later turn too
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "Answer from the context."),
            MessagesPlaceholder("chat_history"),
            ("human", "Context: {context}\nQuestion: {question}"),
        ]
    )
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="ok")) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        context = itemgetter("question") | ByTopic() | (lambda ds: ds[0].page_content)
        chain = (
            {
                "context": context,
                "question": itemgetter("question"),
                "chat_history": itemgetter("chat_history"),
            }
            | prompt
            | model
            | StrOutputParser()
        )
        ce.langchain.install(engine, session_id="rag-human")
        history: list[Any] = []
        for question in ("Can I get a refund?", "How fast do you ship?"):
            data = {"question": question, "chat_history": history}
            answer = chain.invoke(data) if path == "sync" else await chain.ainvoke(data)
            history += [HumanMessage(question), AIMessage(answer)]
        ce.langchain.uninstall()
        first, second = server.requests
    policy, shipping = "Refunds are accepted within 30 days", "Orders ship within two"
    assert json.dumps(first).count(policy) == 5 and shipping not in json.dumps(first)
    assert json.dumps(second).count(policy) == 5 and json.dumps(second).count(shipping) == 5
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    doc = await engine.get_session("rag-human")
    users = [m.content for m in doc.session.messages if m.role.value == "user"]
    assert len(users) == 2 and not any(policy in u or shipping in u for u in users)


async def test_a_chain_improving_its_own_draft_sends_the_draft_once() -> None:
    """``draft_prompt | model | StrOutputParser() | improve_prompt | model``: the second call's
    prompt quotes the first call's answer, which the session also holds; the model reads it
    once, in the prompt, the session's copy going as a pointer to it."""
    draft = (
        "DRAFT-3307: refunds within 30 days for unopened items; orders ship within two "
        "business days from Oslo."
    )

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if "Improve" in json.dumps(body["messages"]):
            return ScriptedResponse(text="Refunds: 30 days. Shipping: 2 days.")
        return ScriptedResponse(text=draft)

    engine = deterministic_engine(config=RuntimeConfig(model_hint="gpt-4o"))
    ce.langchain.install(engine)
    with ScriptedOpenAIServer(script) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        write = ChatPromptTemplate.from_messages([("human", "Summarise the policy on {topic}.")])
        improve = ChatPromptTemplate.from_messages([("human", "Improve this draft:\n{draft}")])
        chain = write | model | StrOutputParser() | (lambda text: {"draft": text}) | improve | model
        with engine.session("draft-chain"):
            final = await chain.ainvoke({"topic": "refunds"})
        requests = server.requests
    assert final.content == "Refunds: 30 days. Shipping: 2 days."
    second = requests[-1]["messages"]
    assert json.dumps(second).count(draft.split(":")[0]) == 1
    assert second[-1] == {"role": "user", "content": f"Improve this draft:\n{draft}"}
    doc = await engine.get_session("draft-chain")
    assert doc is not None
    assert [m.content for m in doc.session.messages if m.role.value == "assistant"] == [
        draft,
        "Refunds: 30 days. Shipping: 2 days.",
    ]


class Faq(BaseRetriever):
    """A second index that holds the refund policy too (as a help-centre FAQ)."""

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [Document(page_content=POLICY.strip(), metadata={"source": "faq://returns"})]


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_a_passage_two_retrievers_return_is_sent_once_citing_both(
    path: str, engine: ContextEngine
) -> None:
    """A chain asking two indexes (the handbook and the FAQ) that both hold the refund
    policy: the model reads the policy once, fenced under one evidence id, while the other
    source's block points to it; both sources stay cited and stored."""
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from the excerpts below.\n\n{context}"), ("human", "{question}")]
    )
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="30 days.")) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")

        def excerpts(found: dict[str, list[Document]]) -> str:
            return "\n\n".join(d.page_content for docs in found.values() for d in docs)

        retrieve = {"handbook": Handbook(), "faq": Faq()}
        chain = (
            {"context": retrieve | RunnableLambda(excerpts), "question": RunnablePassthrough()}
            | prompt
            | model
            | StrOutputParser()
        )
        ce.langchain.install(engine, session_id="two-indexes")
        question = "Can I return an unopened order?"
        answer = chain.invoke(question) if path == "sync" else await chain.ainvoke(question)
        ce.langchain.uninstall()
        (request,) = server.requests
    assert answer == "30 days."
    doc = await engine.get_session("two-indexes")
    policies = {
        e.source.uri: e.evidence_id
        for e in doc.evidences.values()
        if e.type is EvidenceType.RAG_DOC and e.content == POLICY.strip()
    }
    assert set(policies) == {"kb://refunds", "faq://returns"}  # both stored, each cited
    wire = json.dumps(request)
    assert wire.count("Refunds are accepted within 30 days") == 5  # the policy once
    assert wire.count("Orders ship within two business days") == 5
    system = request["messages"][0]["content"]
    for uri in policies:
        assert f'uri="{uri}"' in system
    blocks = dict(re.findall(r'<evidence id="([^"]+)"[^>]*>\n(.*?)\n</evidence>', system, re.S))
    whole = [i for i in policies.values() if blocks.get(i) == POLICY.strip()]
    assert len(whole) == 1
    (other,) = set(policies.values()) - set(whole)
    assert whole[0] in blocks[other] and "Refunds" not in blocks[other]
    # the prompt's copies of the policy point to the block that holds it whole
    prompt_part = system.split("## Evidence")[0]
    assert f"[retrieved document: evidence {whole[0]}]" in prompt_part
    assert other not in prompt_part


@tool
def search_policies(query: str) -> str:
    """Search the handbook and the FAQ."""
    found = Handbook().invoke(query) + Faq().invoke(query)
    return "\n\n".join(d.page_content for d in found)


def _search_then_answer(body: dict[str, Any]) -> ScriptedResponse:
    if body["messages"][-1]["role"] == "user":
        arguments = json.dumps({"query": "refund"})
        return ScriptedResponse(tool_calls=[("call_1", "search_policies", arguments)])
    return ScriptedResponse(text="30 days.")


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_an_agents_search_tool_over_two_indexes_sends_the_passage_once(
    path: str, engine: ContextEngine
) -> None:
    """An agent whose search tool asks two indexes that both hold the refund policy: the
    tool's result carries its documents fenced, the policy once and the FAQ's copy as its
    own block pointing to it (both sources cited); the request after the tool holds the
    policy once."""
    with ScriptedOpenAIServer(_search_then_answer) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        agent = create_agent(model, [search_policies], system_prompt="Answer from the policies.")
        ce.langchain.install(engine, session_id="agent-two-indexes")
        question = {"messages": [{"role": "user", "content": "Can I return an unopened order?"}]}
        try:
            if path == "sync":
                agent.invoke(question)
            else:
                await agent.ainvoke(question)
        finally:
            ce.langchain.uninstall()
        _, after_tool = server.requests
    assert json.dumps(after_tool).count("Refunds are accepted within 30 days") == 5  # once
    (result,) = [m["content"] for m in after_tool["messages"] if m["role"] == "tool"]
    blocks = dict(re.findall(r'<evidence id="([^"]+)"[^>]*>\n(.*?)\n</evidence>', result, re.S))
    (whole,) = [i for i, body in blocks.items() if body == POLICY.strip()]
    assert 'uri="kb://refunds"' in result and 'uri="faq://returns"' in result
    assert f"[same text as evidence {whole}]" in blocks.values()
