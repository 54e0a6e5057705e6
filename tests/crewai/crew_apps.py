"""Small crews on the scripted OpenAI server."""

from __future__ import annotations

from typing import Any

from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

from ce.core.testing import ScriptedOpenAIServer


@tool("weather")
def weather(city: str) -> str:
    """Get the weather of a city."""
    return f"sunny in {city}"


def llm(server: ScriptedOpenAIServer) -> Any:
    return LLM(model="openai/gpt-4o-mini", base_url=server.base_url, api_key="sk-scripted")


def two_task_crew(server: ScriptedOpenAIServer) -> tuple[Crew, Task, Task]:
    """A researcher with the weather tool, then a writer whose task depends on it."""
    model = llm(server)
    researcher = Agent(
        role="Researcher", goal="find facts", backstory="careful", llm=model, tools=[weather]
    )
    writer = Agent(role="Writer", goal="write", backstory="terse", llm=model)
    research = Task(
        name="research",
        description="What is the weather in Paris?",
        expected_output="a fact",
        agent=researcher,
    )
    write = Task(
        name="write",
        description="Write one line about it.",
        expected_output="a line",
        agent=writer,
        context=[research],
    )
    return Crew(agents=[researcher, writer], tasks=[research, write]), research, write
