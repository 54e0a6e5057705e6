"""ce-semantic-kernel against the plugin contract: a ChatCompletionAgent on a kernel with a
``lookup`` function and a search function returning the contract documents (as SK's
``VectorSearch.create_search_function`` returns hits: JSON ``{record, score}``), on
OpenAIChatCompletion talking to the scripted OpenAI server; the session is the agent's
``ChatHistoryAgentThread`` id. Paths: ``agent.get_response`` (async; from blocking code
through ``asyncio.run``) and ``agent.invoke_stream``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import pytest
from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai import FunctionChoiceBehavior
from semantic_kernel.functions import KernelArguments, kernel_function
from sk_apps import kernel_with

from ce.core.engine import ContextEngine
from ce.core.integration import Plugin
from ce.core.testing import PluginContract, ScriptedOpenAIServer
from ce.core.testing.openai_server import ScriptedResponse
from ce.core.testing.plugin_contract import (
    RETRIEVAL_DOCS,
    SYSTEM_PROMPT,
    TOOL_NAME,
    TOOL_ROUNDS,
    contract_script,
)
from ce.semantic_kernel import SemanticKernelPlugin
from ce.semantic_kernel._patch import patched_targets


class Tools:
    @kernel_function(name=TOOL_NAME, description="Look something up.")
    def lookup(self, q: Annotated[str, "what to look up"]) -> str:
        return f"result for {q}"


class Docs:
    @kernel_function(name="search", description="Search the documents.")
    def search(self, query: str) -> list[str]:
        return [
            json.dumps({"record": {"id": f"d{i}", "content": content, "source": uri}, "score": s})
            for i, (uri, content, s) in enumerate(RETRIEVAL_DOCS)
        ]


class ContractApp:
    """An unchanged SK app: per question, a search through the kernel, then a
    ChatCompletionAgent on a thread named after the session."""

    def __init__(self, server: ScriptedOpenAIServer) -> None:
        self.server = server

    async def aask(self, text: str, session_id: str, stream: bool = False) -> str:
        kernel = kernel_with(self.server, (Tools(), "tools"))
        docs = kernel.add_plugin(Docs(), "docs")
        await kernel.invoke(docs["search"], KernelArguments(query=text, ce_session_id=session_id))
        agent = ChatCompletionAgent(
            kernel=kernel,
            name="contract_agent",
            instructions=SYSTEM_PROMPT,
            function_choice_behavior=FunctionChoiceBehavior.Auto(
                filters={"excluded_plugins": ["docs"]}
            ),
        )
        thread = ChatHistoryAgentThread(thread_id=session_id)
        if not stream:
            response = await agent.get_response(messages=text, thread=thread)
            return str(response.message.content)
        parts: list[str] = []
        async for item in agent.invoke_stream(messages=text, thread=thread):
            parts.append(str(item.message.content or ""))
        return "".join(parts)


def sk_contract_script(body: dict[str, Any]) -> ScriptedResponse:
    """The contract's model, calling the tool by the name SK advertises it under
    (``<plugin>-<function>``)."""
    reply = contract_script(body)
    if reply.tool_calls:
        calls = [(i, f"tools-{name}", args) for i, name, args in reply.tool_calls]
        return ScriptedResponse(tool_calls=calls)
    return reply


class TestSemanticKernelContract(PluginContract):
    @pytest.fixture
    def openai_server(self) -> Iterator[ScriptedOpenAIServer]:
        with ScriptedOpenAIServer(sk_contract_script) as server:
            yield server

    @pytest.fixture
    def plugin_cls(self) -> type[Plugin]:
        return SemanticKernelPlugin

    @pytest.fixture
    def make_app(self, engine: ContextEngine) -> Callable[[ScriptedOpenAIServer], ContractApp]:
        return ContractApp

    def run_sync(self, app: ContractApp, text: str, session_id: str) -> str:
        # SK is async only: blocking code runs it on a loop of its own
        return asyncio.run(app.aask(text, session_id))

    async def run_async(self, app: ContractApp, text: str, session_id: str) -> str:
        return await app.aask(text, session_id)

    async def run_stream(self, app: ContractApp, text: str, session_id: str) -> str:
        return await app.aask(text, session_id, stream=True)

    def patched_targets(self) -> list[tuple[Any, str]]:
        return patched_targets()


def test_tool_rounds_match_the_contract() -> None:
    assert TOOL_ROUNDS == 2
