"""A ``create_agent`` run that raised (its tool's error, not caught by the tool node) ends the
session's run: the web app that passes its history and runs the turn again sends its question
once, without the failed attempt's tool call; a run interrupted for a human is no failure."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

pytest.importorskip("langchain_openai")

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import ce.langchain
from ce.core.engine import ContextEngine
from ce.core.schema import Role, RunStatus
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse


def script(body: dict[str, Any]) -> ScriptedResponse:
    """A question about the weather gets the tool (a new call id each time, as OpenAI's),
    a tool result its answer, else a reply."""
    messages = body["messages"]
    last = messages[-1]
    if last["role"] == "tool":
        return ScriptedResponse(text="It is sunny.")
    if "weather" in last["content"]:
        call_id = f"call_{next(_ids)}"
        return ScriptedResponse(tool_calls=[(call_id, "weather", '{"city": "Rome"}')])
    return ScriptedResponse(text=f"reply to {last['content']}")


_ids = itertools.count(1)


def _read(request: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in request["messages"]]


@pytest.mark.parametrize("use_async", [False, True], ids=["invoke", "ainvoke"])
async def test_a_turn_run_again_after_its_tool_raised_sends_the_question_once(
    engine: ContextEngine, use_async: bool
) -> None:
    failing = [True]

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        if failing:
            failing.clear()
            raise RuntimeError("the weather service is down")
        return json.dumps({"city": city, "sky": "sunny"})

    async def run(messages: list[Any]) -> dict[str, Any]:
        inputs, config = {"messages": messages}, {"configurable": {"thread_id": "web"}}
        if use_async:
            result: dict[str, Any] = await agent.ainvoke(inputs, config)
        else:
            result = agent.invoke(inputs, config)
        return result

    with ScriptedOpenAIServer(script) as server:
        ce.langchain.install(engine)
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        agent = create_agent(model, tools=[weather])
        history: list[Any] = [HumanMessage("hi")]
        history.append((await run(history))["messages"][-1])
        history.append(HumanMessage("weather in Rome?"))
        with pytest.raises(RuntimeError, match="weather service is down"):
            await run(history)
        await engine.flush()
        doc = await engine.get_session("web")
        assert doc.session.run.status is RunStatus.FAILED
        retry_at = len(server.requests)
        answer = (await run(history))["messages"][-1]
        requests = server.requests[retry_at:]

    assert isinstance(answer, AIMessage) and answer.content == "It is sunny."
    assert _read(requests[0]) == [
        ("user", "hi"),
        ("assistant", "reply to hi"),
        ("user", "weather in Rome?"),
    ]
    assert [m["role"] for m in requests[1]["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
    ]
    doc = await engine.get_session("web")
    questions = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert questions == ["hi", "weather in Rome?"]
    assert doc.session.run.status is RunStatus.COMPLETED
