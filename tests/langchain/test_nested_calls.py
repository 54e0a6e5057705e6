"""Nested model calls get a child scope (issue 10): an LLM-backed tool, a sub-agent called as a
tool and an LLM query rewriter inside a create_agent app never see nor change the outer
conversation; a nested call naming its own session goes there."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.messages import ToolMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from scripted import (
    OUTER_SYSTEM,
    Scripted,
    call,
    replies,
    texts,
    user_texts,
)

import ce.langchain
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing.assertions import unfenced

HELPER_SYSTEM = "You are a terse summarizer."
EXPERT_SYSTEM = "You are the visa expert."
REWRITER_SYSTEM = "Rewrite the query for search."


# -- 3. nested calls: an LLM-backed tool, a sub-agent as a tool, an LLM query rewriter --------


def nested_app(
    middleware: Sequence[Any] = (),
) -> tuple[Any, Scripted, Scripted, Scripted, Scripted]:
    helper = replies("SUMMARY-REPLY")
    expert = replies(call("lookup_visa", {"country": "Japan"}, "call_inner"), "EXPERT-REPLY")
    rewriter = replies("REWRITTEN-QUERY")
    summarize_prompt = ChatPromptTemplate.from_messages(
        [("system", HELPER_SYSTEM), ("human", "Summarize: {text}")]
    )

    @tool
    def lookup_visa(country: str) -> str:
        """The visa rules of a country (the sub-agent's own tool)."""
        return f"no visa needed for {country}"

    expert_agent = create_agent(expert, tools=[lookup_visa], system_prompt=EXPERT_SYSTEM)

    @tool
    def summarize(text: str) -> str:
        """Summarize a text with a helper model."""
        reply = (summarize_prompt | helper).invoke({"text": text})
        return f"summary is {str(reply.content).lower()}"

    @tool
    def ask_expert(question: str) -> str:
        """Ask the visa expert (a sub-agent)."""
        state = expert_agent.invoke({"messages": [("user", f"Expert question: {question}")]})
        return f"expert says {str(state['messages'][-1].content).lower()}"

    class Rewriting(BaseRetriever):
        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            better = rewriter.invoke(
                [("system", REWRITER_SYSTEM), ("user", query)],
                {"callbacks": run_manager.get_child()},
            )
            return [Document(page_content=f"doc for {better.content}", metadata={"source": "kb"})]

    @tool
    def search(query: str) -> str:
        """Search the knowledge base (an LLM rewrites the query first)."""
        return "found " + " ".join(d.page_content for d in Rewriting().invoke(query))

    outer = replies(
        call("summarize", {"text": "a long itinerary"}, "call_sum"),
        call("ask_expert", {"question": "do I need a visa?"}, "call_exp"),
        call("search", {"query": "visa rules"}, "call_kb"),
        "All done.",
        "You are welcome.",
    )
    agent = create_agent(
        outer,
        tools=[summarize, ask_expert, search],
        system_prompt=OUTER_SYSTEM,
        checkpointer=InMemorySaver(),
        middleware=middleware,
    )
    return agent, outer, helper, expert, rewriter


@pytest.mark.parametrize("seam", ["install", "middleware"])
async def test_nested_calls_get_a_child_scope(engine: ContextEngine, seam: str) -> None:
    if seam == "middleware":
        app = nested_app([ce.langchain.middleware(engine)])
    else:
        ce.langchain.install(engine)
        app = nested_app()
    agent, outer, helper, expert, rewriter = app
    config = {"configurable": {"thread_id": "trip"}}
    question = "Plan my trip to Japan, my code word is SAKURA."
    await asyncio.to_thread(agent.invoke, {"messages": [("user", question)]}, config)
    await agent.ainvoke({"messages": [("user", "Thanks!")]}, config)

    # the nested calls received only their own messages
    for model, system, prompt in (
        (helper, HELPER_SYSTEM, "Summarize: a long itinerary"),
        (expert, EXPERT_SYSTEM, "Expert question: do I need a visa?"),
        (rewriter, REWRITER_SYSTEM, "visa rules"),
    ):
        seen = model.seen[0]
        assert [m.type for m in seen] == ["system", "human"]
        assert str(seen[0].content).startswith(system) and seen[1].content == prompt
        assert "SAKURA" not in texts(seen) and OUTER_SYSTEM not in texts(seen)
    # the sub-agent's own tool loop: its second call ends with its own tool's result
    assert len(expert.seen) == 2 and expert.seen[1][-1].type == "tool"
    assert unfenced(expert.seen[1][-1].content) == "no visa needed for Japan"
    assert str(expert.seen[1][0].content).startswith(EXPERT_SYSTEM)
    assert "SAKURA" not in texts(expert.seen[1])
    # the outer agent keeps its instruction and each next call ends with the tool result
    assert len(outer.seen) == 5
    for seen in outer.seen:
        assert seen[0].type == "system" and str(seen[0].content).startswith(OUTER_SYSTEM)
        for foreign in (HELPER_SYSTEM, EXPERT_SYSTEM, REWRITER_SYSTEM, "Summarize:", "Expert q"):
            assert foreign not in texts(seen)
        assert "SUMMARY-REPLY" not in texts(seen) and "EXPERT-REPLY" not in texts(seen)
    results = [seen[-1] for seen in outer.seen[1:4]]
    assert all(isinstance(m, ToolMessage) for m in results)
    assert [unfenced(m.content) for m in results[:2]] == [
        "summary is summary-reply",
        "expert says expert-reply",
    ]
    assert "doc for REWRITTEN-QUERY" in str(results[2].content)  # fenced as rag evidence
    assert outer.seen[4][-1].type == "human" and outer.seen[4][-1].content == "Thanks!"

    # the store: the outer session holds the outer conversation only
    doc = await engine.get_session("trip")
    stored = doc.session.model_dump_json()
    for foreign in (HELPER_SYSTEM, EXPERT_SYSTEM, REWRITER_SYSTEM, "Summarize:", "Expert q"):
        assert foreign not in stored
    assert await user_texts(engine, "trip") == [question, "Thanks!"]
    assistant = [m.content for m in doc.session.messages if m.role is Role.ASSISTANT]
    assert "SUMMARY-REPLY" not in assistant and "EXPERT-REPLY" not in assistant
    assert {c.tool_call_id for c in doc.session.tool_state.tool_calls} == {
        "call_sum",
        "call_exp",
        "call_kb",
    }
    # ... and each nested call is in its child session (with middleware() only the agent's
    # own calls are injected: the nested ones are recorded, their prompts not assembled)
    sessions = set(await engine.list_sessions())
    assert {"trip", "trip/call_sum", "trip/call_exp"} <= sessions
    (rewrite,) = sessions - {"trip", "trip/call_sum", "trip/call_exp"}
    assert rewrite.startswith("trip/call_kb/")  # under the tool, then the retriever run
    nested = {
        "trip/call_sum": ("Summarize: a long itinerary", "SUMMARY-REPLY"),
        "trip/call_exp": ("Expert question: do I need a visa?", "EXPERT-REPLY"),
        rewrite: ("visa rules", "REWRITTEN-QUERY"),
    }
    for session_id, (prompt, reply) in nested.items():
        child = await engine.get_session(session_id)
        said = [m.content for m in child.session.messages if m.role is Role.ASSISTANT]
        assert [text for text in said if text] == [reply]
        calls = 2 if session_id == "trip/call_exp" else 1
        assert len(child.session.model_usage) == calls
        expected = [prompt] if seam == "install" else []
        assert await user_texts(engine, session_id) == expected
    expert_session = await engine.get_session("trip/call_exp")
    assert [c.tool_call_id for c in expert_session.session.tool_state.tool_calls] == ["call_inner"]


async def test_a_nested_call_naming_its_own_session_goes_there(engine: ContextEngine) -> None:
    helper = replies("noted")

    @tool
    def remember(fact: str) -> str:
        """Remember a fact in the shared notes conversation."""
        helper.invoke([("user", fact)], {"metadata": {"ce_session_id": "notes"}})
        return "remembered"

    outer = replies(call("remember", {"fact": "the sky is blue"}, "call_r"), "ok")
    agent = create_agent(outer, tools=[remember], system_prompt=OUTER_SYSTEM)
    ce.langchain.install(engine)
    config = {"configurable": {"thread_id": "main"}}
    await asyncio.to_thread(agent.invoke, {"messages": [("user", "remember this")]}, config)
    assert await user_texts(engine, "notes") == ["the sky is blue"]
    assert await user_texts(engine, "main") == ["remember this"]
    assert texts(helper.seen[0]) == "the sky is blue"


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_a_reused_tool_call_id_gives_each_tool_run_its_own_child_scope(
    engine: ContextEngine, use_async: bool
) -> None:
    helper = Scripted(script=lambda seen: f"SUMMARY of {str(seen[-1].content).split()[-1]}")
    summarize_prompt = ChatPromptTemplate.from_messages(
        [("system", HELPER_SYSTEM), ("human", "Summarize: {text}")]
    )

    @tool
    def summarize(text: str) -> str:
        """Summarize a text with a helper model."""
        return str((summarize_prompt | helper).invoke({"text": text}).content)

    outer = replies(  # the provider answers call_0 in every turn
        call("summarize", {"text": "document ALPHA"}, "call_0"),
        "Done.",
        call("summarize", {"text": "document BETA"}, "call_0"),
        "Done again.",
    )
    agent = create_agent(
        outer, tools=[summarize], system_prompt=OUTER_SYSTEM, checkpointer=InMemorySaver()
    )
    ce.langchain.install(engine)
    config: Any = {"configurable": {"thread_id": "trip"}}
    for topic in ("ALPHA", "BETA"):
        inputs = {"messages": [("user", f"summarize the {topic} document")]}
        if use_async:
            await agent.ainvoke(inputs, config)
        else:
            await asyncio.to_thread(agent.invoke, inputs, config)

    # each tool run's nested call received only its own messages
    first, second = helper.seen
    assert [(m.type, m.content) for m in first[1:]] == [("human", "Summarize: document ALPHA")]
    assert [(m.type, m.content) for m in second[1:]] == [("human", "Summarize: document BETA")]
    assert "ALPHA" not in texts(second)
    # ... each recorded in a child scope of its own, named like the engine's reused call
    assert set(await engine.list_sessions()) == {"trip", "trip/call_0", "trip/call_0~2"}
    assert await user_texts(engine, "trip/call_0") == ["Summarize: document ALPHA"]
    assert await user_texts(engine, "trip/call_0~2") == ["Summarize: document BETA"]
    # the outer agent's post-tool calls end with their own tool's result
    assert [unfenced(outer.seen[i][-1].content) for i in (1, 3)] == [
        "SUMMARY of ALPHA",
        "SUMMARY of BETA",
    ]
