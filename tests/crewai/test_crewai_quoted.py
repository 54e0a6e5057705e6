"""What CrewAI quotes of an earlier answer in a task's prompt reaches the model once, however
short: a guardrail's rejected attempt in the retry prompt, a task's output in the next task's
context (native replies and the Thought/Action text format), and in a three-task crew each
output, also where an earlier prompt quoted it too. The store keeps every message."""

from __future__ import annotations

from typing import Any

import pytest
from crew_apps import answers, kicked_off, kicked_off_by, llm, request_text, weather
from crewai import Agent, Crew, Task
from crewai.llms.providers.openai.completion import OpenAICompletion

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

REJECTED = "DRAFT-ONE: rainy."
ACCEPTED = "DRAFT-TWO: sunny."
FACT = "FACT-SUNNY-17"
LINE = "LINE-WRITTEN-9"


@pytest.mark.parametrize("path", ["kickoff", "akickoff"])
async def test_a_guardrail_retry_gets_the_rejected_attempt_once(
    engine: ContextEngine, path: str
) -> None:
    """The guardrail rejects the first answer; CrewAI's retry prompt quotes it, so the
    retry's request holds it there only, not also as the agent's earlier turn."""

    def script(body: dict[str, Any]) -> ScriptedResponse:
        retry = "Previous attempt failed validation" in request_text(body)
        return ScriptedResponse(text=ACCEPTED if retry else REJECTED)

    # no return annotation: CrewAI checks one at runtime and cannot read a postponed one
    def sunny(output: Any):  # type: ignore[no-untyped-def]
        return ("sunny" in output.raw, output.raw if "sunny" in output.raw else "say sunny")

    ce.crewai.install(engine, session_id="s-guard")
    with ScriptedOpenAIServer(script) as server:
        writer = Agent(role="Writer", goal="write", backstory="terse", llm=llm(server))
        task = Task(
            name="write",
            description="Write the forecast.",
            expected_output="a line",
            agent=writer,
            guardrail=sunny,
        )
        output = await kicked_off_by(Crew(agents=[writer], tasks=[task]), path)
        requests = server.requests
    assert output.raw == ACCEPTED
    assert len(requests) == 2
    retry = requests[1]["messages"]
    assert request_text(requests[1]).count(REJECTED) == 1
    assert REJECTED in retry[-1]["content"] and "failed validation" in retry[-1]["content"]
    assert all(m["role"] != "assistant" for m in retry)
    doc = await engine.get_session("s-guard")
    assert answers(doc) == [("Writer", REJECTED), ("Writer", ACCEPTED)]  # stored as they came


def _by_task(body: dict[str, Any]) -> ScriptedResponse:
    """Answers the newest task prompt of a request."""
    prompts = [m["content"] for m in body["messages"] if "Current Task:" in str(m["content"])]
    task = prompts[-1].split("Current Task:")[-1]
    for word, answer in (("Edit", "EDITED."), ("Write", LINE), ("Weather", FACT)):
        if word in task:
            return ScriptedResponse(text=answer)
    raise AssertionError(task)


def _research_then_write(model: Any, tools: list[Any] | None = None) -> Crew:
    """A researcher (with ``tools``) finds the weather; a writer writes one line about it,
    with the research as its task's context."""
    researcher = Agent(
        role="Researcher", goal="find", backstory="careful", llm=model, tools=tools or []
    )
    writer = Agent(role="Writer", goal="write", backstory="terse", llm=model)
    research = Task(description="Weather in Paris?", expected_output="a fact", agent=researcher)
    write = Task(
        description="Write one line about it.",
        expected_output="a line",
        agent=writer,
        context=[research],
    )
    return Crew(agents=[researcher, writer], tasks=[research, write])


async def test_a_short_task_output_reaches_the_next_agent_once(engine: ContextEngine) -> None:
    """The researcher's answer is short; CrewAI quotes it as the writer's context: the
    writer's request holds it once, in its prompt (no turn of the researcher's is left to
    show: its answer was all of it)."""
    with ScriptedOpenAIServer(_by_task) as server:
        output = await kicked_off(engine, _research_then_write(llm(server)), "s-short")
        requests = server.requests
    assert output.raw == LINE
    writing = requests[-1]["messages"]
    assert request_text(requests[-1]).count(FACT) == 1
    assert FACT in writing[-1]["content"] and "Write one line" in writing[-1]["content"]
    assert not any(str(m["content"]).startswith("[Researcher wrote:]") for m in writing)
    doc = await engine.get_session("s-short")
    assert answers(doc) == [("Researcher", FACT), ("Writer", LINE)]


async def test_a_three_task_crew_sends_each_short_output_once(engine: ContextEngine) -> None:
    """Without declared context CrewAI hands each task every earlier output: the editor's
    prompt quotes both, the writer's prompt the first. The editor's request holds each once
    (in its prompt); the writer's prompt goes as CrewAI writes a task without context."""
    with ScriptedOpenAIServer(_by_task) as server:
        model = llm(server)
        agents = [
            Agent(role=role, goal="help", backstory="brief", llm=model)
            for role in ("Researcher", "Writer", "Editor")
        ]
        tasks = [
            Task(description=text, expected_output="text", agent=agent)
            for text, agent in zip(
                ("Weather in Paris?", "Write one line about it.", "Edit the line."),
                agents,
                strict=True,
            )
        ]
        output = await kicked_off(engine, Crew(agents=agents, tasks=tasks), "s-three")
        requests = server.requests
    assert output.raw == "EDITED."
    editing = requests[-1]["messages"]
    assert (
        request_text(requests[-1]).count(FACT) == 1 and request_text(requests[-1]).count(LINE) == 1
    )
    assert FACT in editing[-1]["content"] and LINE in editing[-1]["content"]
    users = [m["content"] for m in editing[:-1] if m["role"] == "user"]
    (writing,) = [u for u in users if "Write one line" in u]
    assert "This is the context you're working with" not in writing
    assert writing.endswith("Provide your complete response:")  # the rest of it as it was
    doc = await engine.get_session("s-three")
    prompts = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert any(FACT in p and "Write one line" in p for p in prompts)  # stored as it came


async def test_the_text_formats_final_answer_reaches_the_next_agent_once(
    engine: ContextEngine,
) -> None:
    """A provider without native tool calling: the researcher's reply is ``Thought: ...
    Final Answer: <answer>`` and CrewAI quotes the answer alone as the writer's context: the
    writer's request holds it once, while the researcher's Action and Observation still go
    in its turn."""

    class TextOnly(OpenAICompletion):
        def supports_function_calling(self) -> bool:
            return False

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if "You are Writer" in body["messages"][0]["content"]:
            return ScriptedResponse(text=LINE)
        if "sunny in Paris" in request_text(body):
            return ScriptedResponse(text=f"Thought: done\nFinal Answer: {FACT}")
        return ScriptedResponse(
            text='Thought: look it up\nAction: weather\nAction Input: {"city": "Paris"}'
        )

    with ScriptedOpenAIServer(script) as server:
        model = TextOnly(model="gpt-4o-mini", base_url=server.base_url, api_key="sk-scripted")
        crew = _research_then_write(model, tools=[weather])
        output = await kicked_off(engine, crew, "s-text")
        requests = server.requests
    assert output.raw == LINE
    writing = requests[-1]["messages"]
    assert request_text(requests[-1]).count(FACT) == 1 and FACT in writing[-1]["content"]
    assert "Observation: sunny in Paris" in request_text(requests[-1])
    doc = await engine.get_session("s-text")
    assert ("Researcher", f"Thought: done\nFinal Answer: {FACT}") in answers(doc)
