"""Human-in-the-loop tool calls of a ``create_agent`` app with the plugin installed, over
ChatOpenAI on the scripted OpenAI server: a tool that ``interrupt()``s is no failed run (the
resumed run records the outcome), and a call a human rejected (``HumanInTheLoopMiddleware``,
whose result LangChain marks ``status="error"``) is recorded and fenced as a failure."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

pytest.importorskip("langchain_openai")

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt

import ce.langchain
from ce.core.engine import ContextEngine
from ce.core.schema import ToolCallStatus
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

FENCE = re.compile(r'<evidence[^>]* status="(\w+)">')


def script(body: dict[str, Any]) -> ScriptedResponse:
    """A tool call for each new request of the user, a closing answer after a tool result."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return ScriptedResponse(text="done")
    n = sum(m["role"] == "user" for m in messages)
    return ScriptedResponse(tool_calls=[(f"call_{n}", "book_hotel", json.dumps({"hotel": "Ritz"}))])


def tool_statuses(request: dict[str, Any]) -> dict[str, str]:
    """The ``status`` of the fenced tool results a request holds, by tool call id."""
    out: dict[str, str] = {}
    for message in request["messages"]:
        if message["role"] == "tool":
            match = FENCE.search(message["content"])
            assert match, message["content"]
            out[message["tool_call_id"]] = match.group(1)
    return out


async def invoke(agent: Any, inputs: Any, config: Any, use_async: bool) -> dict[str, Any]:
    result: dict[str, Any] = (
        await agent.ainvoke(inputs, config) if use_async else agent.invoke(inputs, config)
    )
    return result


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_a_tool_that_interrupts_is_recorded_by_its_resumed_run(
    engine: ContextEngine, use_async: bool
) -> None:
    runs: list[str] = []

    @tool
    def book_hotel(hotel: str) -> str:
        """Book a hotel."""
        runs.append(hotel)
        answer = interrupt({"question": f"Book {hotel}?"})
        return f"booked {hotel} ({answer})"

    config: Any = {"configurable": {"thread_id": "trip"}}
    with ScriptedOpenAIServer(script) as server:
        ce.langchain.install(engine)
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        agent = create_agent(model, tools=[book_hotel], checkpointer=InMemorySaver())
        first = await invoke(agent, {"messages": [("user", "book a hotel")]}, config, use_async)
        assert "__interrupt__" in first
        await invoke(agent, Command(resume="yes"), config, use_async)
        requests = server.requests

    assert runs == ["Ritz", "Ritz"]  # interrupted, then run again on resume
    # the model gets the resumed run's result as a success
    assert len(requests) == 2
    assert tool_statuses(requests[-1]) == {"call_1": "success"}
    assert "booked Ritz (yes)" in requests[-1]["messages"][-1]["content"]
    # the store: one record of the call, the resumed run's
    doc = await engine.get_session("trip")
    records = doc.session.tool_state.tool_calls
    assert [(r.tool_call_id, r.status) for r in records] == [("call_1", ToolCallStatus.SUCCESS)]


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_a_rejected_tool_call_reaches_the_model_as_an_error(
    engine: ContextEngine, use_async: bool
) -> None:
    middleware = pytest.importorskip("langchain.agents.middleware")
    if not hasattr(middleware, "HumanInTheLoopMiddleware"):
        pytest.skip("this langchain has no HumanInTheLoopMiddleware")
    runs: list[str] = []

    @tool
    def book_hotel(hotel: str) -> str:
        """Book a hotel."""
        runs.append(hotel)
        return f"booked {hotel}"

    config: Any = {"configurable": {"thread_id": "trip"}}
    reject = {"decisions": [{"type": "reject", "message": "not that one"}]}
    with ScriptedOpenAIServer(script) as server:
        ce.langchain.install(engine)
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        agent = create_agent(
            model,
            tools=[book_hotel],
            middleware=[middleware.HumanInTheLoopMiddleware(interrupt_on={"book_hotel": True})],
            checkpointer=InMemorySaver(),
        )
        first = await invoke(agent, {"messages": [("user", "book a hotel")]}, config, use_async)
        assert "__interrupt__" in first
        state = await invoke(agent, Command(resume=reject), config, use_async)
        await invoke(agent, {"messages": [("user", "book another")]}, config, use_async)
        requests = server.requests

    assert runs == []  # the tool never ran
    rejection = state["messages"][-2]
    assert rejection.type == "tool" and rejection.status == "error"
    # the model gets the rejection as a failed call's result, on every later call too
    assert len(requests) == 3  # the call, its rejection answered, the next request's call
    assert tool_statuses(requests[1]) == {"call_1": "error"}
    assert "not that one" in requests[1]["messages"][-1]["content"]
    assert tool_statuses(requests[2]) == {"call_1": "error"}
    # the store: the call is recorded as failed
    doc = await engine.get_session("trip")
    records = {r.tool_call_id: r.status for r in doc.session.tool_state.tool_calls}
    assert records["call_1"] is ToolCallStatus.ERROR


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_a_failed_call_earlier_in_a_passed_history_reaches_the_model_as_an_error(
    engine: ContextEngine, use_async: bool
) -> None:
    """A history the session has not recorded, passed whole (a chat app's stored
    conversation), holds a rejected tool call before the newest question; the next call adds
    another failed one, again before its newest question: the model gets each as a failed
    call's result, and the store records both calls as failed."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    def failed(call_id: str, question: str) -> list[Any]:
        return [
            HumanMessage(question),
            AIMessage("", tool_calls=[{"id": call_id, "name": "book_hotel", "args": {}}]),
            ToolMessage("User rejected the tool call", tool_call_id=call_id, status="error"),
            AIMessage("not booked"),
        ]

    first = [SystemMessage("You book hotels."), *failed("c1", "book it"), HumanMessage("why?")]
    second = [*first, AIMessage("you said no"), *failed("c2", "book again"), HumanMessage("ok")]
    config: Any = {"metadata": {"ce_session_id": "s"}}
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="ok")) as server:
        ce.langchain.install(engine)
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        for history in (first, second):
            if use_async:
                await model.ainvoke(history, config)
            else:
                model.invoke(history, config)
        requests = server.requests

    assert tool_statuses(requests[0]) == {"c1": "error"}
    assert tool_statuses(requests[1]) == {"c1": "error", "c2": "error"}
    doc = await engine.get_session("s")
    records = {r.tool_call_id: r.status for r in doc.session.tool_state.tool_calls}
    assert records == {"c1": ToolCallStatus.ERROR, "c2": ToolCallStatus.ERROR}
