"""Who wrote what: an agent's answer that the app hands to the next agent as history keeps
the author it was stored with; ``inject=False`` records everything and sends CrewAI's own
requests."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from crew_apps import llm, two_task_crew
from crewai import Agent
from crewai.events import crewai_event_bus

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

MARK = "NOTEBOOK-MARK-4410"


def _authored(doc: Any, role: Role) -> list[tuple[str | None, str]]:
    return [
        (m.author.id if m.author else None, m.content)
        for m in doc.session.messages
        if m.role is role and m.content
    ]


async def test_an_answer_re_sent_to_the_next_agent_keeps_its_author(
    engine: ContextEngine,
) -> None:
    def script(body: dict[str, Any]) -> ScriptedResponse:
        if "Summarise" in json.dumps(body["messages"]):
            return ScriptedResponse(text="W-SUMMARY")
        return ScriptedResponse(text="R-FINDING: it rains in Oslo.")

    ce.crewai.install(engine, session_id="s-auth")
    with ScriptedOpenAIServer(script) as server:
        researcher = Agent(role="Researcher", goal="g", backstory="b", llm=llm(server))
        writer = Agent(role="Writer", goal="g", backstory="b", llm=llm(server))
        found = await asyncio.to_thread(researcher.kickoff, "Weather in Oslo?")
        history = [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": found.raw},
            {"role": "user", "content": "Summarise it."},
        ]
        await asyncio.to_thread(writer.kickoff, history)
        crewai_event_bus.flush()
        requests = server.requests
    assert len(requests) == 2
    assert "R-FINDING: it rains in Oslo." in json.dumps(requests[1]["messages"])
    doc = await engine.get_session("s-auth")
    assert doc is not None
    assert _authored(doc, Role.ASSISTANT) == [
        ("Researcher", "R-FINDING: it rains in Oslo."),
        ("Writer", "W-SUMMARY"),
    ]


async def test_inject_false_records_and_sends_crewais_own_requests(
    engine: ContextEngine,
) -> None:
    def script(body: dict[str, Any]) -> ScriptedResponse:
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text="Paris is sunny.", prompt_tokens=40, completion_tokens=4)
        if "weather" in json.dumps(body.get("tools", [])):
            args = json.dumps({"city": "Paris"})
            return ScriptedResponse(tool_calls=[("call_w", "weather", args)])
        return ScriptedResponse(text="Sunny Paris today.", prompt_tokens=50, completion_tokens=6)

    ce.crewai.install(engine, session_id="s-record", inject=False)
    await engine.update_notebook("s-record", MARK)
    with ScriptedOpenAIServer(script) as server:
        crew, _, _ = two_task_crew(server)
        assert all(a.respect_context_window for a in crew.agents)
        output = await asyncio.to_thread(crew.kickoff)
        crewai_event_bus.flush()
        requests = server.requests
    assert output.raw == "Sunny Paris today."
    assert len(requests) == 3
    assert all(MARK not in json.dumps(r["messages"]) for r in requests)
    # CrewAI's own requests: the writer's carries no researcher tool round
    assert all(m["role"] != "tool" for m in requests[2]["messages"])
    assert requests[0]["messages"][0]["content"].startswith("You are Researcher.")
    doc = await engine.get_session("s-record")
    assert doc is not None
    tasks = {t.name: t for t in doc.session.task_state.todo_list.tasks}
    assert {t.status.value for t in tasks.values()} == {"completed"}
    assert tasks["write"].depends_on == [tasks["research"].task_id]
    (run,) = doc.session.tool_state.tool_calls
    assert (run.tool_call_id, run.task_id) == ("call_w", tasks["research"].task_id)
    assert _authored(doc, Role.ASSISTANT)[-2:] == [
        ("Researcher", "Paris is sunny."),
        ("Writer", "Sunny Paris today."),
    ]
    by_task = await engine.get_usage_by_task("s-record")
    assert by_task[tasks["write"].task_id].prompt_tokens == 50
    assert by_task[tasks["research"].task_id].calls == 2
    assert len(await engine.list_turns("s-record")) == 3  # each request recorded
