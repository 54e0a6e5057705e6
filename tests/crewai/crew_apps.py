"""Small crews on the scripted OpenAI server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from crewai import LLM, Agent, Crew, Task
from crewai.events import crewai_event_bus
from crewai.tools import tool

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer


@tool("weather")
def weather(city: str) -> str:
    """Get the weather of a city."""
    return f"sunny in {city}"


def llm(server: ScriptedOpenAIServer) -> Any:
    return LLM(model="openai/gpt-4o-mini", base_url=server.base_url, api_key="sk-scripted")


def two_task_crew(
    server: ScriptedOpenAIServer,
    tool: Any = weather,
    question: str = "What is the weather in Paris?",
    reply: str = "Write one line about it.",
) -> tuple[Crew, Task, Task]:
    """A researcher with ``tool`` (the weather tool) asked ``question``, then a writer whose
    task, ``reply``, depends on it."""
    model = llm(server)
    researcher = Agent(
        role="Researcher", goal="find facts", backstory="careful", llm=model, tools=[tool]
    )
    writer = Agent(role="Writer", goal="write", backstory="terse", llm=model)
    research = Task(
        name="research",
        description=question,
        expected_output="a fact",
        agent=researcher,
    )
    write = Task(
        name="write",
        description=reply,
        expected_output="a line",
        agent=writer,
        context=[research],
    )
    return Crew(agents=[researcher, writer], tasks=[research, write]), research, write


async def kicked_off(engine: ContextEngine, crew: Crew, session_id: str) -> Any:
    """``crew.kickoff()`` on a worker thread with the plugin installed in ``session_id``, its
    event handlers done; the crew's output."""
    ce.crewai.install(engine, session_id=session_id)
    output = await asyncio.to_thread(crew.kickoff)
    crewai_event_bus.flush()
    return output


async def kicked_off_by(crew: Crew, path: str) -> Any:
    """``crew`` kicked off through ``path``: ``"kickoff"`` on a worker thread or
    ``"akickoff"`` on this loop, its event handlers done; the crew's output."""
    if path == "akickoff":
        output = await crew.akickoff()
    else:
        output = await asyncio.to_thread(crew.kickoff)
    crewai_event_bus.flush()
    return output


def request_text(request: dict[str, Any]) -> str:
    """A request body's messages as one JSON text, to search."""
    return json.dumps(request["messages"])


def answers(doc: Any) -> list[tuple[str | None, str]]:
    """The stored assistant messages with text, as ``(author id, text)``."""
    return [
        (m.author.id if m.author else None, m.content)
        for m in doc.session.messages
        if m.role is Role.ASSISTANT and m.content
    ]
