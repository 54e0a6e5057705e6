"""A Haystack RAG agent with one Context Engine line: a Pipeline retrieves travel guides
(BM25 over an in-memory document store), a ``ChatPromptBuilder`` inlines them into the
question, and an ``Agent`` with a forecast tool answers; two questions in the session
``oslo-trip`` (named in the Pipeline's ``metadata``). Every model call of the Agent's tool
loop receives the engine's assembled input for that session: the Agent's system prompt first,
the session's notebook, each retrieved guide once (as ``rag_doc`` evidence fenced with its
id, the prompt's inline copy replaced by a pointer to it), the earlier turn, within the
budget.

Runs offline: Haystack's own ``OpenAIChatGenerator`` talks to ce.core's ScriptedOpenAIServer.
The pipeline is an unchanged Haystack app; ``ce.haystack.install(engine)`` is the Context
Engine code it gets.

    python examples/haystack_rag_agent.py   # store: $CE_STORE_URL or sqlite:///.ce/sessions.db
    ce show oslo-trip                       # the session's timeline (ce-core[cli])
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack import Document, Pipeline
from haystack.components.agents import Agent
from haystack.components.builders import ChatPromptBuilder
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.tools import Tool
from haystack.utils import Secret

import ce.haystack
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import SessionDocument
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

SESSION_ID = "oslo-trip"
SYSTEM_PROMPT = "You are a travel assistant. Use your tools; answer in one sentence."
QUESTIONS = ("What is the weather in Oslo this weekend?", "What should I pack for Oslo?")
GUIDES = (
    ("kb://guides/oslo", "Oslo guide: the old town is walkable; trams run every 10 minutes."),
    ("kb://guides/bergen", "Bergen guide: the funicular runs up Mount Floyen all year."),
)
FORECASTS = {"oslo": "Oslo this weekend: 9 C, light rain on Saturday, dry on Sunday."}
TEMPLATE = [
    ChatMessage.from_user(
        "Guides:\n{% for d in documents %}{{ d.content }}\n{% endfor %}Question: {{ query }}"
    )
]


def forecast(city: str) -> str:
    """This weekend's forecast for a city."""
    return FORECASTS.get(city.lower(), f"no forecast for {city}")


def model_script(body: dict[str, Any]) -> ScriptedResponse:
    """The scripted model: it answers only from what its request holds."""
    messages = body["messages"]
    text = json.dumps(messages)
    last_user = [i for i, m in enumerate(messages) if m["role"] == "user"][-1]
    question = str(messages[last_user]["content"]).rsplit("Question: ", 1)[-1]
    results = [m["content"] for m in messages[last_user + 1 :] if m["role"] == "tool"]
    if question == QUESTIONS[0] and not results:
        args = json.dumps({"city": "Oslo"})
        return ScriptedResponse(tool_calls=[("call_forecast", "forecast", args)])
    if question == QUESTIONS[0]:
        return ScriptedResponse(text="9 C with light rain on Saturday, dry on Sunday.")
    rain = "a rain jacket" if "light rain" in text else "nothing special"
    trams = " and a tram card" if "trams run" in text else ""
    return ScriptedResponse(text=f"Pack {rain}{trams}.")


def build_pipeline(server: ScriptedOpenAIServer) -> Pipeline:
    """The unchanged Haystack app."""
    store = InMemoryDocumentStore()
    store.write_documents([Document(content=c, meta={"source": uri}) for uri, c in GUIDES])
    generator = OpenAIChatGenerator(
        api_key=Secret.from_token("sk-offline"),
        model="gpt-4o",
        api_base_url=server.base_url,
        max_retries=0,
    )
    tool = Tool(
        name="forecast",
        description="This weekend's forecast for a city.",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
        function=forecast,
    )
    pipeline = Pipeline(metadata={"ce_session_id": SESSION_ID})
    pipeline.add_component("retriever", InMemoryBM25Retriever(store, top_k=1))
    pipeline.add_component("prompt", ChatPromptBuilder(template=TEMPLATE, required_variables="*"))
    pipeline.add_component(
        "agent", Agent(chat_generator=generator, tools=[tool], system_prompt=SYSTEM_PROMPT)
    )
    pipeline.connect("retriever.documents", "prompt.documents")
    pipeline.connect("prompt.prompt", "agent.messages")
    return pipeline


def show_call(body: dict[str, Any]) -> None:
    roles = " ".join(m["role"] for m in body["messages"])
    print(f"  model call: {len(body['messages'])} messages [{roles}]")


def summary(doc: SessionDocument) -> str:
    return (
        f"{len(doc.session.messages)} messages, "
        f"{len(doc.session.tool_state.tool_calls)} tool call(s), "
        f"{len(doc.evidences)} evidence(s), {len(doc.session.model_usage)} model calls"
    )


async def run(engine: ContextEngine, server: ScriptedOpenAIServer) -> list[str]:
    """The two questions in the session; the Agent's answers."""
    pipeline = build_pipeline(server)
    ce.haystack.install(engine)  # the one line
    await engine.update_notebook(SESSION_ID, "The user is travelling light.")
    answers: list[str] = []
    try:
        for question in QUESTIONS:
            data = {"retriever": {"query": question}, "prompt": {"query": question}}
            result = await pipeline.run_async(data)
            answers.append(str(result["agent"]["last_message"].text))
            print(f"user: {question}\nagent: {answers[-1]}")
    finally:
        ce.haystack.uninstall()
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
