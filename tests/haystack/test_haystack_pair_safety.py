"""Haystack's own history trimming beside the plugin: an Agent with a ``CompactionHook``
(``SlidingWindowCompactor``, a small window: it compacts the Agent's ``State`` before the
model calls of later turns, leaving an omission note) and the plugin installed. The hook's
rewrite stays the Agent's business; every request the model receives is the engine's,
assembled from the whole session within the budget, its tool pairs intact, the Agent's system
prompt first, the newest question present, without the note (the session holds what it
stands for); the session keeps every turn."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage
from hs_apps import LOOKUP, generator

import ce.haystack
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.formats import from_openai_messages
from ce.core.integration import SESSION_KEY
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, deterministic_engine
from ce.core.testing.assertions import assert_tool_pairs_intact
from ce.core.tokens import TiktokenEstimator

compaction = pytest.importorskip("haystack.hooks.compaction")  # Haystack 3.4 and later

SYSTEM = "You keep notes on the trip."
TURNS = 6


CALLS = itertools.count()


def script(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return ScriptedResponse(text="noted", prompt_tokens=900)
    args = json.dumps({"q": "note " * 40})
    call_id = f"call_{next(CALLS)}"
    return ScriptedResponse(tool_calls=[(call_id, "lookup", args)], prompt_tokens=900)


def _converse(
    engine: ContextEngine, server: ScriptedOpenAIServer, hook: Any, session_id: str
) -> list[ChatMessage]:
    """``TURNS`` turns of an Agent with the lookup tool and ``hook`` before each model call,
    the plugin installed, the app passing the Agent's own (maybe compacted) history back each
    turn with a new question; that history at the end."""
    agent = Agent(
        chat_generator=generator(server),
        tools=[LOOKUP],
        system_prompt=SYSTEM,
        hooks={"before_llm": [hook]},
    )
    ce.haystack.install(engine)
    messages: list[ChatMessage] = []
    for turn in range(TURNS):
        messages.append(ChatMessage.from_user(f"turn {turn}: " + "words " * 50))
        result = agent.run(messages, hook_context={SESSION_KEY: session_id})
        messages = result["messages"][1:]
    return messages


@pytest.mark.filterwarnings("ignore::Warning")
async def test_compaction_hook_and_engine_together_keep_requests_whole() -> None:
    budget = BudgetConfig(max_input_tokens=1200, reserved_reply_tokens=200)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=budget))
    hook = compaction.CompactionHook(
        compaction.SlidingWindowCompactor(),
        context_window=1000,
        compact_at=0.5,
        compact_to=0.3,
    )
    estimator = TiktokenEstimator()
    with ScriptedOpenAIServer(script) as server:
        messages = _converse(engine, server, hook, "s-compact")
        requests = server.requests
    assert len(messages) < 4 * TURNS  # the hook compacted the Agent's own history
    assert any("context_compaction" in m.meta for m in messages)
    assert len(requests) == 2 * TURNS
    for index, request in enumerate(requests):
        assert request["messages"][0]["content"].startswith(SYSTEM)
        assert f"turn {index // 2}:" in json.dumps(request["messages"])
        assert "earlier messages" not in json.dumps(request["messages"])
        parts = from_openai_messages(request["messages"])
        assert_tool_pairs_intact(parts)
        used = sum(estimator.estimate_part(p, "gpt-4o") for p in parts)
        used += estimator.estimate_tools(request["tools"], "gpt-4o")
        assert used <= budget.context_tokens + 8, used
    doc = await engine.get_session("s-compact")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert [u.split(":")[0] for u in users] == [f"turn {t}" for t in range(TURNS)]
    assert len(doc.session.tool_state.tool_calls) == TURNS
    assert all("earlier messages" not in (m.content or "") for m in doc.session.messages)
    await engine.close()


SUMMARY = "SUMMARY of the earlier turns."


def _summarizing(body: dict[str, Any]) -> bool:
    """A call of the ``SummarizationCompactor``'s generator (its own system prompt)."""
    return not body["messages"][0]["content"].startswith(SYSTEM)


def summarizing_script(body: dict[str, Any]) -> ScriptedResponse:
    if _summarizing(body):
        return ScriptedResponse(text=SUMMARY, prompt_tokens=100)
    return script(body)


@pytest.mark.filterwarnings("ignore::Warning")
async def test_a_summarizing_compactors_calls_are_the_hooks_not_the_agents() -> None:
    """A ``CompactionHook`` with a ``SummarizationCompactor`` summarises the Agent's older
    messages with a generator of its own, from the ``before_llm`` hook, inside the Agent's run:
    each such call goes as Haystack sends it (its prompt and the part to summarise, not the
    Agent's prompt nor the session) and is recorded in a child session; the Agent's own calls
    never get its prompt or its summary as turns, and keep ending with the question or the
    tool result they answer."""
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o"))
    with ScriptedOpenAIServer(summarizing_script) as server:
        hook = compaction.CompactionHook(
            compaction.SummarizationCompactor(chat_generator=generator(server)),
            context_window=1000,
            compact_at=0.5,
            compact_to=0.3,
        )
        _converse(engine, server, hook, "s-summarized")
        requests = server.requests
    summaries = [r for r in requests if _summarizing(r)]
    assert summaries  # the hook summarised
    for request in summaries:
        assert SYSTEM not in json.dumps(request["messages"])
        assert [m["role"] for m in request["messages"]] == ["system", "user"]
    agents = [r for r in requests if not _summarizing(r)]
    assert len(agents) == 2 * TURNS
    for request in agents:
        sent = json.dumps(request["messages"])
        assert SUMMARY not in sent and "conversation_to_summarize" not in sent
        assert request["messages"][-1]["role"] in ("user", "tool")
        assert_tool_pairs_intact(from_openai_messages(request["messages"]))
    doc = await engine.get_session("s-summarized")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert [u.split(":")[0] for u in users] == [f"turn {t}" for t in range(TURNS)]
    assert all(m.content != SUMMARY for m in doc.session.messages)
    children = [s for s in await engine.list_sessions() if s.startswith("s-summarized/")]
    assert len(children) == len(summaries)
    await engine.close()
