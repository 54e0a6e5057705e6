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
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
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
