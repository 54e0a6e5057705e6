"""The async paths await the engine on the caller's event loop (issue 11): ``ainvoke``,
``astream``, ``abatch``, an async ``create_agent`` tool loop, ``middleware()`` and ``wrap()``
run with an ``engine.sync`` that fails on every use, and the model still receives the engine's
input (notebook, budget, redaction) and the store holds the run; 20 sessions x 3 calls
gathered on one loop each see only their own canary."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from scripted import failures, texts

import ce.langchain
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import Role, ToolCallStatus
from ce.core.testing import NoBlockingEngine, deterministic_engine
from ce.core.testing.assertions import unfenced

SYSTEM = "You are the async agent."
CANARY = "alice.canary@example.com"
USAGE = {"input_tokens": 11, "output_tokens": 5, "total_tokens": 16}
BUDGET = BudgetConfig(max_input_tokens=900, reserved_reply_tokens=100)
FILLER = "Older detail that matters little here. " * 25


class AsyncFake(BaseChatModel):
    """A chat model with a native async path only: ``_agenerate`` / ``_astream`` await
    ``asyncio.sleep(0)`` (letting other tasks run), keep every message list they received and
    answer ``script(messages)``; the sync path raises."""

    script: Any
    seen: list[list[BaseMessage]] = []
    streamed: int = 0

    def model_post_init(self, context: Any) -> None:
        self.seen = []

    @property
    def _llm_type(self) -> str:
        return "async-fake"

    def bind_tools(self, tools: Any, **kwargs: Any) -> AsyncFake:  # type: ignore[override]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        raise AssertionError("the sync path ran")

    async def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        await asyncio.sleep(0)
        self.seen.append(list(messages))
        reply = self.script(list(messages))
        if isinstance(reply, AIMessage):
            return reply
        return AIMessage(content=str(reply), usage_metadata=USAGE)  # type: ignore[arg-type]

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=await self._reply(messages))])

    async def _astream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        self.streamed += 1
        message = await self._reply(messages)
        calls = [
            {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
            for i, c in enumerate(message.tool_calls)
        ]
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content=message.content,
                usage_metadata=USAGE,  # type: ignore[arg-type]
                tool_call_chunks=calls,  # type: ignore[arg-type]
            )
        )


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=BUDGET))
    yield engine
    await engine.close()


def conversation() -> list[BaseMessage]:
    """A system prompt, six earlier exchanges (more than the budget holds) and a question
    with a mail address in it."""
    older: list[BaseMessage] = []
    for n in range(6):
        older += [HumanMessage(f"Question {n}. {FILLER}"), AIMessage(f"Answer {n}. {FILLER}")]
    return [SystemMessage(SYSTEM), *older, HumanMessage(f"Mail the summary to {CANARY} please.")]


async def _no_blocking(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch, run: Callable[[], Any]
) -> NoBlockingEngine:
    blocked = NoBlockingEngine()
    with monkeypatch.context() as patch:
        patch.setattr(engine, "sync", blocked)
        await run()
        await engine.flush()
    return blocked


@pytest.mark.parametrize("path", ["ainvoke", "astream", "abatch", "wrap", "middleware"])
async def test_an_async_call_awaits_the_engine(
    path: str, engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    await engine.update_notebook("s-async", "NOTEBOOK-MARK")
    model = AsyncFake(script=lambda messages: "Sent.")
    config: Any = {"metadata": {"ce_session_id": "s-async"}}
    messages = conversation()

    async def run() -> None:
        if path == "ainvoke":
            await model.ainvoke(messages, config)
        elif path == "astream":
            assert "".join([str(c.content) async for c in model.astream(messages, config)])
        elif path == "abatch":
            await model.abatch([messages], config)
        elif path == "wrap":
            await ce.langchain.wrap(model).ainvoke(messages, config)
        else:  # an async create_agent run whose model call goes through awrap_model_call
            agent = create_agent(model, tools=[], middleware=[ce.langchain.middleware()])
            await agent.ainvoke({"messages": messages[1:]}, config)

    if path in ("wrap", "middleware"):
        plugin = ce.langchain.install(engine, patch=False)
    else:
        plugin = ce.langchain.install(engine)
    blocked = await _no_blocking(engine, monkeypatch, run)
    assert blocked.used == []
    assert failures(plugin)["integration_failed"] == 0

    (sent,) = model.seen
    assert isinstance(sent[0], SystemMessage) and "NOTEBOOK-MARK" in str(sent[0].content)
    assert CANARY not in texts(sent)
    assert "Mail the summary to [REDACTED:email] please." in str(sent[-1].content)
    (turn,) = await engine.list_turns("s-async")
    assert turn.report is not None
    assert turn.report.token_used <= BUDGET.max_input_tokens - BUDGET.reserved_reply_tokens
    assert len(sent) < len(messages)  # the budget left older exchanges out
    doc = await engine.get_session("s-async")
    assert doc.session.messages[-1].role is Role.ASSISTANT
    assert doc.session.messages[-1].content == "Sent."
    assert [(u.prompt_tokens, u.completion_tokens) for u in doc.session.model_usage] == [(11, 5)]


@tool
async def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.mark.parametrize("path", ["ainvoke", "astream"])
async def test_an_async_agent_tool_loop_awaits_the_engine(
    path: str, engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [
        AIMessage(
            content="",
            tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_w"}],
            usage_metadata=USAGE,  # type: ignore[arg-type]
        ),
        AIMessage(content=f"Paris is sunny; I told {CANARY}.", usage_metadata=USAGE),  # type: ignore[arg-type]
    ]
    model = AsyncFake(script=lambda messages: script.pop(0))
    agent = create_agent(
        model, tools=[get_weather], system_prompt=SYSTEM, checkpointer=InMemorySaver()
    )
    plugin = ce.langchain.install(engine)
    await engine.update_notebook("agent-async", "NOTEBOOK-MARK")
    config: Any = {"configurable": {"thread_id": "agent-async"}}
    question = f"Weather in Paris? Tell {CANARY}."

    async def ask(text: str) -> None:
        if path == "ainvoke":
            await agent.ainvoke({"messages": [("user", text)]}, config)
        else:  # the graph streams the model's tokens: the model node streams through _astream
            async for _ in agent.astream(
                {"messages": [("user", text)]}, config, stream_mode="messages"
            ):
                pass

    async def run() -> None:
        await ask(question)
        # the next question gets the stored conversation, redacted reply included
        await ask("And tomorrow?")

    script.append(AIMessage(content="Sunny again.", usage_metadata=USAGE))  # type: ignore[arg-type]
    blocked = await _no_blocking(engine, monkeypatch, run)
    assert blocked.used == []
    assert failures(plugin)["integration_failed"] == 0

    first, second, third = model.seen
    assert model.streamed == (3 if path == "astream" else 0)
    assert all("NOTEBOOK-MARK" in str(seen[0].content) for seen in model.seen)
    assert [m.type for m in second] == ["system", "human", "ai", "tool"]
    assert unfenced(str(second[-1].content)) == "sunny in Paris"
    assert all(CANARY not in texts(seen) for seen in model.seen)
    assert third[-1].content == "And tomorrow?"
    turns = await engine.list_turns("agent-async")
    assert len(turns) == 3
    doc = await engine.get_session("agent-async")
    (record,) = doc.session.tool_state.tool_calls
    assert record.tool_call_id == "call_w" and record.status is ToolCallStatus.SUCCESS
    assert len(doc.session.model_usage) == 3
    assert doc.session.messages[-1].content == "Sunny again."
    assert first[-1].content != question  # redacted before it reached the model


SESSIONS = 20


def canary(n: int) -> str:
    return f"CANARY{n:02d}X"


async def test_concurrent_sessions_on_one_loop_keep_their_own_context(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = AsyncFake(script=lambda messages: f"noted ({len(messages)})")
    ce.langchain.install(engine)

    async def session(n: int) -> None:
        config: Any = {"metadata": {"ce_session_id": f"user-{n}"}}
        # only the first question carries the canary: the engine's history brings it back
        for question in (f"My word is {canary(n)}.", "What is my word?", "Say it again."):
            await model.ainvoke([SystemMessage(SYSTEM), HumanMessage(question)], config)

    async def run() -> None:
        await asyncio.gather(*(session(n) for n in range(SESSIONS)))

    blocked = await _no_blocking(engine, monkeypatch, run)
    assert blocked.used == []
    assert len(model.seen) == SESSIONS * 3
    counts = [0] * SESSIONS
    for seen in model.seen:
        owners = {n for n in range(SESSIONS) if canary(n) in texts(seen)}
        assert len(owners) == 1, owners  # its own canary only
        counts[owners.pop()] += 1
    assert counts == [3] * SESSIONS
    for n in range(SESSIONS):
        doc = await engine.get_session(f"user-{n}")
        users = [m.content for m in doc.session.messages if m.role is Role.USER]
        assert users == [f"My word is {canary(n)}.", "What is my word?", "Say it again."]
        assert len(doc.session.model_usage) == 3


@pytest.mark.parametrize("path", ["ainvoke", "astream"])
async def test_chat_openai_async_calls_await_the_engine(
    path: str, engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ChatOpenAI converts the prepared input again while it builds its request payload: that
    conversion must not mark the async call as a blocking one (its reply would then be
    recorded with a blocking engine call on the event loop)."""
    from langchain_openai import ChatOpenAI

    from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="Sent.")) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        plugin = ce.langchain.install(engine)
        config: Any = {"metadata": {"ce_session_id": "s-openai"}}

        async def run() -> None:
            if path == "ainvoke":
                await model.ainvoke(conversation(), config)
            else:
                assert "".join(
                    [str(c.content) async for c in model.astream(conversation(), config)]
                )

        blocked = await _no_blocking(engine, monkeypatch, run)
        (body,) = server.requests
    assert blocked.used == []
    assert failures(plugin)["integration_failed"] == 0
    assert CANARY not in json.dumps(body)
    doc = await engine.get_session("s-openai")
    assert doc.session.messages[-1].role is Role.ASSISTANT
    assert doc.session.messages[-1].content == "Sent."


@pytest.mark.parametrize("entry", ["invoke", "stream"])
async def test_blocking_calls_from_async_code_keep_their_history(entry: str) -> None:
    """An app calling the blocking API from async code (a sync helper in an async handler,
    a notebook cell), yielding to its loop between calls: each call's records are written
    inline, so none is left queued on the loop the next call blocks, and every call gets
    the session's history (a queued write held the session and the next call failed open
    without it)."""
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

    engine = deterministic_engine()
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="noted")) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        plugin = ce.langchain.install(engine)
        with engine.session("notebook"):
            for i in range(4):
                if entry == "invoke":
                    model.invoke(f"question {i}")
                else:
                    list(model.stream(f"question {i}"))
                await asyncio.sleep(0)  # the loop runs whatever is ready
        requests = server.requests
    assert failures(plugin)["integration_failed"] == 0
    assert [len(r["messages"]) for r in requests] == [1, 3, 5, 7]
    doc = await engine.get_session("notebook")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        f"question {i}" for i in range(4)
    ]
