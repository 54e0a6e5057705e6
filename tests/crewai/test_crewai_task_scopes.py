"""Which conversation a task's model calls belong to beyond one task after another: tasks a
crew runs at the same time (``async_execution=True``) each work in a child scope and never
see each other's conversation in flight; the forced final answer an agent's executor asks for
once ``max_iter`` is reached (a call naming neither task nor agent) is a turn of the task."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from crew_apps import answers, kicked_off, kicked_off_by, llm, request_text, weather
from crewai import Agent, Crew, Task
from crewai.events import crewai_event_bus
from crewai.tools import tool

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

MARK = "NOTEBOOK-MARK-3307"
FORCED = "Now it's time you MUST give your absolute best final answer"


@pytest.mark.parametrize("path", ["kickoff", "akickoff"])
async def test_concurrent_async_tasks_never_see_each_others_conversation(
    engine: ContextEngine, path: str
) -> None:
    """Two ``async_execution`` tasks run together, then a task with both as its context.
    Alpha's tool waits until Bravo's request has gone out, so Alpha's second request comes
    after Bravo's turn: neither request carries the other task's prompt or answer. Each
    concurrent task works in a child scope of the crew's session (its tool run there with
    the model's call id); the crew's session keeps the three tasks and the summary's turn."""
    bravo_asked = threading.Event()

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if "Summarise" in body["messages"][-1]["content"]:
            return ScriptedResponse(text="SUMMARY.")
        if "You are Bravo" in body["messages"][0]["content"]:
            bravo_asked.set()
            return ScriptedResponse(text="ANSWER-BRAVO")
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text="ANSWER-ALPHA")
        return ScriptedResponse(tool_calls=[("call_wait", "wait_for_peer", '{"x": "1"}')])

    @tool("wait_for_peer")
    def wait_for_peer(x: str) -> str:
        """Wait for the other task's request."""
        return "waited" if bravo_asked.wait(timeout=30) else "gave up"

    with ScriptedOpenAIServer(script) as server:
        model = llm(server)
        alpha = Agent(role="Alpha", goal="g", backstory="b", llm=model, tools=[wait_for_peer])
        bravo = Agent(role="Bravo", goal="g", backstory="b", llm=model)
        writer = Agent(role="Writer", goal="g", backstory="b", llm=model)
        first = Task(name="alpha", description="Question alpha?", expected_output="x")
        second = Task(name="bravo", description="Question bravo?", expected_output="x")
        first.agent, second.agent = alpha, bravo
        first.async_execution = second.async_execution = True
        summary = Task(
            name="sum",
            description="Summarise.",
            expected_output="x",
            agent=writer,
            context=[first, second],
        )
        crew = Crew(agents=[alpha, bravo, writer], tasks=[first, second, summary])
        ce.crewai.install(engine, session_id="s-async")
        await engine.update_notebook("s-async", MARK)
        output = await kicked_off_by(crew, path)
        requests = server.requests
    assert output.raw == "SUMMARY."
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for request in requests:
        role = request["messages"][0]["content"].split(".")[0].removeprefix("You are ")
        by_agent.setdefault(role, []).append(request)
    alphas, bravos, (summarising,) = by_agent["Alpha"], by_agent["Bravo"], by_agent["Writer"]
    assert len(alphas) == 2 and len(bravos) == 1
    assert "waited" in request_text(alphas[1])
    for request in alphas:
        assert "Question bravo" not in request_text(request) and "ANSWER-BRAVO" not in request_text(
            request
        )
    assert "Question alpha" not in request_text(bravos[0])
    assert MARK in request_text(summarising)
    assert request_text(summarising).count("ANSWER-ALPHA") == 1
    assert request_text(summarising).count("ANSWER-BRAVO") == 1
    doc = await engine.get_session("s-async")
    records = {t.name: t for t in doc.session.task_state.todo_list.tasks}
    assert {n: t.status.value for n, t in records.items()} == dict.fromkeys(
        ("alpha", "bravo", "sum"), "completed"
    )
    assert answers(doc) == [("Writer", "SUMMARY.")]
    children = sorted(s for s in await engine.list_sessions() if s.startswith("s-async/"))
    assert len(children) == 2
    kids = [await engine.get_session(c) for c in children]
    told = sorted(a for kid in kids for a in answers(kid))
    assert told == [("Alpha", "ANSWER-ALPHA"), ("Bravo", "ANSWER-BRAVO")]
    (run,) = [r for kid in kids for r in kid.session.tool_state.tool_calls]
    assert (run.tool_call_id, run.tool, run.task_id) == (
        "call_wait",
        "wait_for_peer",
        records["alpha"].task_id,
    )


def _stubborn(body: dict[str, Any]) -> ScriptedResponse:
    """Asks for the weather again and again; answers once told to stop."""
    if FORCED in request_text(body):
        return ScriptedResponse(text="FORCED-ANSWER-5")
    n = len(body["messages"])
    return ScriptedResponse(tool_calls=[(f"call_{n}", "weather", json.dumps({"city": f"C{n}"}))])


@pytest.mark.parametrize("shape", ["crew", "agent"])
async def test_the_forced_final_answer_after_max_iter_is_a_turn_of_the_task(
    engine: ContextEngine, shape: str
) -> None:
    """The agent keeps calling its tool until ``max_iter``; CrewAI then asks for a final
    answer in a call that names neither task nor agent. That call gets the engine's input of
    the task's session (its tool chain, the notebook) and is recorded there: the demand and
    the answer, authored by the agent, with its usage under the task; no child session."""
    ce.crewai.install(engine, session_id="s-max")
    await engine.update_notebook("s-max", MARK)
    with ScriptedOpenAIServer(_stubborn) as server:
        agent = Agent(
            role="Researcher", goal="g", backstory="b", llm=llm(server), tools=[weather], max_iter=2
        )
        if shape == "crew":
            task = Task(name="research", description="Weather in Paris?", expected_output="x")
            task.agent = agent
            output = await kicked_off(engine, Crew(agents=[agent], tasks=[task]), "s-max")
        else:
            output = await _agent_kickoff(agent)
        requests = server.requests
    assert output.raw == "FORCED-ANSWER-5"
    forced = requests[-1]
    assert FORCED in request_text(forced) and MARK in request_text(forced)
    assert "[called weather(" in request_text(forced)  # the task's own tool chain, as text
    assert not [s for s in await engine.list_sessions() if s.startswith("s-max/")]
    doc = await engine.get_session("s-max")
    assert answers(doc)[-1] == ("Researcher", "FORCED-ANSWER-5")
    assert any(FORCED in m.content for m in doc.session.messages)
    usage = doc.session.model_usage
    assert len(usage) == len(requests)
    if shape == "crew":
        (record,) = doc.session.task_state.todo_list.tasks
        assert {u.task_id for u in usage} == {record.task_id}


async def _agent_kickoff(agent: Agent) -> Any:
    output = await asyncio.to_thread(agent.kickoff, "Weather in Paris?")
    crewai_event_bus.flush()
    return output
