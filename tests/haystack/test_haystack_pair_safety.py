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
            result = agent.run(messages, hook_context={SESSION_KEY: "s-compact"})
            messages = result["messages"][1:]  # the Agent's own (maybe compacted) history
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
