"""An agent without tools in a session that holds another agent's tool chain: its request
defines no tools, so it gets that chain as plain assistant text (Anthropic and Bedrock reject
tool blocks in a request without tools); a call with tools keeps its tool messages."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from crew_apps import llm, two_task_crew
from crewai.events import crewai_event_bus

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

WEATHER_SCHEMA = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Get the weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _script(body: dict[str, Any]) -> ScriptedResponse:
    if body["messages"][-1]["role"] == "tool":
        return ScriptedResponse(text="Paris is sunny.")
    if "weather" in json.dumps(body.get("tools", [])):
        return ScriptedResponse(tool_calls=[("call_w", "weather", json.dumps({"city": "Paris"}))])
    return ScriptedResponse(text="Sunny Paris today.")


def _has_tool_blocks(request: dict[str, Any]) -> bool:
    return any(
        m["role"] == "tool" or "tool_calls" in m or "tool_call_id" in m for m in request["messages"]
    )


def _check_flat(request: dict[str, Any]) -> None:
    assert not request.get("tools")
    assert not _has_tool_blocks(request)
    texts = [str(m.get("content")) for m in request["messages"] if m["role"] == "assistant"]
    (chain,) = [t for t in texts if "[called weather(" in t]
    assert '[called weather({"city": "Paris"})]' in chain
    assert "[weather returned:]" in chain and "sunny in Paris" in chain
    assert chain.index("[called weather(") < chain.index("sunny in Paris")


async def test_the_writer_without_tools_gets_the_researchers_tool_chain_as_text(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_script) as server:
        crew, _, _ = two_task_crew(server)
        ce.crewai.install(engine, session_id="s-flat")
        output = await asyncio.to_thread(crew.kickoff)
        crewai_event_bus.flush()
        requests = server.requests
    assert output.raw == "Sunny Paris today."
    assert len(requests) == 3
    # the researcher's requests (it has the tool) keep the native tool messages
    assert all(r.get("tools") for r in requests[:2])
    assert not _has_tool_blocks(requests[0])
    call, result = requests[1]["messages"][-2:]
    assert call["role"] == "assistant" and call["tool_calls"][0]["id"] == "call_w"
    assert result["role"] == "tool" and result["tool_call_id"] == "call_w"
    assert "sunny in Paris" in result["content"]
    # the writer's (no tools): the same chain as text, with its task after it
    _check_flat(requests[2])
    assert "Write one line" in json.dumps(requests[2]["messages"][-1])


async def test_acall_flattens_only_when_the_call_has_no_tools(engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(_script) as server:
        crew, _, _ = two_task_crew(server)
        ce.crewai.install(engine, session_id="s-flat-async")
        await crew.akickoff()
        crewai_event_bus.flush()
        model = llm(server)
        await model.acall("Anything else?")
        crewai_event_bus.flush()
        await model.acall("And with the tool?", tools=[WEATHER_SCHEMA])
        crewai_event_bus.flush()
        requests = server.requests
    assert len(requests) == 5
    _check_flat(requests[3])
    assert requests[4].get("tools") and _has_tool_blocks(requests[4])
