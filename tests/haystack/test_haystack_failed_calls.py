"""After a model call that failed (the provider answered 500), what the app does next is what
the model gets: an Agent's turn run again sends its question once, without the failed
attempt's tool call and result; a chat pipeline whose app dropped the failed question and asked
another does not send the dropped one. What the failed attempt stored stays stored."""

from __future__ import annotations

from typing import Any

import pytest
from haystack import Pipeline
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage
from hs_apps import LOOKUP, generator

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
