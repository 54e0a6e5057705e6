"""Every model call of every agent of a crew gets the engine's input within the budget, tool
schemas counted: a three-agent crew (the researcher with a tool) kicked off again and again in
one session, so the session outgrows the budget and holds the other agents' turns (sent to
each agent as those agents' words) and a tool chain per kickoff. Each request: within the
budget, tool pairs intact, the calling agent's own system prompt first and no other agent's,
its task in the newest user message."""

from __future__ import annotations

import json
from typing import Any

import pytest
from crew_apps import kicked_off_by, llm, weather
from crewai import Agent, Crew, Task

import ce.crewai
from ce.core import BudgetConfig, RuntimeConfig
from ce.core.formats import from_openai_messages
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, deterministic_engine
from ce.core.testing.assertions import assert_tool_pairs_intact
from ce.core.tokens import TiktokenEstimator

BUDGET = 500
ROLES = ("Researcher", "Analyst", "Writer")
FINDING = "A finding with a few details that matter for the report. " * 3


def _script(body: dict[str, Any]) -> ScriptedResponse:
    """The researcher calls the weather tool once per task, then every agent answers."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool" or not body.get("tools"):
        return ScriptedResponse(text=FINDING)
    return ScriptedResponse(
        tool_calls=[(f"call_{len(messages)}", "weather", json.dumps({"city": "Paris"}))]
    )


def _crew(server: ScriptedOpenAIServer, kickoff: int, tools: bool) -> Crew:
    model = llm(server)
    agents = [
        Agent(
            role=role,
            goal="help",
            backstory=f"The {role.lower()} of the team.",
            llm=model,
            tools=[weather] if tools and role == "Researcher" else [],
        )
        for role in ROLES
    ]
    tasks = [
        Task(
            name=f"{role.lower()}-{kickoff}",
            description=f"Kickoff {kickoff}: the {role.lower()}'s step on the Paris weather.",
            expected_output="a short text",
            agent=agent,
        )
        for role, agent in zip(ROLES, agents, strict=True)
    ]
    return Crew(agents=agents, tasks=tasks)


@pytest.mark.parametrize("tools", [True, False], ids=["researcher-with-tool", "no-tools"])
@pytest.mark.parametrize("path", ["kickoff", "akickoff"])
async def test_every_call_of_every_agent_is_within_budget(path: str, tools: bool) -> None:
    """Without tools each peer turn is one plain answer, so each request holds the most
    ``[<role> wrote:]`` headers for its size: the engine counts them with the budget."""
    config = RuntimeConfig(
        model_hint="gpt-4o",
        budget=BudgetConfig(max_input_tokens=BUDGET + 100, reserved_reply_tokens=100),
    )
    engine = deterministic_engine(config)
    estimator = TiktokenEstimator()
    with ScriptedOpenAIServer(_script) as server:
        ce.crewai.install(engine, session_id="s-budget")
        for kickoff in range(5):
            await kicked_off_by(_crew(server, kickoff, tools), path)
        requests = server.requests
    await engine.flush()
    # per kickoff: the researcher twice with its tool, then one call each
    assert len(requests) == 5 * (4 if tools else 3)
    cut = 0
    for request in requests:
        parts = from_openai_messages(request["messages"])
        used = sum(estimator.estimate_part(p, "gpt-4o") for p in parts)
        tools = estimator.estimate_tools(request.get("tools") or [], "gpt-4o")
        assert used + tools <= BUDGET
        assert_tool_pairs_intact(parts)
        system = request["messages"][0]
        assert system["role"] == "system"
        (own,) = [role for role in ROLES if f"You are {role}" in system["content"]]
        users = [m for m in request["messages"] if m["role"] == "user"]
        assert f"the {own.lower()}'s step" in users[-1]["content"]
        cut += "Kickoff 0:" not in json.dumps(request["messages"])
    assert cut >= 8  # the budget left the first kickoffs out of the later calls
    doc = await engine.get_session("s-budget")
    assert len(doc.session.messages) > 30  # while the session keeps every message
    await engine.close()
