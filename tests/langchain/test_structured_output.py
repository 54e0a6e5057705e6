"""Calls made through ``with_structured_output`` answer the app, not the conversation.

A router (or a grader, an extractor) runs ``llm.with_structured_output(Route)`` on the
conversation, then the app's main call sends the same messages: LangChain keeps no such reply
in a chat history (the output parser turns it into the app's data), so the main call's
request is what the app sends, never the router's reply as an earlier assistant turn nor the
question asked twice. Driven over langchain-openai's ``ChatOpenAI`` on the scripted
OpenAI-compatible server; each graph runs once without the plugin and once with it, and the
request bodies are compared.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from pydantic import BaseModel

import ce.langchain
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import EvidenceType, Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, deterministic_engine


class Route(BaseModel):
    """Which desk answers."""

    desk: Literal["billing", "tech"]


def script(body: dict[str, Any]) -> ScriptedResponse:
    if body.get("response_format"):
        return ScriptedResponse(text=json.dumps({"desk": "billing"}))
    if body.get("tools"):
        route = json.dumps({"desk": "billing"})
        return ScriptedResponse(tool_calls=[("call_route", "Route", route)])
    asked = sum(m["role"] == "user" for m in body["messages"])
    return ScriptedResponse(text=f"Answer {asked} from the desk.")


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    desk: str


def router_graph(llm: ChatOpenAI, method: str) -> Any:
    """A router node classifies the conversation; the desk's node answers it."""
    router = llm.with_structured_output(Route, method=method)  # type: ignore[arg-type]

    def route(state: State) -> dict[str, Any]:
        choice = router.invoke([SystemMessage("Classify the request."), *state["messages"]])
        assert isinstance(choice, Route)
        return {"desk": choice.desk}

    def desk(state: State) -> dict[str, Any]:
        prompt = SystemMessage(f"You are the {state['desk']} desk.")
        return {"messages": [llm.invoke([prompt, *state["messages"]])]}

    graph = StateGraph(State)
    graph.add_node("route", route)
    graph.add_node("desk", desk)
    graph.add_edge(START, "route")
    graph.add_edge("route", "desk")
    graph.add_edge("desk", END)
    return graph.compile(checkpointer=InMemorySaver())


def _bodies(requests: list[dict[str, Any]]) -> list[list[tuple[str, str]]]:
    return [[(m["role"], str(m.get("content"))) for m in r["messages"]] for r in requests]


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o"))
    yield engine
    await engine.close()


def _run(method: str, engine: ContextEngine | None) -> list[dict[str, Any]]:
    with ScriptedOpenAIServer(script) as server:
        llm = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        app = router_graph(llm, method)
        if engine is not None:
            ce.langchain.install(engine)
        config = {"configurable": {"thread_id": "t-router"}}
        for question in ("Where is my invoice?", "And the one from May?"):
            app.invoke({"messages": [HumanMessage(question)]}, config)
        if engine is not None:
            ce.langchain.uninstall()
        return server.requests


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
async def test_a_routers_structured_call_is_no_turn_of_the_conversation(
    engine: ContextEngine, method: str
) -> None:
    native = _run(method, None)
    sent = _run(method, engine)
    assert len(sent) == len(native) == 4
    assert _bodies(sent) == _bodies(native)
    doc = await engine.get_session("t-router")
    said = [m.content for m in doc.session.messages if m.role is Role.ASSISTANT]
    assert said == ["Answer 1 from the desk.", "Answer 2 from the desk."]
    assert all(not m.tool_calls for m in doc.session.messages)
    # the router's answer is kept as its calls' output (the same text twice: one evidence)
    outputs = [e.content for e in doc.evidences.values() if e.type is EvidenceType.LLM_OUTPUT]
    assert any('"billing"' in o for o in outputs)
    assert len(doc.session.model_usage) == 4


async def test_the_apps_own_form_of_a_structured_answer_is_the_turn(
    engine: ContextEngine,
) -> None:
    """The app turns a structured answer into its own assistant message and goes on: the
    model gets the app's message, not the raw JSON beside it."""
    with ScriptedOpenAIServer(script) as server:
        llm = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        ce.langchain.install(engine, session_id="s-structured")
        history: list[AnyMessage] = [HumanMessage("Which desk handles invoices?")]
        route = llm.with_structured_output(Route).invoke(history)
        assert isinstance(route, Route)
        history += [AIMessage(f"The {route.desk} desk."), HumanMessage("Thanks, and refunds?")]
        llm.invoke(history)
        requests = server.requests
    assert _bodies(requests)[-1] == [
        ("user", "Which desk handles invoices?"),
        ("assistant", "The billing desk."),
        ("user", "Thanks, and refunds?"),
    ]


