"""``create_agent`` middleware with the plugin installed, over ChatOpenAI on the scripted OpenAI
server: the model calls a middleware makes for itself (LangChain's summarizer's and tool
selector's, an app's own hook's) are left alone, byte for byte, and never become turns of the
conversation;
the summary ``SummarizationMiddleware`` puts in place of older turns is neither stored as a
user turn nor sent beside the stored turns it stands for."""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("langchain_openai")

from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    LLMToolSelectorMiddleware,
    SummarizationMiddleware,
)
from langchain_core.tools import BaseTool, tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

import ce.langchain
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, deterministic_engine
from ce.core.testing.assertions import unfenced

SYSTEM = "You are the travel agent."
HELPER = "gpt-4o-mini"  # the middleware's own model
SUMMARY = "SUMMARY-MARK: the user asked about cities."
QUESTIONS = ("Tell me about Paris", "Tell me about Rome", "Tell me about Oslo", "And Lima?")


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    budget = BudgetConfig(max_input_tokens=4000, reserved_reply_tokens=200)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=budget))
    yield engine
    await engine.close()


async def run(
    agent: Any, questions: tuple[str, ...], thread: str, use_async: bool
) -> list[dict[str, Any]]:
    config: Any = {"configurable": {"thread_id": thread}}
    states = []
    for question in questions:
        inputs = {"messages": [("user", question)]}
        state = await agent.ainvoke(inputs, config) if use_async else agent.invoke(inputs, config)
        states.append(state)
    return states


# langchain < 1.1's summarizer quotes the reprs of the messages it summarizes in its prompt,
# with their ids: random, different in every run
MESSAGE_ID = re.compile(r"\bid='[^']*'")


def helper_requests(requests: list[dict[str, Any]]) -> list[str]:
    """The middleware's own requests, as the exact JSON bodies the server received (but the
    message ids quoted in a prompt)."""
    return [MESSAGE_ID.sub("id=''", json.dumps(r)) for r in requests if r["model"] == HELPER]


def agent_requests(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in requests if r["model"] != HELPER]


