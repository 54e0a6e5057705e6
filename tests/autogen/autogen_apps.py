"""What the ce-autogen tests share: AutoGen's OpenAI client on the scripted server, tools,
request readers, and an engine whose blocking face fails on any use."""

from __future__ import annotations

import json
from typing import Any

from autogen_ext.models.openai import OpenAIChatCompletionClient

from ce.core.testing import ScriptedOpenAIServer

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


def wire(request: dict[str, Any]) -> str:
    """A request body as the text that went over the wire."""
    return json.dumps(request)


def roles(request: dict[str, Any]) -> list[str]:
    return [m["role"] for m in request["messages"]]
