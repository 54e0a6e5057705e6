"""ce-autogen against the plugin contract: an AssistantAgent with a tool and a memory, on
autogen-ext's OpenAIChatCompletionClient talking to the scripted OpenAI server, through
``agent.run`` (async; and from blocking code through ``asyncio.run``) and ``agent.run_stream``
with a streaming client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_apps import client
from autogen_core.memory import ListMemory, MemoryContent
from autogen_core.tools import FunctionTool

from ce.autogen import AutoGenPlugin
from ce.autogen._patch import patched_targets
from ce.core.engine import ContextEngine
from ce.core.integration import Plugin
from ce.core.testing import PluginContract, ScriptedOpenAIServer
from ce.core.testing.plugin_contract import (
    RETRIEVAL_DOCS,
    SYSTEM_PROMPT,
    TOOL_NAME,
    TOOL_ROUNDS,
)


def lookup(q: str) -> str:
    """Look something up."""
    return f"result for {q}"


class ContractApp:
    """An unchanged AutoGen app: one AssistantAgent per question, with the tool and a memory
    holding the contract documents; the session is named with ``engine.session``."""

    def __init__(self, server: ScriptedOpenAIServer, engine: ContextEngine) -> None:
        self.server = server
        self.engine = engine

    def agent(self, stream: bool) -> AssistantAgent:
        memory = ListMemory(
            memory_contents=[
                MemoryContent(
                    content=content,
                    mime_type="text/plain",
                    metadata={"source": uri, "score": score},
                )
                for uri, content, score in RETRIEVAL_DOCS
            ]
        )
        return AssistantAgent(
            "contract_agent",
            model_client=client(self.server),
            tools=[FunctionTool(lookup, description="Look something up.", name=TOOL_NAME)],
            system_message=SYSTEM_PROMPT,
            memory=[memory],
            max_tool_iterations=TOOL_ROUNDS + 1,
            model_client_stream=stream,
        )

    async def aask(self, text: str, session_id: str, stream: bool = False) -> str:
        agent = self.agent(stream)
        with self.engine.session(session_id):
            if not stream:
                result = await agent.run(task=text)
            else:
                result = None
                async for item in agent.run_stream(task=text):
                    if isinstance(item, TaskResult):
                        result = item
                assert result is not None
        return str(result.messages[-1].content)


class TestAutoGenContract(PluginContract):
    @pytest.fixture
    def plugin_cls(self) -> type[Plugin]:
        return AutoGenPlugin

    @pytest.fixture
    def make_app(self, engine: ContextEngine) -> Callable[[ScriptedOpenAIServer], ContractApp]:
        return lambda server: ContractApp(server, engine)

    def run_sync(self, app: ContractApp, text: str, session_id: str) -> str:
        # AutoGen is async only: blocking code runs it on a loop of its own
        return asyncio.run(app.aask(text, session_id))

    async def run_async(self, app: ContractApp, text: str, session_id: str) -> str:
        return await app.aask(text, session_id)

    async def run_stream(self, app: ContractApp, text: str, session_id: str) -> str:
        return await app.aask(text, session_id, stream=True)

    def patched_targets(self) -> list[tuple[Any, str]]:
        return patched_targets()