def user_contents(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


# -- SummarizationMiddleware ----------------------------------------------------------------


def summarizer_app(base_url: str, seam: str) -> Any:
    model = ChatOpenAI(model="gpt-4o", base_url=base_url, api_key="sk-test")
    summarizer = ChatOpenAI(model=HELPER, base_url=base_url, api_key="sk-test")
    if "trigger" in inspect.signature(SummarizationMiddleware.__init__).parameters:
        limits: dict[str, Any] = {"trigger": ("messages", 5), "keep": ("messages", 2)}
    else:  # langchain < 1.1: a token threshold (the five messages of the third call pass it)
        limits = {"max_tokens_before_summary": 30, "messages_to_keep": 2}
    middleware = [SummarizationMiddleware(summarizer, **limits)]
    if seam == "middleware":
        middleware.append(ce.langchain.middleware())
    return create_agent(
        model, system_prompt=SYSTEM, checkpointer=InMemorySaver(), middleware=middleware
    )


def summarizer_script(body: dict[str, Any]) -> ScriptedResponse:
    if body["model"] == HELPER:
        return ScriptedResponse(text=SUMMARY)
    city = body["messages"][-1]["content"].split()[-1].rstrip("?")
    return ScriptedResponse(text=f"Notes on {city}.")


async def summarized(
    engine: ContextEngine | None, use_async: bool, seam: str = "install", mode: Any = "replace"
) -> tuple[list[dict[str, Any]], list[Any]]:
    """The requests and the states of the four questions of the summarizing app (with the
    plugin on ``engine`` in ``mode`` through ``seam``: ``install()`` or ``middleware()``; or
    without it)."""
    with ScriptedOpenAIServer(summarizer_script) as server:
        if engine is not None:
            ce.langchain.install(engine, mode=mode, patch=seam == "install")
        agent = summarizer_app(server.base_url, seam)
        try:
            states = await run(agent, QUESTIONS, "trip", use_async)
        finally:
            if engine is not None:
                ce.langchain.uninstall()
        return server.requests, states


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_the_summarizers_own_call_is_left_alone(
    engine: ContextEngine, use_async: bool
) -> None:
    alone, _ = await summarized(None, use_async)
    requests, _ = await summarized(engine, use_async)

    # the summarizer's request is the one LangChain sends without the plugin, byte for byte
    assert helper_requests(alone), "the app never summarized"
    assert helper_requests(requests) == helper_requests(alone)
    prompt = json.loads(helper_requests(alone)[0])["messages"][-1]["content"]
    # the agent's own calls: the engine's input, no summarizer prompt, the question last
    agent = agent_requests(requests)
    assert len(agent) == len(QUESTIONS)
    for request, question in zip(agent, QUESTIONS, strict=True):
        messages = request["messages"]
        assert messages[0]["role"] == "system" and messages[0]["content"].startswith(SYSTEM)
        assert prompt not in json.dumps(request)
        assert messages[-1] == {"role": "user", "content": question}
        assert user_contents(request).count(question) == 1
    # the store: the summarizer's prompt and reply are no turns, its call no usage of the agent
    doc = await engine.get_session("trip")
    assert prompt not in doc.session.model_dump_json()
    said = [m.content for m in doc.session.messages if m.role is Role.ASSISTANT]
    assert said == ["Notes on Paris.", "Notes on Rome.", "Notes on Oslo.", "Notes on Lima."]
    assert len(doc.session.model_usage) == len(QUESTIONS)
    assert len(await engine.list_turns("trip")) == len(QUESTIONS)


@pytest.mark.parametrize("seam", ["install", "middleware"])
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_the_summary_message_is_no_user_turn(
    engine: ContextEngine, use_async: bool, seam: str
) -> None:
    requests, states = await summarized(engine, use_async, seam)
    summaries = [m for m in states[-1]["messages"] if SUMMARY in str(m.content)]
    assert summaries, "the app never summarized"
    if summaries[0].additional_kwargs.get("lc_source") != "summarization":
        pytest.skip("langchain < 1.3 does not mark its summary message (lc_source)")

    # the agent's calls after the summary: the stored turns it stands for, not the summary
    for request in agent_requests(requests):
        assert SUMMARY not in json.dumps(request)
    last = agent_requests(requests)[-1]["messages"]
    assert [m["content"] for m in last if m["role"] == "user"] == list(QUESTIONS)
    assert last[-1] == {"role": "user", "content": QUESTIONS[-1]}
    # the store: the questions are the user turns, nothing holds the summary
    doc = await engine.get_session("trip")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert users == list(QUESTIONS)
    # the turns the middleware's hook removed from the state are no cut of the app's: the
    # engine fits the stored turns to the budget itself
    assert doc.session.summary is None
    assert SUMMARY not in doc.session.model_dump_json()


async def test_in_augment_mode_the_summary_goes_with_the_apps_history(
    engine: ContextEngine,
) -> None:
    requests, _ = await summarized(engine, use_async=False, mode="augment")
    # the app's own history is what the model gets: the summary in place of the older turns
    last = agent_requests(requests)[-1]["messages"]
    users = [m["content"] for m in last if m["role"] == "user"]
    assert len(users) == 2 and SUMMARY in users[0] and users[1] == QUESTIONS[-1]


# -- LLMToolSelectorMiddleware --------------------------------------------------------------


def city_tool(name: str) -> BaseTool:
    @tool(name, description=f"The {name.replace('_', ' ')} of a city.")
    def lookup(city: str) -> str:
        return f"{name} for {city}: sunny"

    return lookup


def selector_script(body: dict[str, Any]) -> ScriptedResponse:
    if body["model"] == HELPER:
        return ScriptedResponse(text=json.dumps({"tools": ["get_weather"]}))
    messages = body["messages"]
    if messages[-1]["role"] == "user":
        args = json.dumps({"city": "Oslo"})
        return ScriptedResponse(tool_calls=[(f"call_{len(messages)}", "get_weather", args)])
    return ScriptedResponse(text="It is sunny in Oslo.")


async def selected(engine: ContextEngine | None, use_async: bool) -> list[dict[str, Any]]:
    """The requests of two questions to an agent whose tools an LLM selects (with the plugin
    installed on ``engine``, or without it)."""
    with ScriptedOpenAIServer(selector_script) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        selector = ChatOpenAI(model=HELPER, base_url=server.base_url, api_key="sk-test")
        tools = [city_tool(n) for n in ("get_weather", "get_news", "get_stocks", "get_sports")]
        agent = create_agent(
            model,
            tools=tools,
            system_prompt=SYSTEM,
            checkpointer=InMemorySaver(),
            middleware=[LLMToolSelectorMiddleware(model=selector, max_tools=1)],
        )
        if engine is not None:
            ce.langchain.install(engine)
        try:
            await run(agent, ("Weather in Oslo?", "And tomorrow?"), "select", use_async)
        finally:
            if engine is not None:
                ce.langchain.uninstall()
        return server.requests


@pytest.mark.skipif(
    importlib.util.find_spec("langchain.agents.middleware.internal_call_transformer") is None,
    reason="langchain < 1.4 does not mark the tool selector's model call as internal "
    "(lc_internal_call / lc_source metadata): the plugin cannot tell it from the agent's",
)
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_the_tool_selectors_own_call_is_left_alone(
    engine: ContextEngine, use_async: bool
) -> None:
    alone = await selected(None, use_async)
    requests = await selected(engine, use_async)

    # the selector's requests are the ones LangChain sends without the plugin, byte for byte
    assert len(helper_requests(alone)) == 4  # before each of the agent's four calls
    assert helper_requests(requests) == helper_requests(alone)
    # the agent's calls: the selected tool only, each question once, a tool call answered
    agent = agent_requests(requests)
    assert len(agent) == 4
    for request in agent:
        assert [t["function"]["name"] for t in request["tools"]] == ["get_weather"]
        assert '{"tools"' not in json.dumps(request["messages"])
        assert sum(m["role"] == "system" for m in request["messages"]) == 1
    assert [user_contents(r) for r in agent] == [
        ["Weather in Oslo?"],
        ["Weather in Oslo?"],
        ["Weather in Oslo?", "And tomorrow?"],
        ["Weather in Oslo?", "And tomorrow?"],
    ]
    for request in (agent[1], agent[3]):  # after a tool call: it ends with the tool result
        *_, called, result = request["messages"]
        assert result["role"] == "tool" and called["tool_calls"][0]["id"] == result["tool_call_id"]
        assert unfenced(result["content"]) == "get_weather for Oslo: sunny"
    # the store: the agent's conversation only, the selector's call no usage of it
    doc = await engine.get_session("select")
    stored = doc.session.model_dump_json()
    assert '{\\"tools\\"' not in stored and "select the most relevant tools" not in stored
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert users == ["Weather in Oslo?", "And tomorrow?"]
    roles = [m.role for m in doc.session.messages if m.role is not Role.SYSTEM]
    assert roles == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT] * 2
    assert len(doc.session.model_usage) == 4


