"""Every assembled input is a valid request under each provider's convention (OpenAI chat,
Anthropic Messages, Gemini contents) and within the budget, over random histories (both tool
flows, parallel calls, failed runs, unanswered calls) and budgets. The same check runs at
scale in benchmarks/fuzz_payloads.py."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ce.core import (
    BudgetConfig,
    BudgetExceededError,
    MessagePart,
    Role,
    RuntimeConfig,
    ToolCallRequest,
    to_anthropic_messages,
    to_gemini_request,
    to_openai_messages,
)
from ce.core.testing import deterministic_engine
from ce.core.testing.histories import write_random_history
from ce.core.testing.payloads import anthropic_problems, gemini_problems, openai_problems


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), turns=st.integers(1, 6), budget=st.integers(250, 3000))
def test_every_assembled_input_is_a_valid_request_everywhere(
    seed: int, turns: int, budget: int
) -> None:
    config = RuntimeConfig(
        model_hint="gpt-4o",
        budget=BudgetConfig(max_input_tokens=budget, reserved_reply_tokens=100),
    )
    engine = deterministic_engine()  # the history is written under a roomy budget

    async def run() -> list[MessagePart] | None:
        await write_random_history(engine, "s", random.Random(seed), turns)
        try:
            result = await engine.prepare_turn("s", "and now?", config)
        except BudgetExceededError:
            return None
        assert result.assembled_input.total_tokens <= budget - 100
        return list(result.assembled_input.parts)

    parts = asyncio.run(run())
    if parts is None:
        return
    assert openai_problems(to_openai_messages(parts)) == []
    assert anthropic_problems(to_anthropic_messages(parts)) == []
    assert gemini_problems(to_gemini_request(parts)) == []


def test_gemini_request_shape() -> None:
    parts = [
        MessagePart(role=Role.SYSTEM, content="Be brief."),
        MessagePart(
            role=Role.ASSISTANT,
            content="Let me check.",
            tool_calls=[
                ToolCallRequest(
                    tool_call_id="c1", name="weather", raw_arguments='{"city": "Oslo"}'
                ),
                ToolCallRequest(tool_call_id="c2", name="weather", raw_arguments="not json"),
            ],
        ),
        MessagePart(role=Role.TOOL, content="sunny", tool_call_id="c1"),
        MessagePart(role=Role.TOOL, content="boom", tool_call_id="c2", is_error=True),
        MessagePart(role=Role.USER, content="thanks"),
    ]
    request = to_gemini_request(parts)
    assert request.system_instruction == "Be brief."
    assert [c["role"] for c in request.contents] == ["user", "model", "user"]
    assert request.contents[0]["parts"] == [{"text": "(continuing the conversation)"}]
    assert request.contents[1]["parts"] == [
        {"text": "Let me check."},
        {"functionCall": {"name": "weather", "args": {"city": "Oslo"}}},
        {"functionCall": {"name": "weather", "args": {}}},
    ]
    assert request.contents[2]["parts"] == [
        {"functionResponse": {"name": "weather", "response": {"content": "sunny"}}},
        {"functionResponse": {"name": "weather", "response": {"error": "boom"}}},
        {"text": "thanks"},
    ]
    assert gemini_problems(request) == []


def test_the_checks_catch_broken_requests() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert openai_problems([{"role": "assistant", "content": "", "tool_calls": [call]}])
    assert openai_problems([{"role": "tool", "tool_call_id": "zz", "content": "x"}])
    broken = to_gemini_request([MessagePart(role=Role.USER, content="a")])
    broken.contents.append({"role": "user", "parts": [{"text": "b"}]})
    assert gemini_problems(broken)
    anthropic = to_anthropic_messages(
        [
            MessagePart(
                role=Role.ASSISTANT,
                content="",
                tool_calls=[ToolCallRequest(tool_call_id="c1", name="f", raw_arguments="{}")],
            )
        ]
    )
    assert anthropic_problems(anthropic)  # a tool use never answered
