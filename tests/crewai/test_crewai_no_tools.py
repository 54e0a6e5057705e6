"""A call without tools in a session that holds a tool chain: its request defines no tools, so
it gets that chain as plain text (Anthropic and Bedrock reject tool blocks in a request without
tools): its own as assistant text, an agent's inside that agent's turn (for a call of no agent
too); a call with tools keeps its own tool messages, and a call with tools, an agent's or of no
agent, gets another agent's chain as that agent's turn, never as calls of its own."""

from __future__ import annotations

import json
from typing import Any

from crew_apps import kicked_off, llm, two_task_crew
from crewai.events import crewai_event_bus
from crewai.tools import tool

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


def _check_flat(request: dict[str, Any], role: str = "assistant") -> None:
    """No tool blocks; the weather chain as text in one message of ``role``."""
    assert not request.get("tools")
    assert not _has_tool_blocks(request)
    texts = [str(m.get("content")) for m in request["messages"] if m["role"] == role]
    (chain,) = [t for t in texts if "[called weather(" in t]
    assert '[called weather({"city": "Paris"})]' in chain
    assert "[weather returned:]" in chain and "sunny in Paris" in chain
    assert chain.index("[called weather(") < chain.index("sunny in Paris")


async def test_the_writer_without_tools_gets_the_researchers_tool_chain_as_text(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_script) as server:
        crew, _, _ = two_task_crew(server)
        output = await kicked_off(engine, crew, "s-flat")
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
    # the writer's (no tools): the same chain as text in the researcher's turn, its task after
    _check_flat(requests[2], role="user")
    assert "Write one line" in json.dumps(requests[2]["messages"][-1])


async def test_acall_flattens_only_when_the_call_has_no_tools(engine: ContextEngine) -> None:
    """Direct ``acall`` after a crew: without tools, the researcher's chain as text in its
    turn; with tools and a tool round of its own, its own chain as tool messages and the
    researcher's still in the researcher's turn."""
    own_round = [
        {"role": "user", "content": "And with the tool?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_own",
                    "type": "function",
                    "function": {"name": "weather", "arguments": json.dumps({"city": "Rome"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_own", "content": "sunny in Rome"},
    ]
    with ScriptedOpenAIServer(_script) as server:
        crew, _, _ = two_task_crew(server)
        ce.crewai.install(engine, session_id="s-flat-async")
        await crew.akickoff()
        crewai_event_bus.flush()
        model = llm(server)
        await model.acall("Anything else?")
        crewai_event_bus.flush()
        await model.acall(own_round, tools=[WEATHER_SCHEMA])
        crewai_event_bus.flush()
        requests = server.requests
    assert len(requests) == 5
    _check_flat(requests[3], role="user")
    messages = requests[4]["messages"]
    assert requests[4].get("tools")
    (turn,) = [m for m in messages if "[called weather(" in str(m.get("content"))]
    assert turn["role"] == "user" and turn["content"].startswith("[Researcher wrote:]\n")
    assert "sunny in Paris" in turn["content"]
    call, result = messages[-2:]
    assert call["role"] == "assistant" and [c["id"] for c in call["tool_calls"]] == ["call_own"]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_own"
    assert all(m.get("tool_call_id") in (None, "call_own") for m in messages)


def _script_two_tools(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    tools = json.dumps(body.get("tools", []))
    if messages[-1]["role"] == "tool":
        last = messages[-1]["content"]
        return ScriptedResponse(text="Paris is sunny." if "sunny in" in last else "Ensoleillé.")
    if '"weather"' in tools:
        return ScriptedResponse(tool_calls=[("call_w", "weather", json.dumps({"city": "Paris"}))])
    return ScriptedResponse(tool_calls=[("call_t", "translate", json.dumps({"text": "sunny"}))])


async def test_an_agent_with_tools_of_its_own_gets_the_other_agents_chain_as_its_turn(
    engine: ContextEngine,
) -> None:
    @tool("translate")
    def translate(text: str) -> str:
        """Translate a text into French."""
        return f"fr:{text}"

    with ScriptedOpenAIServer(_script_two_tools) as server:
        crew, _, write = two_task_crew(server)
        write.agent.tools = [translate]  # type: ignore[union-attr]
        output = await kicked_off(engine, crew, "s-peer-tools")
        requests = server.requests
    assert output.raw == "Ensoleillé."
    assert len(requests) == 4
    for request in requests[2:]:  # the writer's two requests
        messages = request["messages"]
        assert "translate" in json.dumps(request["tools"])
        # the researcher's weather call and its result: text in the researcher's turn; its
        # answer once, as CrewAI quotes it in the writer's task
        (turn,) = [m for m in messages if "[called weather(" in str(m.get("content"))]
        assert turn["role"] == "user" and turn["content"].startswith("[Researcher wrote:]\n")
        assert "sunny in Paris" in turn["content"] and "Paris is sunny." not in turn["content"]
        assert json.dumps(messages).count("Paris is sunny.") == 1
        assert all(
            c["function"]["name"] == "translate"
            for m in messages
            for c in m.get("tool_calls") or ()
        )
        assert all(m.get("tool_call_id") in (None, "call_t") for m in messages)
    # the writer's own tool chain goes as native tool messages, after its task
    call, result = requests[3]["messages"][-2:]
    assert call["role"] == "assistant" and call["tool_calls"][0]["id"] == "call_t"
    assert result["role"] == "tool" and result["tool_call_id"] == "call_t"
    assert "fr:sunny" in result["content"]