# -- an app's own middleware hook -----------------------------------------------------------


def notes_script(body: dict[str, Any]) -> ScriptedResponse:
    if body["model"] == HELPER:
        return ScriptedResponse(text="NOTE-MARK")
    return ScriptedResponse(text="Noted.")


async def noted(engine: ContextEngine | None, use_async: bool) -> list[dict[str, Any]]:
    """The requests of two questions to an agent whose ``before_model`` hook asks a model of
    its own, with a config of its own (with the plugin installed on ``engine``, or not)."""
    with ScriptedOpenAIServer(notes_script) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        helper = ChatOpenAI(model=HELPER, base_url=server.base_url, api_key="sk-test")
        # the call's own metadata replaces the run metadata that names the hook node
        own: Any = {"metadata": {"purpose": "notes"}}

        class Notes(AgentMiddleware):
            def before_model(self, state: Any, runtime: Any) -> None:
                helper.invoke([("user", f"Note: {state['messages'][-1].content}")], own)

            async def abefore_model(self, state: Any, runtime: Any) -> None:
                await helper.ainvoke([("user", f"Note: {state['messages'][-1].content}")], own)

        agent = create_agent(
            model, system_prompt=SYSTEM, checkpointer=InMemorySaver(), middleware=[Notes()]
        )
        if engine is not None:
            ce.langchain.install(engine)
        try:
            await run(agent, QUESTIONS[:2], "notes", use_async)
        finally:
            if engine is not None:
                ce.langchain.uninstall()
        return server.requests


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_a_hooks_own_call_with_its_own_config_is_left_alone(
    engine: ContextEngine, use_async: bool
) -> None:
    alone = await noted(None, use_async)
    requests = await noted(engine, use_async)

    assert len(helper_requests(alone)) == 2
    assert helper_requests(requests) == helper_requests(alone)
    for request, question in zip(agent_requests(requests), QUESTIONS[:2], strict=True):
        assert request["messages"][-1] == {"role": "user", "content": question}
        assert "Note:" not in json.dumps(request) and "NOTE-MARK" not in json.dumps(request)
    doc = await engine.get_session("notes")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert users == list(QUESTIONS[:2])
    assert "NOTE-MARK" not in doc.session.model_dump_json()
    assert len(doc.session.model_usage) == 2
