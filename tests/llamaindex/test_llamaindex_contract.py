"""ce-llamaindex against the plugin contract: llama-index-llms-openai's OpenAI talking to the
scripted OpenAI server, in a FunctionAgent (async, streaming) and in the manual tool loop of
LlamaIndex's sync ``chat_with_tools`` API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.llms import ChatMessage
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai import OpenAI

from ce.core.integration import Plugin
from ce.core.testing import PluginContract, ScriptedOpenAIServer
from ce.core.testing.plugin_contract import RETRIEVAL_DOCS, SYSTEM_PROMPT, TOOL_NAME
from ce.llamaindex import LlamaIndexPlugin


class ContractRetriever(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [
            NodeWithScore(node=TextNode(text=content, metadata={"source": uri}), score=score)
            for uri, content, score in RETRIEVAL_DOCS
        ]


def lookup(q: str) -> str:
    """Look something up."""
    return f"result for {q}"


class ContractApp:
    """An unchanged LlamaIndex app: retrieve, then a tool loop per question; the session is
    named with LlamaIndex's ``instrument_tags``."""

    def __init__(self, base_url: str) -> None:
        self.llm = OpenAI(
            model="gpt-4o",
            api_base=base_url,
            api_key="sk-test",
            additional_kwargs={"stream_options": {"include_usage": True}},
        )
        self.retriever = ContractRetriever()
        self.tool = FunctionTool.from_defaults(fn=lookup, name=TOOL_NAME)

    def agent(self, streaming: bool) -> FunctionAgent:
        return FunctionAgent(
            tools=[self.tool], llm=self.llm, system_prompt=SYSTEM_PROMPT, streaming=streaming
        )

    def ask(self, text: str, session_id: str) -> str:
        with instrument_tags({"ce_session_id": session_id}):
            self.retriever.retrieve(text)
            messages = [
                ChatMessage(role="system", content=SYSTEM_PROMPT),
                ChatMessage(role="user", content=text),
            ]
            while True:
                response = self.llm.chat_with_tools([self.tool], chat_history=messages)
                calls = self.llm.get_tool_calls_from_response(response, error_on_no_tool_call=False)
                if not calls:
                    return str(response.message.content)
                messages.append(response.message)
                for call in calls:
                    output = self.tool.call(**call.tool_kwargs)
                    messages.append(
                        ChatMessage(
                            role="tool",
                            content=str(output),
                            additional_kwargs={"tool_call_id": call.tool_id},
                        )
                    )

    async def aask(self, text: str, session_id: str, streaming: bool = False) -> str:
        with instrument_tags({"ce_session_id": session_id}):
            await self.retriever.aretrieve(text)
            handler = self.agent(streaming).run(user_msg=text)
            async for _ in handler.stream_events():
                pass
            result = await handler
        return str(result.response.content)


class TestLlamaIndexContract(PluginContract):
    @pytest.fixture
    def plugin_cls(self) -> type[Plugin]:
        return LlamaIndexPlugin

    @pytest.fixture
    def make_app(self) -> Callable[[ScriptedOpenAIServer], ContractApp]:
        return lambda server: ContractApp(server.base_url)

    def run_sync(self, app: ContractApp, text: str, session_id: str) -> str:
        return app.ask(text, session_id)

    async def run_async(self, app: ContractApp, text: str, session_id: str) -> str:
        return await app.aask(text, session_id)

    async def run_stream(self, app: ContractApp, text: str, session_id: str) -> str:
        return await app.aask(text, session_id, streaming=True)

    def patched_targets(self) -> list[tuple[Any, str]]:
        # nothing is replaced: the plugin adds handlers to the root dispatcher's lists
        # (test_llamaindex_install.py checks those lists are restored exactly)
        return []
