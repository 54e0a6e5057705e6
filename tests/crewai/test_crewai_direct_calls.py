"""A direct ``LLM.call`` / ``acall`` in a session a crew's agents wrote to (a Flow's step
before or after a crew, in one named session): it reads the agents' turns as theirs and never
takes on an agent's system prompt; a system prompt of its own is its instruction; an agent
reads its reply as another's turn, never as its own."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from crew_apps import answers, llm, request_text, weather
from crewai import Agent, Crew, Process, Task
from crewai.events import crewai_event_bus
from crewai.flow.flow import Flow, listen, start

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

BACKSTORY = "You ONLY answer with weather tool output (BACKSTORY-5150)."
OWN_PROMPT = "You are a terse summariser (OWN-PROMPT-7207)."


def _script(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    tools = json.dumps(body.get("tools", []))
    if "delegate_work_to_coworker" in tools:
        if messages[-1]["role"] == "tool":
            return ScriptedResponse(text="MANAGER-FINAL: Oslo is sunny.")
        args = {"task": "find the weather", "context": "Oslo", "coworker": "Researcher"}
        return ScriptedResponse(
            tool_calls=[("call_delegate", "delegate_work_to_coworker", json.dumps(args))]
        )
    if messages[-1]["role"] == "tool":
        return ScriptedResponse(text="RESEARCH: Oslo is sunny today.")
    if '"weather"' in tools:
        return ScriptedResponse(tool_calls=[("call_w", "weather", json.dumps({"city": "Oslo"}))])
    return ScriptedResponse(text="SUMMARY: sunny")


def _researcher(server: ScriptedOpenAIServer) -> Agent:
    return Agent(
        role="Researcher",
        goal="find weather facts",
        backstory=BACKSTORY,
        llm=llm(server),
        tools=[weather],
    )


def _summarising_flow(server: ScriptedOpenAIServer, path: str) -> Flow[dict[str, Any]]:
    """@start: a one-agent crew researches; @listen: two direct model calls summarise what
    it found, the first with no system prompt, the second with one of its own."""

    class Summarise(Flow[dict[str, Any]]):
        @start()
        def research(self) -> str:
            task = Task(
                name="research",
                description="What is the weather in Oslo?",
                expected_output="a fact",
                agent=_researcher(server),
            )
            return str(Crew(agents=[task.agent], tasks=[task]).kickoff().raw)

        @listen(research)
        async def summarise(self, fact: str) -> str:
            model = llm(server)
            asked = [{"role": "user", "content": f"Summarise in two words: {fact}"}]
            own = [{"role": "system", "content": OWN_PROMPT}, *asked]
            if path == "call":
                await asyncio.to_thread(model.call, asked)
                return str(await asyncio.to_thread(model.call, own))
            await model.acall(asked)
            return str(await model.acall(own))

    return Summarise()


@pytest.mark.parametrize("path", ["call", "acall"])
async def test_a_direct_call_after_a_crew_reads_its_turns_without_the_agents_prompt(
    engine: ContextEngine, path: str
) -> None:
    """The Flow runs in ``engine.session``: the researcher's requests start with its own
    system prompt; the direct call that passes none gets no agent's prompt (the engine's
    context, the task list, still comes), the researcher's task prompt as the user's and the
    researcher's turn as ``[Researcher wrote:]`` (its tool call and result as text), never as
    an assistant turn of its own; a direct call with a system prompt gets that prompt, and
    the earlier direct call's answer as its own turn."""
    ce.crewai.install(engine)
    with ScriptedOpenAIServer(_script) as server:

        def run() -> Any:
            with engine.session("s-flow-direct"):
                return _summarising_flow(server, path).kickoff()

        assert await asyncio.to_thread(run) == "SUMMARY: sunny"
        crewai_event_bus.flush()
        requests = server.requests
    assert len(requests) == 4
    for request in requests[:2]:  # the researcher's: its own prompt first
        assert request["messages"][0]["role"] == "system"
        assert request["messages"][0]["content"].startswith("You are Researcher.")
    bare, own = requests[2:]
    for request in (bare, own):
        assert BACKSTORY not in request_text(request)
        assert "Your personal goal is" not in request_text(request)
        assert not request.get("tools")
        messages = request["messages"]
        (turn,) = [m for m in messages if "[called weather(" in str(m.get("content"))]
        assert turn["role"] == "user"
        assert turn["content"].startswith('[Researcher wrote:]\n[called weather({"city": "Oslo"})]')
        assert "sunny in Oslo" in turn["content"]
        assert "Current Task: What is the weather in Oslo?" in request_text(request)
        assert messages[-1] == {
            "role": "user",
            "content": "Summarise in two words: RESEARCH: Oslo is sunny today.",
        }
    system = bare["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("## Tasks")
    assert "- [x] research (" in system["content"]
    assert all(m["role"] in ("system", "user") for m in bare["messages"])
    assert own["messages"][0]["content"].startswith(OWN_PROMPT)
    # the only assistant turn the second direct call reads is the first one's answer
    assistant = [m for m in own["messages"] if m["role"] == "assistant"]
    assert assistant == [{"role": "assistant", "content": "SUMMARY: sunny"}]


async def test_a_direct_call_after_a_hierarchical_crew_is_not_the_manager(
    engine: ContextEngine,
) -> None:
    """After a hierarchical crew in the same session, a direct call that passes no system
    prompt gets neither the manager's prompt nor its turns as its own."""
    ce.crewai.install(engine, session_id="s-after-manager")
    with ScriptedOpenAIServer(_script) as server:
        task = Task(name="report", description="Report the weather.", expected_output="a line")
        crew = Crew(
            agents=[_researcher(server)],
            tasks=[task],
            process=Process.hierarchical,
            manager_llm=llm(server),
        )
        await asyncio.to_thread(crew.kickoff)
        crewai_event_bus.flush()
        await llm(server).acall("Classify this request: weather please")
        crewai_event_bus.flush()
        requests = server.requests
    manager = [r for r in requests if "delegate_work_to_coworker" in json.dumps(r.get("tools"))]
    assert len(manager) == 2
    assert all(r["messages"][0]["content"].startswith("You are Crew Manager.") for r in manager)
    direct = requests[-1]
    assert "Crew Manager." not in json.dumps(direct["messages"][0])
    assert direct["messages"][0]["content"].startswith("## Tasks")
    assert all(m["role"] in ("system", "user") for m in direct["messages"])
    texts = [str(m["content"]) for m in direct["messages"]]
    (turn,) = [t for t in texts if "[called delegate_work_to_coworker(" in t]
    assert turn.startswith("[Crew Manager wrote:]\n") and "MANAGER-FINAL" in turn
    assert texts[-1] == "Classify this request: weather please"


async def test_a_direct_call_gets_none_of_an_agents_prompt_the_engine_redacted(
    engine: ContextEngine,
) -> None:
    """The engine sends an agent's prompt redacted (an email in its backstory): the direct
    call after it in the session still gets none of it, and no system message when the
    prompt was all the engine's system message held."""
    ce.crewai.install(engine, session_id="s-redacted-prompt")
    with ScriptedOpenAIServer(_script) as server:
        clerk = Agent(
            role="Clerk",
            goal="file",
            backstory="Write to clerk.canary@example.com (BACKSTORY-9931).",
            llm=llm(server),
        )
        await asyncio.to_thread(clerk.kickoff, "File the report.")
        crewai_event_bus.flush()
        await llm(server).acall("Anything else?")
        crewai_event_bus.flush()
        requests = server.requests
    assert len(requests) == 2
    agent, direct = (request_text(r) for r in requests)
    assert "BACKSTORY-9931" in agent and "clerk.canary@" not in agent
    assert "BACKSTORY-9931" not in direct
    assert [m["role"] for m in requests[1]["messages"]] == ["user", "user", "user"]
    assert requests[1]["messages"][1]["content"] == "[Clerk wrote:]\nSUMMARY: sunny"


def _classified_flow(server: ScriptedOpenAIServer, path: str) -> Flow[dict[str, Any]]:
    """@start: a direct model call classifies the request; @listen: a hierarchical crew
    reports on it; @listen: a direct call asks a follow-up."""

    async def direct(content: str) -> str:
        asked = [{"role": "user", "content": content}]
        if path == "call":
            return str(await asyncio.to_thread(llm(server).call, asked))
        return str(await llm(server).acall(asked))

    class Classified(Flow[dict[str, Any]]):
        @start()
        async def classify(self) -> str:
            return await direct("Classify this request: weather please")

        @listen(classify)
        def report(self, topic: str) -> str:
            task = Task(name="report", description="Report the weather.", expected_output="a line")
            crew = Crew(
                agents=[_researcher(server)],
                tasks=[task],
                process=Process.hierarchical,
                manager_llm=llm(server),
            )
            return str(crew.kickoff().raw)

        @listen(report)
        async def follow_up(self, report: str) -> str:
            return await direct("Anything else?")

    return Classified()


@pytest.mark.parametrize("path", ["call", "acall"])
async def test_a_direct_calls_reply_reaches_an_agent_as_anothers_turn(
    engine: ContextEngine, path: str
) -> None:
    """A Flow's direct call classifies, a hierarchical crew reports, a direct call follows up,
    all in one session: the direct call's reply is stored authored ``LLM.call`` and reaches
    the manager as ``[LLM.call wrote:]``, never as the manager's own assistant turn; the
    later direct call reads that reply as its own turn and the manager's as the manager's."""
    ce.crewai.install(engine)
    with ScriptedOpenAIServer(_script) as server:

        def run() -> Any:
            with engine.session("s-classified"):
                return _classified_flow(server, path).kickoff()

        await asyncio.to_thread(run)
        crewai_event_bus.flush()
        requests = server.requests
    manager = [r for r in requests if "delegate_work_to_coworker" in json.dumps(r.get("tools"))]
    assert len(manager) == 2
    for request in manager:
        messages = request["messages"]
        assert {"role": "user", "content": "[LLM.call wrote:]\nSUMMARY: sunny"} in messages
        assert not [m for m in messages if m["role"] == "assistant" and "SUMMARY" in str(m)]
    follow_up = requests[-1]["messages"]
    assert follow_up[-1] == {"role": "user", "content": "Anything else?"}
    assistant = [m for m in follow_up if m["role"] == "assistant"]
    assert assistant == [{"role": "assistant", "content": "SUMMARY: sunny"}]
    (turn,) = [m for m in follow_up if "[called delegate_work_to_coworker(" in str(m["content"])]
    assert turn["role"] == "user" and turn["content"].startswith("[Crew Manager wrote:]\n")
    stored = answers(await engine.get_session("s-classified"))
    assert stored[0] == ("LLM.call", "SUMMARY: sunny")
