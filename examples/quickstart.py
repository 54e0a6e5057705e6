"""ce-langchain quickstart: an unchanged LangChain agent (a tool and a retriever over a handful
of documents) plus one line, ``ce.langchain.install(engine)``.

Runs offline: ChatOpenAI talks to ce.core's ScriptedOpenAIServer (no network, no keys). The
engine records the session in the embedded SQLite default store and, before every model call,
hands the model its assembled input within a small token budget. For every model call the
script prints the report: each block kept, degraded (with its level) or dropped, and its tokens.

    python examples/quickstart.py      # store: $CE_STORE_URL or sqlite:///.ce/sessions.db
    ce turns quickstart                # the model calls, from the store (ce-core[cli])
    ce report quickstart [TURN]        # a call's report again (default: the last)
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
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
from ce.core.schema import Report
from ce.core.stores import default_store_url
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

SESSION_ID = "quickstart"
BUDGET = BudgetConfig(max_input_tokens=720, reserved_reply_tokens=150)
QUESTIONS = (
    "What is the weather in Paris? Reply to me at jane@example.com",
    "And in Oslo?",
    "Should I pack for Paris?",
)
DOCS = {
    "paris": "Paris has an oceanic climate; autumn days average 15°C. " * 6,
    "oslo": "Oslo autumns are cool and wet, around 6°C, with frequent rain. " * 6,
    "packing": "Pack layers and a waterproof jacket for northern Europe. " * 6,
}


class Handbook(BaseRetriever):
    """A retriever over the handful of documents above."""

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
    """The scripted model: look the city of the question up (two tool calls), then answer."""
    messages = body["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    question = messages[last_user]["content"].lower()
    city = "oslo" if "oslo" in question else "paris"
    if any(m["role"] == "tool" for m in messages[last_user:]):
        return ScriptedResponse(text=f"{city.title()}: cloudy, 17°C; see the handbook for packing.")
    suffix = f"{city}_{len(messages)}"
    return ScriptedResponse(
        tool_calls=[
            (f"call_h_{suffix}", "search_handbook", json.dumps({"query": city})),
            (f"call_w_{suffix}", "weather", json.dumps({"city": city})),
        ]
    )


def show(call: int, report: Report) -> None:
    """One model call's report: what the model got, block by block."""
    used = f"{report.token_used}/{report.token_budget} tokens"
    print(f"  model call {call}: {used}, turn {report.turn_id}")
    for d in report.prune_decisions:
        span = f" x{d.block_count}" if d.block_count > 1 else ""
        level = f" @{d.level}" if d.level else ""
        saved = f" (saved {d.saved_tokens})" if d.saved_tokens else ""
        print(
            f"    {d.action:<8} {d.block_id:<40}{span:<5} {d.token_estimate:>5} tok{saved}{level}"
        )
    for note in report.degradations:
        print(f"    degraded: {note}")


async def main() -> None:
    url = default_store_url()
    engine = ContextEngine(config=RuntimeConfig(model_hint="gpt-4o", budget=BUDGET))
    await engine.store.delete_session(SESSION_ID)  # start the quickstart fresh on every run
    ce.langchain.install(engine)  # <- the one line: record every run, inject every model call
    seen: set[str] = set()
    calls = 0
    with ScriptedOpenAIServer(model_script) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="not-needed")
        agent = create_agent(
            model,
            tools=[search_handbook, weather],
            system_prompt="You are a travel assistant.",
            checkpointer=InMemorySaver(),
        )
        config = {"configurable": {"thread_id": SESSION_ID}}  # thread_id = the ce session
        for number, question in enumerate(QUESTIONS, 1):
            print(f"\n== turn {number}\n> {question}")
            state = await agent.ainvoke({"messages": [("user", question)]}, config)
            for record in await engine.list_turns(SESSION_ID):  # one per model call
                if record.turn_id not in seen:
                    seen.add(record.turn_id)
                    calls += 1
                    show(calls, record.report)
            print(f"< {state['messages'][-1].content}")
    ce.langchain.uninstall()

    doc = await engine.get_session(SESSION_ID)
    print(
        f"\nsession {SESSION_ID!r} stored in {url}: {len(doc.session.messages)} messages, "
        f"{len(doc.session.tool_state.tool_calls)} tool calls, {len(doc.evidences)} evidences, "
        f"{len(doc.session.model_usage)} model calls, {len(seen)} reports"
    )
    command = _ce()
    print("see them again from the store (each line is a command to run from here):")
    print(f"    {command} turns {SESSION_ID}")
    print(f"    {command} report {SESSION_ID}")
    print(f"    {command} report {SESSION_ID} 1")
    await engine.close()


def _ce() -> str:
    """The ``ce`` command installed beside the Python running this demo, as a path the user
    can type from here (the nox session's virtualenv is not on their PATH)."""
    script = Path(sys.executable).parent / "ce"
    if not script.exists():
        return "ce"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


if __name__ == "__main__":
    asyncio.run(main())
