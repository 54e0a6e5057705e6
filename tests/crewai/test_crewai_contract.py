"""ce-crewai against the plugin contract: a CrewAI agent with a tool (``Agent.kickoff``
outside a crew, the way CrewAI's docs answer one request with one agent) on its OpenAI
provider talking to the scripted OpenAI server, through ``kickoff`` (blocking),
``kickoff_async`` and a streaming provider; the session is named with ``engine.session``.

CrewAI writes a role-play preamble ("You are <role>. <backstory> ...") into the system prompt
and a "Current Task:" prefix into the request; the contract compares the system prompt and the
question exactly, so the app sets CrewAI's prompt slices to its own system prompt and the bare
question (what a custom prompt file does)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from crewai import LLM, Agent
from crewai.tools import tool
from crewai.utilities.i18n import I18N_DEFAULT

from ce.core.engine import ContextEngine
from ce.core.integration import Plugin
from ce.core.testing import PluginContract, ScriptedOpenAIServer
from ce.core.testing.plugin_contract import SYSTEM_PROMPT, TOOL_NAME, TOOL_ROUNDS
from ce.crewai import CrewAIPlugin
from ce.crewai._patch import patched_targets


@tool(TOOL_NAME)
def lookup(q: str) -> str:
    """Look something up."""
    return f"result for {q}"


class ContractApp:
    """An unchanged CrewAI app: one agent per question, with the tool."""

    def __init__(self, server: ScriptedOpenAIServer, engine: ContextEngine) -> None:
        self.server = server
        self.engine = engine

    def agent(self, stream: bool = False) -> Agent:
        model = LLM(
            model="openai/gpt-4o-mini",
            base_url=self.server.base_url,
            api_key="sk-scripted",
            stream=stream,
        )
        return Agent(
            role="Assistant",
            goal="answer",
            backstory=SYSTEM_PROMPT,
            llm=model,
            tools=[lookup],
            max_iter=TOOL_ROUNDS + 2,
        )

    def ask(self, text: str, session_id: str, stream: bool = False) -> str:
        with self.engine.session(session_id):
            return str(self.agent(stream).kickoff(text).raw)

    async def aask(self, text: str, session_id: str) -> str:
        with self.engine.session(session_id):
            return str((await self.agent().kickoff_async(text)).raw)


@pytest.fixture(autouse=True)
def _plain_prompts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The app's own system prompt and the bare question, as a custom prompt file gives."""
    slices = I18N_DEFAULT._prompts["slices"]
    monkeypatch.setitem(slices, "role_playing", "{backstory}")
    monkeypatch.setitem(slices, "native_task", "{input}")
    yield


class TestCrewAIContract(PluginContract):
    supports_retrieval = False  # knowledge retrieval: see test_crewai_knowledge

    @pytest.fixture
    def plugin_cls(self) -> type[Plugin]:
        return CrewAIPlugin

    @pytest.fixture
    def make_app(self, engine: ContextEngine) -> Callable[[ScriptedOpenAIServer], ContractApp]:
        return lambda server: ContractApp(server, engine)

    def run_sync(self, app: ContractApp, text: str, session_id: str) -> str:
        return app.ask(text, session_id)

    async def run_async(self, app: ContractApp, text: str, session_id: str) -> str:
        return await app.aask(text, session_id)

    def run_stream(self, app: ContractApp, text: str, session_id: str) -> str:
        return app.ask(text, session_id, stream=True)

    def patched_targets(self) -> list[tuple[Any, str]]:
        return patched_targets()
