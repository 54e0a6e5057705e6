"""ce-langchain quickstart: an unchanged LangChain agent (a tool and a retriever over a handful
of documents) plus one line, ``ce.langchain.install(engine)``.

Runs offline: ChatOpenAI talks to ce.core's ScriptedOpenAIServer (no network, no keys). The
engine stores the session in the embedded SQLite default store and, before every model call,
hands the model its assembled input within a small budget. Per turn it prints the report.

    python examples/quickstart.py      # store: $CE_STORE_URL or sqlite:///.ce/sessions.db
    ce report quickstart               # the same report from the store (ce-core[cli])
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

import ce.langchain
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.stores import default_store_url
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

SESSION_ID = "quickstart"
DOCS = {
    "paris": "Paris has an oceanic climate; autumn days average 15°C. " * 6,
    "oslo": "Oslo autumns are cool and wet, around 6°C, with frequent rain. " * 6,
    "packing": "Pack layers and a waterproof jacket for northern Europe. " * 6,
}


class Handbook(BaseRetriever):
    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [
            Document(page_content=text, metadata={"source": f"kb://{key}", "score": 0.8})
            for key, text in DOCS.items()
            if key in query.lower()
        ]


@tool
def search_handbook(query: str) -> str:
    """Search the travel handbook."""
    return "\n".join(d.page_content for d in Handbook().invoke(query))


@tool
def weather(city: str) -> str:
    """Today's weather in a city."""
    return json.dumps({"city": city, "temp_c": 17, "sky": "cloudy"})


def model_script(body: dict[str, Any]) -> ScriptedResponse:
    """The scripted model: look up the city named in the question, then answer."""
    messages = body["messages"]
    question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    city = next((c for c in ("paris", "oslo") if c in question.lower()), "paris")
    done = [
        m
        for m in messages[
            messages.index(next(m for m in reversed(messages) if m["role"] == "user")) :
        ]
        if m["role"] == "tool"
    ]
    if not done:
        return ScriptedResponse(
            tool_calls=[
                (f"call_{city}_h{len(messages)}", "search_handbook", json.dumps({"query": city})),
                (f"call_{city}_w{len(messages)}", "weather", json.dumps({"city": city})),
            ]
        )
    return ScriptedResponse(text=f"{city.title()}: cloudy, 17°C; see the handbook for packing.")


async def main() -> None:
    engine = ContextEngine(
        config=RuntimeConfig(
            model_hint="gpt-4o",
            budget=BudgetConfig(max_input_tokens=700, reserved_reply_tokens=150),
        )
    )
    ce.langchain.install(engine)  # <- the one line
    with ScriptedOpenAIServer(model_script) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="not-needed")
        agent = create_agent(
            model,
            tools=[search_handbook, weather],
            system_prompt="You are a travel assistant.",
            checkpointer=InMemorySaver(),
        )
        config = {"configurable": {"thread_id": SESSION_ID}}
        for question in (
            "What is the weather in Paris? Reply to me at jane@example.com",
            "And in Oslo?",
            "Should I pack for Paris?",
        ):
            state = await agent.ainvoke({"messages": [("user", question)]}, config)
            print(f"\n> {question}\n< {state['messages'][-1].content}")
    for turn in await engine.list_turns(SESSION_ID):
        report = turn.report
        if report is None:
            continue
        print(f"  turn {turn.turn_id}: {report.token_used}/{report.token_budget} tokens")
        for decision in report.prune_decisions:
            print(f"    {decision.action:<8} {decision.token_estimate:>5} tok  {decision.block_id}")
    print(f"\nsession {SESSION_ID!r} stored in {default_store_url()}")
    print(f"see it again with: ce report {SESSION_ID}")
    ce.langchain.uninstall()
    await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
