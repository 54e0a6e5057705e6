"""An AutoGen team with one Context Engine line: a researcher (with a tool and a memory) and a
writer take turns in a ``RoundRobinGroupChat``; every model call of either receives the
engine's assembled input for the session ``oslo-brief``: its own system message first, the
session's notebook and evidence (the memory's hits, recorded once and sent once), the other
agent's turns as user messages named after it, within the budget.

Runs offline: AutoGen's own ``OpenAIChatCompletionClient`` talks to ce.core's
ScriptedOpenAIServer. The team is an unchanged AutoGen app; ``ce.autogen.install(engine)`` is
the Context Engine code it gets, and ``engine.session(...)`` names the conversation.

    python examples/autogen_team.py   # store: $CE_STORE_URL or sqlite:///.ce/sessions.db
    ce show oslo-brief                # the session's timeline (ce-core[cli])
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core.memory import ListMemory, MemoryContent
from autogen_ext.models.openai import OpenAIChatCompletionClient

import ce.autogen
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import SessionDocument
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

SESSION_ID = "oslo-brief"
MODEL = "gpt-4o-2024-08-06"
RESEARCHER_PROMPT = "You are the researcher. Look facts up with your tool; never write prose."
WRITER_PROMPT = "You are the writer. Turn the researcher's facts into one short paragraph."
TASK = "Brief me on a weekend in Oslo."
FORECASTS = {"oslo": "Oslo this weekend: 9 C, light rain on Saturday, dry on Sunday."}


def weather(city: str) -> str:
    """This weekend's forecast for a city."""
    return FORECASTS.get(city.lower(), f"no forecast for {city}")


def _speaker(body: dict[str, Any]) -> str:
    return "researcher" if RESEARCHER_PROMPT in body["messages"][0]["content"] else "writer"


def model_script(body: dict[str, Any]) -> ScriptedResponse:
    """The scripted model: it answers only from what its request holds."""
    messages = body["messages"]
    text = json.dumps(messages)
    if _speaker(body) == "researcher":
        if messages[-1]["role"] != "tool":
            return ScriptedResponse(
                tool_calls=[("call_weather_1", "weather", json.dumps({"city": "Oslo"}))]
            )
        facts = [s for s in ("9 C", "light rain", "window seat") if s in text]
        return ScriptedResponse(text="Facts: " + "; ".join(facts) + ".")
    researcher = [m for m in messages if m.get("name") == "researcher"]
    if not researcher:
        return ScriptedResponse(text="I have no facts to write from.")
    facts = researcher[-1]["content"].removeprefix("Facts: ").rstrip(".")
    return ScriptedResponse(text=f"Oslo this weekend: {facts}. Pack a rain jacket.")


def show_call(body: dict[str, Any]) -> None:
    roles = " ".join(
        m["role"] + (f"({m['name']})" if m.get("name") else "") for m in body["messages"]
    )
    print(f"  {_speaker(body)} model call: {len(body['messages'])} messages [{roles}]")


def summary(doc: SessionDocument) -> str:
    authors = sorted({m.author.id for m in doc.session.messages if m.author is not None})
    return (
        f"{len(doc.session.messages)} messages by {', '.join(authors)}, "
        f"{len(doc.session.tool_state.tool_calls)} tool run(s), "
        f"{len(doc.evidences)} evidence(s), {len(doc.session.model_usage)} model calls"
    )


def build_team(server: ScriptedOpenAIServer) -> RoundRobinGroupChat:
    """The unchanged AutoGen app."""
    memory = ListMemory(
        memory_contents=[
            MemoryContent(
                content="The user always books a window seat.",
                mime_type="text/plain",
                metadata={"source": "crm://prefs/42", "score": 0.9},
            )
        ]
    )
    researcher = AssistantAgent(
        "researcher",
        model_client=OpenAIChatCompletionClient(
            model=MODEL, base_url=server.base_url, api_key="sk-offline"
        ),
        tools=[weather],
        memory=[memory],
        system_message=RESEARCHER_PROMPT,
        reflect_on_tool_use=True,
    )
    writer = AssistantAgent(
        "writer",
        model_client=OpenAIChatCompletionClient(
            model=MODEL, base_url=server.base_url, api_key="sk-offline"
        ),
        system_message=WRITER_PROMPT,
    )
    return RoundRobinGroupChat([researcher, writer], termination_condition=MaxMessageTermination(3))


async def run(engine: ContextEngine, server: ScriptedOpenAIServer) -> list[str]:
    """One team run in the session; the team's messages (the task, then each agent's)."""
    team = build_team(server)
    ce.autogen.install(engine)  # the one line
    await engine.update_notebook(SESSION_ID, "The user is travelling light.")
    try:
        with engine.session(SESSION_ID):
            result = await team.run(task=TASK)
    finally:
        ce.autogen.uninstall()
    for body in server.requests:
        show_call(body)
    chat = [m for m in result.messages if isinstance(m, BaseChatMessage)]
    for message in chat:
        print(f"{message.source}: {message.to_model_text()}")
    return [m.to_model_text() for m in chat]


async def main() -> None:
    budget = BudgetConfig(max_input_tokens=2000, reserved_reply_tokens=200)
    engine = ContextEngine(config=RuntimeConfig(model_hint="gpt-4o", budget=budget))
    await engine.store.delete_session(SESSION_ID)  # start fresh on every run
    with ScriptedOpenAIServer(model_script) as server:
        await run(engine, server)
    doc = await engine.get_session(SESSION_ID)
    print(f"\nsession {SESSION_ID!r}: {summary(doc)}")
    await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
