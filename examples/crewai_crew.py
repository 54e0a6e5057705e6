"""A CrewAI crew with one Context Engine line: a researcher with a weather tool and a writer
whose task depends on the research, kicked off in the session ``paris-brief``; every agent
LLM request receives the engine's assembled input for that session (the session's notebook
included) and the store ends up with the two tasks, their dependency and results, the tool
run with its task and the usage per task.

Runs offline: CrewAI's own OpenAI provider talks to ce.core's ScriptedOpenAIServer. The crew
is an unchanged CrewAI app; ``ce.crewai.install(engine, session_id=...)`` is the Context
Engine code it gets.

    python examples/crewai_crew.py   # store: $CE_STORE_URL or sqlite:///.ce/sessions.db
    ce show paris-brief              # the timeline and the usage per task (ce-core[cli])
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

SESSION = "paris-brief"


@tool("weather")
def weather(city: str) -> str:
    """Get the weather of a city."""
    return f"sunny and 21 C in {city}"


def script(body: dict[str, Any]) -> ScriptedResponse:
    """The model: asks for the weather once, then answers."""
    if body["messages"][-1]["role"] == "tool":
        return ScriptedResponse(text="Paris: sunny, 21 C.")
    if "weather" in json.dumps(body.get("tools", [])):
        args = json.dumps({"city": "Paris"})
        return ScriptedResponse(tool_calls=[("call_weather", "weather", args)])
    return ScriptedResponse(text="Pack sunglasses: Paris is sunny and 21 C.")


def build_crew(base_url: str) -> Crew:
    model = LLM(model="openai/gpt-4o-mini", base_url=base_url, api_key="sk-offline")
    researcher = Agent(
        role="Researcher", goal="find facts", backstory="careful", llm=model, tools=[weather]
    )
    writer = Agent(role="Writer", goal="write briefs", backstory="terse", llm=model)
    research = Task(
        name="research",
        description="What is the weather in Paris?",
        expected_output="a fact",
        agent=researcher,
    )
    brief = Task(
        name="brief",
        description="Write a one-line travel brief.",
        expected_output="a line",
        agent=writer,
        context=[research],
    )
    return Crew(agents=[researcher, writer], tasks=[research, brief])


async def run(engine: ContextEngine, server: ScriptedOpenAIServer) -> str:
    ce.crewai.install(engine, session_id=SESSION)
    try:
        await engine.update_notebook(SESSION, "The traveller prefers short answers.")
        output = await build_crew(server.base_url).akickoff()
        await engine.flush(SESSION)
        return str(output.raw)
    finally:
        ce.crewai.uninstall()


async def main() -> None:
    engine = ContextEngine()
    try:
        with ScriptedOpenAIServer(script) as server:
            print(await run(engine, server))
    finally:
        await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
