"""``wrap(llm)`` follows the same session rule as the global injection: a call nested in a tool
run or a prompt call gets its own child scope, redacted; a completion (which
llama-index-llms-openai serves without a chat call, so the global injection never sees it)
goes through the engine too: ``CondensePlusContextChatEngine``'s condense step on ``OpenAI``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.chat_engine import CondensePlusContextChatEngine
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.tools import QueryEngineTool
from llama_index.llms.openai import OpenAI

import ce.llamaindex
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

REDACTED = "[REDACTED:email]"


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    def script(body: dict[str, Any]) -> ScriptedResponse:
        messages = body["messages"]
        text = json.dumps(messages)
        if "Standalone question" in text:
            return ScriptedResponse(text="standalone: what about Oslo?")
        if "OUTER" in str(messages[0]["content"]) and messages[-1]["role"] != "tool":
            arguments = json.dumps({"input": "Paris, for kim@example.com"})
            return ScriptedResponse(tool_calls=[("call_q", "search_docs", arguments)])
        users = sum(m["role"] == "user" for m in messages)
        return ScriptedResponse(text=f"answer {users}")

    with ScriptedOpenAIServer(script) as server:
        yield server


def _index() -> VectorStoreIndex:
    documents = [Document(text="Paris is mild in autumn.", doc_id="p")]
    return VectorStoreIndex.from_documents(documents, embed_model=MockEmbedding(embed_dim=8))


async def test_wrap_gives_a_nested_call_its_own_child_scope(
    engine: ContextEngine, server: ScriptedOpenAIServer
) -> None:
    llm = ce.llamaindex.wrap(
        OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test"), engine
    )
    tool = QueryEngineTool.from_defaults(
        _index().as_query_engine(llm=llm), name="search_docs", description="Search."
    )
    agent = FunctionAgent(tools=[tool], llm=llm, system_prompt="OUTER agent")
    with instrument_tags({"ce_session_id": "w-outer"}):
        await agent.run(user_msg="Outer question about Paris")
    outer = [r for r in server.requests if "OUTER" in str(r["messages"][0]["content"])]
    (synthesis,) = [r for r in server.requests if r not in outer]
    assert "Outer question" not in json.dumps(synthesis)
    assert "kim@" not in json.dumps(synthesis) and REDACTED in json.dumps(synthesis)
    assert outer[1]["messages"][-1]["role"] == "tool"
    (child,) = [s for s in await engine.store.list_sessions() if s != "w-outer"]
    assert child.startswith("w-outer/call_q/")
    doc = await engine.get_session("w-outer")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        "Outer question about Paris"
    ]


def test_wrap_redacts_the_condense_completion(
    engine: ContextEngine, server: ScriptedOpenAIServer
) -> None:
    llm = ce.llamaindex.wrap(
        OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test"), engine
    )
    chat = CondensePlusContextChatEngine.from_defaults(
        retriever=_index().as_retriever(),
        llm=llm,
        memory=ChatMemoryBuffer.from_defaults(chat_store_key="lee"),
    )
    chat.chat("What about Paris?")
    chat.chat("And Oslo? Write to lee@example.com")
    (condense,) = [r for r in server.requests if "Standalone question" in json.dumps(r)]
    assert "lee@" not in json.dumps(condense) and REDACTED in json.dumps(condense)
    assert [m["role"] for m in condense["messages"]] == ["user"]
    lee = [m.content for m in engine.sync.get_session("lee").session.messages]
    assert not any("Standalone question" in c for c in lee)
    children = [s for s in engine.sync.run(engine.store.list_sessions()) if s != "lee"]
    assert len(children) == 1 and children[0].startswith("lee/")
