"""Install / uninstall: CrewAI's exact methods come back, the event-bus handlers go, and a
crew kicked off after ``uninstall()`` is neither rewritten nor recorded, its requests byte
for byte those of a crew that never met the plugin; a provider class
created while installed is covered (and left clean after); the ReAct text path."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from crew_apps import two_task_crew, weather
from crewai import Agent, Crew, Task
from crewai.events import crewai_event_bus
from crewai.llms.providers.openai.completion import OpenAICompletion

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

MARK = "NOTEBOOK-MARK-5520"


def _native(body: dict[str, Any]) -> ScriptedResponse:
    if body["messages"][-1]["role"] == "tool":
        return ScriptedResponse(text="Paris is sunny.")
    if "weather" in json.dumps(body.get("tools", [])):
        return ScriptedResponse(tool_calls=[("call_w", "weather", json.dumps({"city": "P"}))])
    return ScriptedResponse(text="Sunny Paris today.")


def _handlers() -> int:
    return sum(len(v) for v in crewai_event_bus._sync_handlers.values())


async def test_uninstall_puts_everything_back(engine: ContextEngine) -> None:
    kickoff, akickoff, call, acall = (
        Crew.kickoff,
        Crew.akickoff,
        OpenAICompletion.call,
        OpenAICompletion.acall,
    )
    handlers = _handlers()
    plugin = ce.crewai.install(engine, session_id="s-off")
    assert Crew.kickoff is not kickoff and OpenAICompletion.call is not call
    assert _handlers() == handlers + 8
    plugin.uninstall()
    assert (Crew.kickoff, Crew.akickoff) == (kickoff, akickoff)
    assert (OpenAICompletion.call, OpenAICompletion.acall) == (call, acall)
    assert _handlers() == handlers
    await engine.update_notebook("s-off", MARK)
    with ScriptedOpenAIServer(_native) as server:
        crew, _, _ = two_task_crew(server)
        await asyncio.to_thread(crew.kickoff)
        crewai_event_bus.flush()
        requests = server.requests
    assert len(requests) == 3 and all(MARK not in json.dumps(r) for r in requests)
    doc = await engine.get_session("s-off")
    assert doc is not None
    assert doc.session.task_state.todo_list.tasks == []
    assert doc.session.model_usage == [] and doc.session.tool_state.tool_calls == []


async def _requests_of_a_kickoff() -> list[str]:
    """The request bodies of a two-task crew's kickoff (a crew built anew), as JSON."""
    with ScriptedOpenAIServer(_native) as server:
        crew, _, _ = two_task_crew(server)
        await asyncio.to_thread(crew.kickoff)
        crewai_event_bus.flush()
        return [json.dumps(r, sort_keys=True) for r in server.requests]


async def test_uninstall_gives_byte_identical_requests(engine: ContextEngine) -> None:
    """A crew kicked off after an install and an uninstall (with a kickoff between, so the
    plugin acted) sends exactly the bytes it sent before the plugin was ever installed;
    also after a second install and uninstall on the same agents' classes."""
    before = await _requests_of_a_kickoff()
    assert len(before) == 3
    for session_id in ("s-bytes-1", "s-bytes-2"):
        await engine.update_notebook(session_id, MARK)
        plugin = ce.crewai.install(engine, session_id=session_id)
        during = await _requests_of_a_kickoff()
        assert during != before and MARK in during[0]
        plugin.uninstall()
        assert await _requests_of_a_kickoff() == before


async def test_respect_context_window_is_off_during_a_kickoff_only(
    engine: ContextEngine,
) -> None:
    """While the engine keeps the budget CrewAI's own summariser must not rewrite the
    engine's input: each agent's ``respect_context_window`` is off for the kickoff."""
    seen: list[bool] = []

    def script(body: dict[str, Any]) -> ScriptedResponse:
        seen.append(crew.agents[0].respect_context_window)
        return _native(body)

    ce.crewai.install(engine, session_id="s-window")
    with ScriptedOpenAIServer(script) as server:
        crew, _, _ = two_task_crew(server)
        assert all(a.respect_context_window for a in crew.agents)
        await asyncio.to_thread(crew.kickoff)
    assert seen == [False, False, False]
    assert all(a.respect_context_window for a in crew.agents)


async def test_the_react_text_path_gets_action_and_observation_together(
    engine: ContextEngine,
) -> None:
    """A provider without native tool calling (a subclass defined after ``install()``):
    CrewAI's Thought/Action text loop; the second request carries the Action with its
    Observation and the engine's input, and the tool run is recorded with its task."""

    class TextOnly(OpenAICompletion):
        def supports_function_calling(self) -> bool:
            return False

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if "sunny in Paris" in json.dumps(body["messages"]):
            return ScriptedResponse(text="Thought: done\nFinal Answer: It is sunny.")
        return ScriptedResponse(
            text='Thought: look it up\nAction: weather\nAction Input: {"city": "Paris"}'
        )

    ce.crewai.install(engine, session_id="s-react")
    await engine.update_notebook("s-react", MARK)
    with ScriptedOpenAIServer(script) as server:
        model = TextOnly(model="gpt-4o-mini", base_url=server.base_url, api_key="sk-scripted")
        agent = Agent(role="Forecaster", goal="g", backstory="b", llm=model, tools=[weather])
        task = Task(name="forecast", description="Weather in Paris?", expected_output="x")
        task.agent = agent
        output = await asyncio.to_thread(Crew(agents=[agent], tasks=[task]).kickoff)
        crewai_event_bus.flush()
        requests = server.requests
    assert output.raw == "It is sunny."
    assert len(requests) == 2
    assert all(MARK in r["messages"][0]["content"] for r in requests)
    second = json.dumps(requests[1]["messages"])
    assert "Action: weather" in second and "Observation: sunny in Paris" in second
    assert second.index("Action: weather") < second.index("Observation: sunny in Paris")
    doc = await engine.get_session("s-react")
    assert doc is not None
    (record,) = doc.session.task_state.todo_list.tasks
    (run,) = doc.session.tool_state.tool_calls
    assert (run.tool, run.status.value, run.task_id) == ("weather", "success", record.task_id)
    ce.crewai.uninstall()
    assert "call" not in vars(TextOnly) or TextOnly.call is OpenAICompletion.call
