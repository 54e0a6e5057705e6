"""ce.core.integration.tool_chains_as_text: tool calls and results as plain assistant text,
for providers that reject tool blocks in a request without tools."""

from __future__ import annotations

import copy
import json
from typing import Any

from ce.core.integration import tool_chains_as_text


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def _no_tool_keys(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        assert "tool_calls" not in message and "tool_call_id" not in message
        assert message["role"] != "tool"


def test_a_call_and_its_result_become_one_assistant_text_and_the_input_is_unchanged() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are Writer."},
        {"role": "user", "content": "What is the weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("c1", "weather", {"city": "Paris"})],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny in Paris"},
        {"role": "user", "content": "Write one line."},
    ]
    before = copy.deepcopy(messages)
    out = tool_chains_as_text(messages)
    assert messages == before
    _no_tool_keys(out)
    assert out == [
        {"role": "system", "content": "You are Writer."},
        {"role": "user", "content": "What is the weather?"},
        {
            "role": "assistant",
            "content": '[called weather({"city": "Paris"})]\n[weather returned:]\nsunny in Paris',
        },
        {"role": "user", "content": "Write one line."},
    ]
    assert all(a is not b for a in out for b in messages)


def test_parallel_calls_keep_their_results_and_the_answer_after_joins_them() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Looking both up.",
            "tool_calls": [
                _call("c1", "weather", {"city": "Paris"}),
                _call("c2", "forecast", {"city": "Rome"}),
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "rain in Rome"},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny in Paris"},
        {"role": "assistant", "content": "Paris sunny, Rome rainy."},
        {"role": "user", "content": "Thanks."},
    ]
    out = tool_chains_as_text(messages)
    _no_tool_keys(out)
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert out[1]["content"].split("\n") == [
        "Looking both up.",
        '[called weather({"city": "Paris"})]',
        '[called forecast({"city": "Rome"})]',
        "[forecast returned:]",
        "rain in Rome",
        "[weather returned:]",
        "sunny in Paris",
        "Paris sunny, Rome rainy.",
    ]


def test_messages_without_tool_chains_are_copied_untouched() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "hello", "name": "Writer"},
        {"role": "assistant", "content": "again"},
        {"role": "user", "content": "bye"},
    ]
    out = tool_chains_as_text(messages)
    assert out == messages
    assert all(a is not b for a, b in zip(out, messages, strict=True))
    assert tool_chains_as_text([]) == []


def test_a_result_without_its_call_and_list_contents_are_text() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "tool", "tool_call_id": "lost", "name": "search", "content": "a hit"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Calling."}],
            "tool_calls": [_call("c3", "lookup", {})],
        },
        {"role": "tool", "tool_call_id": "c3", "content": [{"type": "text", "text": "found"}]},
    ]
    out = tool_chains_as_text(messages)
    _no_tool_keys(out)
    assert out == [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "[search returned:]\na hit\nCalling.\n[called lookup({})]\n"
            "[lookup returned:]\nfound",
        },
    ]
