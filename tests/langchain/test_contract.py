"""ce-langchain against the plugin contract: a real create_agent app over langchain-openai's
ChatOpenAI talking to the scripted OpenAI server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

pytest.importorskip("langchain_openai")

from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

from ce.core.engine import ContextEngine
from ce.core.integration import Plugin
from ce.core.testing import PluginContract, ScriptedOpenAIServer, deterministic_engine
from ce.core.testing.plugin_contract import RETRIEVAL_DOCS, SYSTEM_PROMPT, TOOL_NAME
from ce.langchain import LangChainPlugin


class ContractRetriever(BaseRetriever):
    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [
            Document(page_content=content, metadata={"source": uri, "score": score})
            for uri, content, score in RETRIEVAL_DOCS
        ]


@tool(TOOL_NAME)
def lookup(q: str) -> str:
    """Look something up."""
    return f"result for {q}"


class ContractApp:
    """An unchanged LangChain app: retrieve, then a create_agent tool loop per question."""

    def __init__(self, base_url: str) -> None:
        model = ChatOpenAI(model="gpt-4o", base_url=base_url, api_key="sk-test", stream_usage=True)
        self.retriever = ContractRetriever()
        self.agent = create_agent(
            model, tools=[lookup], system_prompt=SYSTEM_PROMPT, checkpointer=InMemorySaver()
        )

    @staticmethod
    def config(session_id: str) -> RunnableConfig:
        # LangGraph puts thread_id into the metadata of every run inside the graph; a bare
        # runnable (the retriever) sees only its own run metadata
        return {"configurable": {"thread_id": session_id}, "metadata": {"thread_id": session_id}}

    def ask(self, text: str, session_id: str) -> str:
        self.retriever.invoke(text, self.config(session_id))
        state = self.agent.invoke({"messages": [("user", text)]}, self.config(session_id))
        return str(state["messages"][-1].content)

    async def aask(self, text: str, session_id: str) -> str:
        await self.retriever.ainvoke(text, self.config(session_id))
        state = await self.agent.ainvoke({"messages": [("user", text)]}, self.config(session_id))
        return str(state["messages"][-1].content)

    def stream(self, text: str, session_id: str) -> str:
        config = self.config(session_id)
        self.retriever.invoke(text, config)
        for _ in self.agent.stream({"messages": [("user", text)]}, config, stream_mode="messages"):
            pass
        return str(self.agent.get_state(config).values["messages"][-1].content)


class TestLangChainContract(PluginContract):
    @pytest.fixture
    def plugin_cls(self) -> type[Plugin]:
        return LangChainPlugin

    @pytest.fixture
    async def engine(self) -> AsyncIterator[ContextEngine]:
        engine = deterministic_engine()
        yield engine
        await engine.close()

    @pytest.fixture
    def make_app(self) -> Callable[[ScriptedOpenAIServer], ContractApp]:
        return lambda server: ContractApp(server.base_url)

    def run_sync(self, app: ContractApp, text: str, session_id: str) -> str:
        return app.ask(text, session_id)

    async def run_async(self, app: ContractApp, text: str, session_id: str) -> str:
        return await app.aask(text, session_id)

    def run_stream(self, app: ContractApp, text: str, session_id: str) -> str:
        return app.stream(text, session_id)

    def patched_targets(self) -> list[tuple[Any, str]]:
        return [
            (BaseChatModel, "_convert_input"),
            (BaseChatModel, "ainvoke"),
            (BaseChatModel, "astream"),
        ]