GENERATE = "Answer the question from the context. Question: {question} Context: {context}"


@tool
def retrieve_posts(query: str) -> str:
    """Search the blog posts."""
    return "Reward hacking is when an agent exploits flaws in its reward function. " * 3


def rag_script(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    last = str(messages[-1].get("content"))
    if body.get("response_format"):
        return ScriptedResponse(text=json.dumps({"relevant": "yes"}))
    if last.startswith("Answer the question"):
        return ScriptedResponse(text="It exploits reward flaws.")
    if messages[-1]["role"] == "user" and body.get("tools"):
        args = json.dumps({"query": last[:30]})
        return ScriptedResponse(tool_calls=[(f"call_{len(messages)}", "retrieve_posts", args)])
    return ScriptedResponse(text="Hello!")


class Grade(BaseModel):
    """Whether the retrieved text answers the question."""

    relevant: Literal["yes", "no"]


def agentic_rag(llm: ChatOpenAI) -> Any:
    """LangGraph's agentic RAG: a node answers or retrieves with the conversation, a grader
    judges the retrieved text, a node answers from a prompt it builds from scratch."""

    def query_or_respond(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.bind_tools([retrieve_posts]).invoke(state["messages"])]}

    def grade(state: MessagesState) -> str:
        question, context = state["messages"][0].content, state["messages"][-1].content
        prompt = f"Does this answer {question}? {context}"
        llm.with_structured_output(Grade).invoke([{"role": "user", "content": prompt}])
        return "generate"

    def generate(state: MessagesState) -> dict[str, Any]:
        question, context = state["messages"][0].content, state["messages"][-1].content
        prompt = GENERATE.format(question=question, context=context)
        return {"messages": [llm.invoke([{"role": "user", "content": prompt}])]}

    def retrieve(state: MessagesState) -> dict[str, Any]:
        calls = getattr(state["messages"][-1], "tool_calls", [])
        return {"messages": [retrieve_posts.invoke(call) for call in calls]}

    def route(state: MessagesState) -> str:
        return "retrieve" if getattr(state["messages"][-1], "tool_calls", None) else END

    graph = StateGraph(MessagesState)
    graph.add_node("query_or_respond", query_or_respond)
    graph.add_node("retrieve", retrieve)
    graph.add_node("generate", generate)
    graph.add_edge(START, "query_or_respond")
    graph.add_conditional_edges("query_or_respond", route, ["retrieve", END])
    graph.add_conditional_edges("retrieve", grade, ["generate"])
    graph.add_edge("generate", END)
    return graph.compile(checkpointer=InMemorySaver())


def _rag_bodies(engine: ContextEngine | None) -> list[list[tuple[str, str]]]:
    with ScriptedOpenAIServer(rag_script) as server:
        app = agentic_rag(ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-t"))
        if engine is not None:
            ce.langchain.install(engine)
        config = {"configurable": {"thread_id": "t-rag"}}
        for question in ("What is reward hacking?", "And how to avoid it?"):
            app.invoke({"messages": [HumanMessage(question)]}, config)
        if engine is not None:
            ce.langchain.uninstall()
        # a tool result goes fenced as evidence: compared by who sent it
        return [
            [
                (m["role"], "tool" if m["role"] == "tool" else str(m.get("content")))
                for m in r["messages"]
            ]
            for r in server.requests
        ]


async def test_a_graph_nodes_own_prompts_are_no_turns_of_the_conversation(
    engine: ContextEngine,
) -> None:
    """A LangGraph node that calls the model with a prompt it builds from scratch (none of
    the graph's messages: a grader, an answer from the retrieved context) is the node's own
    work: its request is the node's prompt alone, and the conversation's next calls carry
    neither that prompt nor the grader's, as without the plugin."""
    native = _rag_bodies(None)
    sent = _rag_bodies(engine)
    assert len(sent) == len(native) == 6
    assert sent == native
    doc = await engine.get_session("t-rag")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert users == ["What is reward hacking?", "And how to avoid it?"]
    # each node's own call in a session of its own (the grader runs in the edge after
    # "retrieve", so in that node's run)
    children = [s for s in await engine.list_sessions() if s.startswith("t-rag/")]
    nodes = sorted(s.split("/")[1].split(":")[0] for s in children)
    assert nodes == ["generate", "generate", "retrieve", "retrieve"]
