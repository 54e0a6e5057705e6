"""ce-haystack against the plugin contract: per question, a Pipeline (named after the session
in its ``metadata``) runs a retriever returning the contract documents and an Agent with the
``lookup`` tool on OpenAIChatGenerator talking to the scripted OpenAI server. Paths:
``Pipeline.run``, ``Pipeline.run_async`` and ``Pipeline.run`` with a streaming callback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from haystack import Pipeline
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage
from hs_apps import LOOKUP, FixedRetriever, generator

from ce.core.engine import ContextEngine
from ce.core.integration import SESSION_KEY, Plugin
from ce.core.testing import PluginContract, ScriptedOpenAIServer
from ce.core.testing.plugin_contract import RETRIEVAL_DOCS, SYSTEM_PROMPT, TOOL_ROUNDS
from ce.haystack import HaystackPlugin
from ce.haystack._patch import patched_targets


class ContractApp:
    """An unchanged Haystack app: one Pipeline per question, a retriever beside an Agent."""

    def __init__(self, server: ScriptedOpenAIServer) -> None:
        self.server = server

    def pipeline(self, session_id: str) -> Pipeline:
        pipeline = Pipeline(metadata={SESSION_KEY: session_id})
        pipeline.add_component("retriever", FixedRetriever(RETRIEVAL_DOCS))
        pipeline.add_component(
            "agent",
            Agent(
                chat_generator=generator(self.server), tools=[LOOKUP], system_prompt=SYSTEM_PROMPT
            ),
        )
        return pipeline

    def data(self, text: str, **agent: Any) -> dict[str, Any]:
        return {
            "retriever": {"query": text},
            "agent": {"messages": [ChatMessage.from_user(text)], **agent},
        }

    def ask(self, text: str, session_id: str, stream: bool = False) -> str:
        chunks: list[str] = []
        extra = {"streaming_callback": lambda c: chunks.append(c.content)} if stream else {}
        result = self.pipeline(session_id).run(self.data(text, **extra))
        answer = str(result["agent"]["last_message"].text)
        if stream:
            assert "".join(chunks).endswith(answer)
        return answer

    async def aask(self, text: str, session_id: str) -> str:
        result = await self.pipeline(session_id).run_async(self.data(text))
        return str(result["agent"]["last_message"].text)


class TestHaystackContract(PluginContract):
    @pytest.fixture
    def plugin_cls(self) -> type[Plugin]:
        return HaystackPlugin

    @pytest.fixture
    def make_app(self, engine: ContextEngine) -> Callable[[ScriptedOpenAIServer], ContractApp]:
        return ContractApp

    def run_sync(self, app: ContractApp, text: str, session_id: str) -> str:
        return app.ask(text, session_id)

    async def run_async(self, app: ContractApp, text: str, session_id: str) -> str:
        return await app.aask(text, session_id)

    def run_stream(self, app: ContractApp, text: str, session_id: str) -> str:
        return app.ask(text, session_id, stream=True)

    def patched_targets(self) -> list[tuple[Any, str]]:
        return patched_targets()


def test_tool_rounds_match_the_contract() -> None:
    assert TOOL_ROUNDS == 2
