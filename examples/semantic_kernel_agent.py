"""A Semantic Kernel agent with one Context Engine line: a ``ChatCompletionAgent`` with a
travel plugin (a forecast function and a document search) answers two questions on the
thread ``oslo-trip``; every request of its auto-function-calling loop receives the engine's
assembled input for that session: the agent's instructions first, the session's notebook,
the search hits (recorded once as ``rag_doc`` evidence, sent once), the earlier turn, within
the budget. The thread's id is the session.

Runs offline: SK's own ``OpenAIChatCompletion`` (with an ``AsyncOpenAI`` client) talks to
ce.core's ScriptedOpenAIServer. The agent is an unchanged SK app;
``ce.semantic_kernel.install(engine)`` is the Context Engine code it gets.

    python examples/semantic_kernel_agent.py   # store: $CE_STORE_URL or sqlite:///.ce/sessions.db
    ce show oslo-trip                          # the session's timeline (ce-core[cli])
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from openai import AsyncOpenAI
from semantic_kernel import Kernel
from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.open_ai import OpenAIChatCompletion
from semantic_kernel.functions import kernel_function

import ce.semantic_kernel
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import SessionDocument
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

SESSION_ID = "oslo-trip"
INSTRUCTIONS = "You are a travel assistant. Use your functions; answer in one sentence."
QUESTIONS = ("What is the weather in Oslo this weekend?", "And what should I pack?")
GUIDE = "Oslo guide: the old town is walkable; trams run every 10 minutes."
FORECASTS = {"oslo": "Oslo this weekend: 9 C, light rain on Saturday, dry on Sunday."}


class Travel:
    """The app's SK plugin."""

    @kernel_function(name="forecast", description="This weekend's forecast for a city.")
    def forecast(self, city: Annotated[str, "the city"]) -> str:
        return FORECASTS.get(city.lower(), f"no forecast for {city}")

    @kernel_function(name="search_guides", description="Search the travel guides.")
    def search_guides(self, query: Annotated[str, "what to look for"]) -> list[str]:
        # shaped as SK's VectorSearch.create_search_function returns hits
        hit = {"record": {"id": "guide-oslo", "content": GUIDE, "source": "kb://guides/oslo"}}
        return [json.dumps({**hit, "score": 0.87})]


def model_script(body: dict[str, Any]) -> ScriptedResponse:
    """The scripted model: it answers only from what its request holds."""
    messages = body["messages"]
    text = json.dumps(messages)
    question = [m for m in messages if m["role"] == "user"][-1]["content"]
    after = messages[[m.get("content") for m in messages].index(question) + 1 :]
    results = [m["content"] for m in after if m["role"] == "tool"]
    if question == QUESTIONS[0]:
        if not results:
            return ScriptedResponse(
                tool_calls=[("call_forecast", "Travel-forecast", json.dumps({"city": "Oslo"}))]
            )
        return ScriptedResponse(text="9 C with light rain on Saturday, dry on Sunday.")
    if not results:
        args = json.dumps({"query": "Oslo packing"})
        return ScriptedResponse(tool_calls=[("call_guides", "Travel-search_guides", args)])
    rain = "a rain jacket" if "light rain" in text else "nothing special"
    trams = " and a tram card" if "trams" in text else ""
    return ScriptedResponse(text=f"Pack {rain}{trams}.")


def build_agent(server: ScriptedOpenAIServer) -> ChatCompletionAgent:
    """The unchanged SK app."""
    kernel = Kernel()
    client = AsyncOpenAI(base_url=server.base_url, api_key="sk-offline", max_retries=0)
    kernel.add_service(OpenAIChatCompletion(ai_model_id="gpt-4o", async_client=client))
    kernel.add_plugin(Travel(), "Travel")
    return ChatCompletionAgent(
        kernel=kernel,
        name="travel_agent",
        instructions=INSTRUCTIONS,
        function_choice_behavior=FunctionChoiceBehavior.Auto(),
    )


def show_call(body: dict[str, Any]) -> None:
    roles = " ".join(m["role"] for m in body["messages"])
    print(f"  model call: {len(body['messages'])} messages [{roles}]")


def summary(doc: SessionDocument) -> str:
    return (
        f"{len(doc.session.messages)} messages, "
        f"{len(doc.session.tool_state.tool_calls)} function call(s), "
        f"{len(doc.evidences)} evidence(s), {len(doc.session.model_usage)} model calls"
    )


async def run(engine: ContextEngine, server: ScriptedOpenAIServer) -> list[str]:
    """The two questions on the thread; the agent's answers."""
    agent = build_agent(server)
    ce.semantic_kernel.install(engine)  # the one line
    await engine.update_notebook(SESSION_ID, "The user is travelling light.")
    answers: list[str] = []
    try:
        thread = ChatHistoryAgentThread(thread_id=SESSION_ID)
        for question in QUESTIONS:
            response = await agent.get_response(messages=question, thread=thread)
            answers.append(str(response.message.content))
            print(f"user: {question}\nagent: {answers[-1]}")
    finally:
        ce.semantic_kernel.uninstall()
    for body in server.requests:
        show_call(body)
    return answers


async def main() -> None:
    budget = BudgetConfig(max_input_tokens=2000, reserved_reply_tokens=200)
    engine = ContextEngine(config=RuntimeConfig(model_hint="gpt-4o", budget=budget))
    await engine.store.delete_session(SESSION_ID)  # start fresh on every run
    with ScriptedOpenAIServer(model_script) as server:
        await run(engine, server)
    doc = await engine.get_session(SESSION_ID)
    print(f"session {SESSION_ID!r}: {summary(doc)}")
    await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
