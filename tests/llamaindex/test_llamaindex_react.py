"""A ``ReActAgent`` (text tool use) on llama-index-llms-openai's ``OpenAI`` against the scripted
server: each step reaches the model once, although LlamaIndex re-renders it with its input
printed as a Python dict; an ``Observation`` stays right after the Action it answers; and at a
tight budget the newest question is kept while older turns go whole, never an observation
without its step."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core.agent.workflow import ReActAgent
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.tools import FunctionTool
from llama_index.core.workflow import Context
from llama_index.llms.openai import OpenAI

import ce.llamaindex
from ce.core import BudgetConfig, Role, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.pipeline import canonical_step, is_observation, is_react_step
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, deterministic_engine

QUESTIONS = ("Tell me about cats and dogs", "And what about birds?")
TOPICS = {QUESTIONS[0]: ("cats", "dogs"), QUESTIONS[1]: ("birds",)}


def search_kb(query: str) -> str:
    """Search the knowledge base."""
    return f"Fact about {query}: " + "it is documented at length. " * 15


def _script(body: dict[str, Any]) -> ScriptedResponse:
    """Search each topic of the newest question in turn, then answer."""
    messages = body["messages"]
    asked = max(
        i
        for i, m in enumerate(messages)
        if m["role"] == "user" and not is_observation(str(m["content"]))
    )
    topics = TOPICS[messages[asked]["content"]]
    done = sum(1 for m in messages[asked:] if is_observation(str(m["content"])))
    if done < len(topics):
        action = json.dumps({"query": topics[done]})
        return ScriptedResponse(
            text=f"Thought: I need to search.\nAction: search_kb\nAction Input: {action}"
        )
    return ScriptedResponse(text=f"Thought: I can answer.\nAnswer: {', '.join(topics)} noted.")


async def _run(engine: ContextEngine) -> list[dict[str, Any]]:
    with ScriptedOpenAIServer(_script) as server:
        llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
        ce.llamaindex.install(engine)
        agent = ReActAgent(tools=[FunctionTool.from_defaults(search_kb)], llm=llm)
        ctx = Context(agent)
        with instrument_tags({"ce_session_id": "react"}):
            for question in QUESTIONS:
                await agent.run(user_msg=question, ctx=ctx)
        ce.llamaindex.uninstall()
        return list(server.requests)


def _assert_steps_whole(messages: list[dict[str, Any]]) -> None:
    """Every step once; every observation right after its step."""
    steps = [
        canonical_step(str(m["content"]))
        for m in messages
        if m["role"] == "assistant" and is_react_step(str(m["content"]))
    ]
    assert len(steps) == len(set(steps)), "a ReAct step was sent twice"
    for i, message in enumerate(messages):
        if message["role"] == "user" and is_observation(str(message["content"])):
            before = messages[i - 1]
            assert before["role"] == "assistant" and is_react_step(str(before["content"]))


async def test_each_step_reaches_the_model_once_with_its_observation(
    engine: ContextEngine,
) -> None:
    requests = await _run(engine)
    assert len(requests) == 5  # 2 searches + answer, 1 search + answer
    for request in requests:
        _assert_steps_whole(request["messages"])
    # the last call of the second run: both turns, each step once, in order
    last = [m for m in requests[-1]["messages"] if m["role"] != "system"]
    assert [m["content"] for m in last if m["role"] == "user" and "?" in m["content"]] == [
        QUESTIONS[1]
    ]
    assert sum(1 for m in last if is_react_step(str(m["content"]))) == 3
    # the store holds each step once, as the model wrote it
    doc = await engine.get_session("react")
    stored = [m.content for m in doc.session.messages if m.role is Role.ASSISTANT]
    steps = [canonical_step(t) for t in stored if is_react_step(t)]
    assert len(steps) == len(set(steps)) == 3
    assert all('{"query": ' in t for t in stored if is_react_step(t))


async def test_at_a_tight_budget_the_newest_question_stays_and_steps_go_whole() -> None:
    budget = BudgetConfig(max_input_tokens=900, reserved_reply_tokens=100)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=budget))
    requests = await _run(engine)
    for request in requests:
        messages = request["messages"]
        _assert_steps_whole(messages)
        assert messages[0]["role"] == "system"
        assert not is_observation(str(messages[1]["content"]))  # never first after the prompt
    for request in requests[3:]:  # the second run
        assert QUESTIONS[1] in [m["content"] for m in request["messages"]]  # never pruned
    # its last call has no room for the first turn: it goes whole (question, two steps with
    # their observations, answer: four blocks), not an observation of it
    last = json.dumps(requests[-1])
    assert QUESTIONS[0] not in last and "Fact about" not in last.replace("Fact about birds", "")
    report = await engine.get_report("react")
    assert report.token_used <= report.token_budget
    dropped = [d for d in report.prune_decisions if d.action == "dropped"]
    assert sum(d.block_count for d in dropped) == 4
    await engine.close()
