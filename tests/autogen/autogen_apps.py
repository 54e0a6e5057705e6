"""What the ce-autogen tests share: AutoGen's OpenAI client on the scripted server, tools,
request readers, a society-of-mind app, and an engine whose blocking face fails on any use."""

from __future__ import annotations

import json
from typing import Any

from autogen_ext.models.openai import OpenAIChatCompletionClient

from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

MODEL = "gpt-4o-2024-08-06"  # what AutoGen resolves "gpt-4o" to: no model-mismatch warning


def client(server: ScriptedOpenAIServer, **kwargs: Any) -> OpenAIChatCompletionClient:
    """AutoGen's own OpenAI client talking to ``server`` (a new one per use: its HTTP pool
    belongs to the event loop that first uses it)."""
    return OpenAIChatCompletionClient(
        model=MODEL, base_url=server.base_url, api_key="sk-test", **kwargs
    )


def outer_agent(server: ScriptedOpenAIServer, tool: Any) -> Any:
    """The agent whose tool runs nested work: ``tool``, reflecting on its result."""
    from autogen_agentchat.agents import AssistantAgent

    return AssistantAgent(
        "outer",
        model_client=client(server),
        tools=[tool],
        system_message="You are the outer agent.",
        reflect_on_tool_use=True,
    )


def expert_and_planner(
    server: ScriptedOpenAIServer, expert_system: str, planner_system: str | None = None
) -> tuple[Any, Any]:
    """An ``expert`` agent (``expert_system``) and a ``planner`` that calls it as an
    ``AgentTool`` and reflects on its answer."""
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.tools import AgentTool

    expert = AssistantAgent(
        "expert",
        model_client=client(server),
        system_message=expert_system,
        description="An expert.",
    )
    kwargs = {} if planner_system is None else {"system_message": planner_system}
    planner = AssistantAgent(
        "planner",
        model_client=client(server),
        tools=[AgentTool(expert)],
        reflect_on_tool_use=True,
        **kwargs,
    )
    return expert, planner


def wire(request: dict[str, Any]) -> str:
    """A request body as the text that went over the wire."""
    return json.dumps(request)


def roles(request: dict[str, Any]) -> list[str]:
    return [m["role"] for m in request["messages"]]


SOM_SYSTEMS = {
    "writer": "You are a writer, write well.",
    "editor": "You are an editor. Respond with 'APPROVE' when the text is good.",
    "translator": "Translate the text to Spanish.",
}
"""The system messages of the society-of-mind app's agents (see :func:`som_app`)."""
STORY = "Write a short story with a surprising ending."


def som_script(body: dict[str, Any]) -> ScriptedResponse:
    """The scripted model of :func:`som_app`: the editor approves at once, the others answer
    with their name and the number of messages they received."""
    first = body["messages"][0]["content"] or ""
    speaker = next((k for k, v in SOM_SYSTEMS.items() if v in first), "som")
    n = len(body["messages"])
    if speaker == "editor":
        return ScriptedResponse(text=f"APPROVE (editor saw {n})")
    return ScriptedResponse(text=f"{speaker}-says-{n}")


def society_of_mind(server: ScriptedOpenAIServer) -> Any:
    """AutoGen's society-of-mind example's agent: a writer and an editor as the inner team of
    a ``SocietyOfMindAgent``."""
    from autogen_agentchat.agents import AssistantAgent, SocietyOfMindAgent
    from autogen_agentchat.conditions import TextMentionTermination
    from autogen_agentchat.teams import RoundRobinGroupChat

    writer, editor = (
        AssistantAgent(name, model_client=client(server), system_message=SOM_SYSTEMS[name])
        for name in ("writer", "editor")
    )
    inner = RoundRobinGroupChat(
        [writer, editor], termination_condition=TextMentionTermination("APPROVE")
    )
    return SocietyOfMindAgent("society_of_mind", team=inner, model_client=client(server))


async def som_app(server: ScriptedOpenAIServer) -> None:
    """AutoGen's society-of-mind example: the :func:`society_of_mind` agent takes turns with a
    translator on :data:`STORY`."""
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.teams import RoundRobinGroupChat

    som = society_of_mind(server)
    translator = AssistantAgent(
        "translator", model_client=client(server), system_message=SOM_SYSTEMS["translator"]
    )
    await RoundRobinGroupChat([som, translator], max_turns=4).run(task=STORY)
