"""What the ce-semantic-kernel tests share: SK's OpenAI connector on the scripted server,
request readers, and an engine whose blocking face fails on any use."""

from __future__ import annotations

import json
from typing import Any

from openai import AsyncOpenAI
from semantic_kernel import Kernel
from semantic_kernel.connectors.ai.open_ai import OpenAIChatCompletion

from ce.core.testing import ScriptedOpenAIServer

MODEL = "gpt-4o"


def service(server: ScriptedOpenAIServer, service_id: str | None = None) -> OpenAIChatCompletion:
    """SK's own OpenAI chat service talking to ``server`` (a new client per use: its HTTP
    pool belongs to the event loop that first uses it)."""
    client = AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
    return OpenAIChatCompletion(ai_model_id=MODEL, async_client=client, service_id=service_id)


def kernel_with(server: ScriptedOpenAIServer, *plugins: tuple[Any, str]) -> Kernel:
    kernel = Kernel()
    kernel.add_service(service(server))
    for plugin, name in plugins:
        kernel.add_plugin(plugin, name)
    return kernel


def wire(request: dict[str, Any]) -> str:
    """A request body as the text that went over the wire."""
    return json.dumps(request)


def roles(request: dict[str, Any]) -> list[str]:
    return [m["role"] for m in request["messages"]]
