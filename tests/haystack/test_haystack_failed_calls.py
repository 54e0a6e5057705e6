"""After a model call that failed (the provider answered 500), or an Agent run that raised
(its tool's error, a cancellation), what the app does next is what the model gets: an Agent's
turn run again sends its question once, without the failed attempt's tool call and result; a
chat pipeline whose app dropped the failed question and asked another does not send the
dropped one. What the failed attempt stored stays stored."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from haystack import Pipeline
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage
from haystack.tools import Tool
from hs_apps import LOOKUP, generator, lookup

import ce.haystack
from ce.core.engine import ContextEngine
from ce.core.schema import Role, RunStatus
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse


def _texts(request: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in request["messages"]]


@pytest.mark.parametrize("awaited", [False, True], ids=["run", "run_async"])
async def test_an_agents_turn_run_again_after_its_model_failed_sends_the_question_once(
    awaited: bool, engine: ContextEngine
) -> None:
    failed: list[bool] = []

    def script(body: dict[str, Any]) -> ScriptedResponse:
        last = body["messages"][-1]
        if last["role"] == "tool":
            if not failed:  # the model fails after the tool ran, once
                failed.append(True)
                return ScriptedResponse(text="upstream overloaded", status=500)
            return ScriptedResponse(text="Sunny in Oslo.")
        return ScriptedResponse(tool_calls=[(f"call_{len(failed)}", "lookup", '{"q": "Oslo"}')])

    ce.haystack.install(engine)
    with ScriptedOpenAIServer(script) as server:
        agent = Agent(chat_generator=generator(server), tools=[LOOKUP], system_prompt="Helper.")
        asked = [ChatMessage.from_user("What's the weather in Oslo?")]
        context = {"ce_session_id": "weather"}
        with pytest.raises(Exception, match="overloaded"):
            if awaited:
                await agent.run_async(messages=asked, hook_context=context)
            else:
                agent.run(messages=asked, hook_context=context)
        doc = await engine.get_session("weather")
        assert doc is not None and doc.session.run.status is RunStatus.FAILED
        retry_at = len(server.requests)
        if awaited:
            result = await agent.run_async(messages=asked, hook_context=context)
        else:
            result = agent.run(messages=asked, hook_context=context)
        requests = server.requests[retry_at:]
    assert result["last_message"].text == "Sunny in Oslo."
    assert _texts(requests[0]) == [("system", "Helper."), ("user", "What's the weather in Oslo?")]
    assert [m["role"] for m in requests[1]["messages"]] == ["system", "user", "assistant", "tool"]
    doc = await engine.get_session("weather")
    assert doc is not None
    questions = [m for m in doc.session.messages if m.role is Role.USER]
    assert [m.content for m in questions] == ["What's the weather in Oslo?"]
    # the failed attempt's tool call and result stay stored, taken back
    calls = [c.tool_call_id for m in doc.session.messages for c in m.tool_calls or ()]
    assert calls == ["call_0", "call_1"]
    assert doc.session.run.status is RunStatus.COMPLETED


async def test_a_question_the_app_dropped_after_its_call_failed_is_not_sent(
    engine: ContextEngine,
) -> None:
    answered = 0

    def script(body: dict[str, Any]) -> ScriptedResponse:
        nonlocal answered
        answered += 1
        if answered == 2:
            return ScriptedResponse(text="upstream overloaded", status=500)
        return ScriptedResponse(text=f"answer to {body['messages'][-1]['content']}")

    ce.haystack.install(engine)
    with ScriptedOpenAIServer(script) as server:
        pipeline = Pipeline(metadata={"ce_session_id": "trip"})
        pipeline.add_component("llm", generator(server))
        history = [ChatMessage.from_system("Be brief."), ChatMessage.from_user("I plan a trip")]
        history.append(pipeline.run({"llm": {"messages": history}})["llm"]["replies"][0])
        with pytest.raises(Exception, match="overloaded"):
            dropped = [*history, ChatMessage.from_user("Delete my account")]
            pipeline.run({"llm": {"messages": dropped}})
        history.append(ChatMessage.from_user("Never mind: what should I pack?"))
        pipeline.run({"llm": {"messages": history}})
        last = server.requests[-1]
    assert _texts(last) == [
        ("system", "Be brief."),
        ("user", "I plan a trip"),
        ("assistant", "answer to I plan a trip"),
        ("user", "Never mind: what should I pack?"),
    ]
    doc = await engine.get_session("trip")
    assert doc is not None
    assert "Delete my account" in [m.content for m in doc.session.messages]


def _calling_lookup(body: dict[str, Any]) -> ScriptedResponse:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return ScriptedResponse(text="Sunny in Oslo.")
    call_id = f"call_{len(body['messages'])}"
    return ScriptedResponse(tool_calls=[(call_id, "lookup", '{"q": "Oslo"}')])


async def test_an_agents_turn_run_again_after_its_tool_raised_sends_the_question_once(
    engine: ContextEngine,
) -> None:
    """The tool's error raised out of the Agent (``raise_on_tool_invocation_failure``): no
    model call failed, the Agent's run did; the turn run again gets its question once,
    without the call left unanswered."""
    failing = [True]

    def flaky(q: str) -> str:
        if failing:
            failing.clear()
            raise RuntimeError("the weather service is down")
        return lookup(q)

    tool = Tool(
        name="lookup", description=LOOKUP.description, parameters=LOOKUP.parameters, function=flaky
    )
    ce.haystack.install(engine)
    with ScriptedOpenAIServer(_calling_lookup) as server:
        agent = Agent(
            chat_generator=generator(server),
            tools=[tool],
            system_prompt="Helper.",
            raise_on_tool_invocation_failure=True,
        )
        asked = [ChatMessage.from_user("What's the weather in Oslo?")]
        context = {"ce_session_id": "weather"}
        with pytest.raises(Exception, match="weather service is down"):
            agent.run(messages=asked, hook_context=context)
        doc = await engine.get_session("weather")
        assert doc is not None and doc.session.run.status is RunStatus.FAILED
        retry_at = len(server.requests)
        agent.run(messages=asked, hook_context=context)
        requests = server.requests[retry_at:]
    assert _texts(requests[0]) == [("system", "Helper."), ("user", "What's the weather in Oslo?")]
    doc = await engine.get_session("weather")
    assert doc is not None and doc.session.run.status is RunStatus.COMPLETED
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        "What's the weather in Oslo?"
    ]


async def test_an_agent_run_cancelled_in_its_tool_is_aborted_and_run_again_once(
    engine: ContextEngine,
) -> None:
    if "async_function" not in getattr(Tool, "__dataclass_fields__", {}):
        pytest.skip("this Haystack's tools have no async function")
    started = asyncio.Event()
    blocking = [True]

    async def slow(q: str) -> str:
        if blocking:
            blocking.clear()
            started.set()
            await asyncio.Event().wait()  # never set: the run is cancelled here
        return lookup(q)

    tool = Tool(
        name="lookup",
        description=LOOKUP.description,
        parameters=LOOKUP.parameters,
        function=lookup,
        async_function=slow,
    )
    ce.haystack.install(engine)
    with ScriptedOpenAIServer(_calling_lookup) as server:
        agent = Agent(chat_generator=generator(server), tools=[tool], system_prompt="Helper.")
        asked = [ChatMessage.from_user("What's the weather in Oslo?")]
        context = {"ce_session_id": "weather"}
        run = asyncio.create_task(agent.run_async(messages=asked, hook_context=context))
        await started.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        await engine.flush()
        doc = await engine.get_session("weather")
        assert doc is not None and doc.session.run.status is RunStatus.ABORTED
        retry_at = len(server.requests)
        await agent.run_async(messages=asked, hook_context=context)
        requests = server.requests[retry_at:]
    assert _texts(requests[0]) == [("system", "Helper."), ("user", "What's the weather in Oslo?")]
    doc = await engine.get_session("weather")
    assert doc is not None
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        "What's the weather in Oslo?"
    ]
