"""Pair safety beside Semantic Kernel's own history reducers: an agent thread whose history is
a ``ChatHistoryTruncationReducer`` (SK's count-based trimming, reduced after every turn as SK
documents) runs several function-calling turns under a small budget; every request the model
gets keeps each function call with its result (OpenAI order), starts with the agent's
instructions, holds the newest question and stays within the budget with the tool schemas
counted, and the session keeps every turn (SK's reducer trims the thread, not the store)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai import FunctionChoiceBehavior
from semantic_kernel.contents import ChatHistoryTruncationReducer
from semantic_kernel.functions import kernel_function
from sk_apps import kernel_with

import ce.semantic_kernel
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.formats import from_openai_messages
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, deterministic_engine
from ce.core.testing.assertions import assert_tool_pairs_intact
from ce.core.tokens import TiktokenEstimator

SYSTEM = "You are the pair-safety agent."
BUDGET = BudgetConfig(max_input_tokens=700, reserved_reply_tokens=100)


class Notes:
    @kernel_function(name="fetch", description="Fetch a long note.")
    def fetch(self, topic: Annotated[str, "the topic"]) -> str:
        return f"note on {topic}: " + "detail " * 80


def _script(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    done = sum(1 for m in messages[last_user:] if m["role"] == "tool")
    question = messages[last_user]["content"]
    if done < 2:
        turn = question.split()[1]
        args = json.dumps({"topic": f"t{turn}-{done}"})
        return ScriptedResponse(tool_calls=[(f"call_{turn}_{done}", "Notes-fetch", args)])
    return ScriptedResponse(text=f"answer to {question}")


async def test_every_request_keeps_pairs_within_budget_beside_sks_reducer() -> None:
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=BUDGET))
    estimator = TiktokenEstimator()
    with ScriptedOpenAIServer(_script) as server:
        kernel = kernel_with(server, (Notes(), "Notes"))
        ce.semantic_kernel.install(engine)
        agent = ChatCompletionAgent(
            kernel=kernel,
            name="pairs",
            instructions=SYSTEM,
            function_choice_behavior=FunctionChoiceBehavior.Auto(),
        )
        reducer = ChatHistoryTruncationReducer(target_count=4, threshold_count=1)
        thread = ChatHistoryAgentThread(chat_history=reducer, thread_id="s-pairs")
        for turn in range(4):
            await agent.get_response(messages=f"question {turn} please", thread=thread)
            await thread.reduce()
        requests = server.requests
    assert len(requests) == 12
    for request in requests:
        parts = from_openai_messages(request["messages"])
        assert_tool_pairs_intact(parts)
        assert request["messages"][0]["content"].startswith(SYSTEM)
        used = sum(estimator.estimate_part(p, "gpt-4o") for p in parts)
        used += estimator.estimate_tools(request.get("tools") or [], "gpt-4o")
        assert used <= BUDGET.context_tokens
    for turn in range(4):
        for request in requests[3 * turn : 3 * turn + 3]:
            assert f"question {turn} please" in json.dumps(request)
    doc = await engine.get_session("s-pairs")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        f"question {turn} please" for turn in range(4)
    ]
    assert len(doc.session.tool_state.tool_calls) == 8
    await engine.close()
