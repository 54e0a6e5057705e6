"""One session, two frameworks: a LangChain planner and a LlamaIndex executor take turns in the
session ``trip-42``, and each model call of either sees the other's turns, tool results and
evidence in its assembled input.

Runs offline: both frameworks' OpenAI clients talk to ce.core's ScriptedOpenAIServer (the
planner as ``gpt-4o``, the executor as ``gpt-4o-mini``). The apps are unchanged LangChain and
LlamaIndex agents; the two ``install`` lines are all the Context Engine code they get. The
session is named the way each framework names it: LangGraph's ``thread_id`` for the planner,
LlamaIndex's ``instrument_tags`` for the executor.

    python examples/mixed_runtime.py   # store: $CE_STORE_URL or sqlite:///.ce/sessions.db
    ce show trip-42                    # the shared timeline (ce-core[cli])
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.llms.openai import OpenAI

import ce.langchain
import ce.llamaindex
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import SessionDocument
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

SESSION_ID = "trip-42"
PLANNER_MODEL, EXECUTOR_MODEL = "gpt-4o", "gpt-4o-mini"
PLANNER_PROMPT = "You are the trip planner. Plan; never book anything yourself."
EXECUTOR_PROMPT = "You are the executor. Book exactly what the latest plan says."
GUIDE = {
    "oslo": "Oslo in autumn: cool and wet. Hotel Nord is central and quiet; 2 nights suit a "
    "short visit. The Munch museum is closed on Mondays.",
}


class TravelGuide(BaseRetriever):
    """The planner's retriever: a handful of guide pages."""

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [
            Document(page_content=text, metadata={"source": f"guide://{city}", "score": 0.9})
            for city, text in GUIDE.items()
            if city in query.lower()
        ]


@tool
def search_guide(query: str) -> str:
    """Search the travel guide."""
    return "\n".join(d.page_content for d in TravelGuide().invoke(query))


def book_hotel(hotel: str, city: str, nights: int) -> str:
    """Book a hotel room."""
    return json.dumps({"booked": hotel, "city": city, "nights": nights, "ref": "BK-1042"})


def _after_last_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return messages[last_user:]


def _text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages)


def model_script(body: dict[str, Any]) -> ScriptedResponse:
    """Both models. Each answers only from what its request holds, so what it says shows
    what it was given."""
    messages = body["messages"]
    recent = _after_last_user(messages)
    question = str(recent[0]["content"]).lower()
    seen = _text(messages)
    called = any(m["role"] == "tool" for m in recent)
    if body["model"] == EXECUTOR_MODEL:
        if not called:
            plan = re.search(r"book (\d+) nights at (Hotel \w+) in (\w+)", seen)
            if plan is None:
                return ScriptedResponse(text="I see no plan to execute.")
            nights, hotel, city = plan.groups()
            args = {"hotel": hotel, "city": city, "nights": int(nights)}
            return ScriptedResponse(tool_calls=[("call_book_1", "book_hotel", json.dumps(args))])
        return ScriptedResponse(text="Done: the booking is confirmed.")
    if "plan" in question:
        if not called:
            args = json.dumps({"query": "oslo"})
            return ScriptedResponse(tool_calls=[("call_guide_1", "search_guide", args)])
        return ScriptedResponse(
            text="Plan: fly to Oslo on Friday; book 2 nights at Hotel Nord in Oslo; "
            "skip the Munch museum on Monday."
        )
    ref = re.search(r"BK-\d+", seen)
    return ScriptedResponse(
        text=f"The executor booked it: reference {ref.group(0)}." if ref else "Nothing is booked."
    )


def show_call(body: dict[str, Any]) -> None:
    """One model call: which agent, and what it was given."""
    agent = "executor (LlamaIndex)" if body["model"] == EXECUTOR_MODEL else "planner (LangChain)"
    roles = " ".join(m["role"] for m in body["messages"])
    print(f"  {agent} model call: {len(body['messages'])} messages [{roles}]")


def summary(doc: SessionDocument) -> str:
    tools = ", ".join(c.tool for c in doc.session.tool_state.tool_calls)
    models = ", ".join(u.model for u in doc.session.model_usage)
    return (
        f"{len(doc.session.messages)} messages, tool calls: {tools}; "
        f"{len(doc.evidences)} evidences; model calls: {models}"
    )


async def run(engine: ContextEngine, server: ScriptedOpenAIServer) -> list[str]:
    """The three turns (planner, executor, planner) on ``engine``, both models on ``server``;
    the replies."""
    ce.langchain.install(engine)  # <- one line per framework, one engine
    ce.llamaindex.install(engine)
    planner = create_agent(
        ChatOpenAI(model=PLANNER_MODEL, base_url=server.base_url, api_key="not-needed"),
        tools=[search_guide],
        system_prompt=PLANNER_PROMPT,
        checkpointer=InMemorySaver(),
    )
    executor = FunctionAgent(
        llm=OpenAI(model=EXECUTOR_MODEL, api_base=server.base_url, api_key="not-needed"),
        tools=[book_hotel],
        system_prompt=EXECUTOR_PROMPT,
    )
    planner_config = {"configurable": {"thread_id": SESSION_ID}}  # LangGraph names the session
    replies: list[str] = []
    shown = len(server.requests)

    async def turn(who: str, text: str) -> None:
        nonlocal shown
        print(f"\n== {who}\n> {text}")
        if who == "planner":
            state = await planner.ainvoke({"messages": [("user", text)]}, planner_config)
            reply = str(state["messages"][-1].content)
        else:
            with instrument_tags({"ce_session_id": SESSION_ID}):  # LlamaIndex names it
                reply = str(await executor.run(user_msg=text))
        for body in server.requests[shown:]:
            show_call(body)
        shown = len(server.requests)
        print(f"< {reply}")
        replies.append(reply)

    try:
        await turn("planner", "Please plan a short autumn trip to Oslo.")
        await turn("executor", "Execute the plan.")
        await turn("planner", "What did the executor book?")
    finally:
        ce.llamaindex.uninstall()
        ce.langchain.uninstall()
    return replies


async def main() -> None:
    budget = BudgetConfig(max_input_tokens=2000, reserved_reply_tokens=200)
    engine = ContextEngine(config=RuntimeConfig(model_hint="gpt-4o", budget=budget))
    await engine.store.delete_session(SESSION_ID)  # start fresh on every run
    with ScriptedOpenAIServer(model_script) as server:
        await run(engine, server)
    doc = await engine.get_session(SESSION_ID)
    print(f"\nsession {SESSION_ID!r}: {summary(doc)}")
    await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
