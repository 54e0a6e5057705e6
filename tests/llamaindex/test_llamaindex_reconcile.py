"""The engine's input mapped back onto the app's LlamaIndex messages: what the engine
redacted in a tool call's arguments stays redacted (the app's own call block never returns)."""

from __future__ import annotations

import json

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole

from ce.core.integration import HistoryMemo
from ce.core.testing.assertions import assert_restored_history_continues
from ce.llamaindex._convert import ToolCallBlock, fingerprint, from_openai, to_openai
from ce.llamaindex._inject import _opaque


@pytest.mark.skipif(ToolCallBlock is None, reason="no ToolCallBlock in this llama-index-core")
def test_redacted_tool_call_arguments_reach_the_model_redacted() -> None:
    assert ToolCallBlock is not None
    call = ToolCallBlock(tool_call_id="c1", tool_name="mail", tool_kwargs={"to": "bob@example.com"})
    app = [
        ChatMessage(role=MessageRole.USER, content="hi"),
        ChatMessage(role=MessageRole.ASSISTANT, blocks=[call]),
    ]
    pending = to_openai(app)
    redacted = {
        "id": "c1",
        "type": "function",
        "function": {"name": "mail", "arguments": json.dumps({"to": "[REDACTED:email]"})},
    }
    sent = [dict(pending[0]), {**pending[1], "tool_calls": [redacted]}]
    first, second = from_openai(sent, app, pending)
    assert first is app[0]  # unchanged: the app's own object
    assert second is not app[1]
    assert "bob@example.com" not in str(second.blocks)
    (block,) = [b for b in second.blocks if isinstance(b, ToolCallBlock)]
    assert block.tool_kwargs == {"to": "[REDACTED:email]"}


def test_a_message_changed_in_place_after_its_conversion_goes_as_the_engine_has_it() -> None:
    # a continued history is not converted again: an app message changed in place since
    # must not reach the model as the app's object (the engine never read its new text)
    memo = HistoryMemo()
    app = [
        ChatMessage(role=MessageRole.USER, content="hi"),
        ChatMessage(role=MessageRole.ASSISTANT, content="ok"),
    ]
    history = memo.convert("s", app, to_openai, lambda message: False)
    assert history is not None
    sent = [dict(d) for d in history.pending]
    unchanged = from_openai(sent, app, history.pending, history)
    assert all(m is a for m, a in zip(unchanged, app, strict=True))  # the app's own objects
    app[0].content = "hi, mail bob@example.com"
    app[1].blocks[0].text = "ok, bob@example.com"  # a block's text set in place
    first, second = from_openai(sent, app, history.pending, history)
    assert first is not app[0] and first.content == "hi"
    assert second is not app[1] and second.content == "ok"


def test_a_message_in_several_sessions_histories_is_not_converted_again_on_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # one system prompt object in every user's history: each session's history holds its own
    # conversion of it, and the check that it is unchanged reads neither of them again
    from ce.llamaindex import _convert

    memo = HistoryMemo()
    shared = ChatMessage(role=MessageRole.SYSTEM, content="You are terse.")
    apps = {
        "alice": [shared, ChatMessage(role=MessageRole.USER, content="hi")],
        "bob": [shared, ChatMessage(role=MessageRole.USER, content="hello")],
    }
    histories = {
        s: memo.convert(s, app, to_openai, lambda message: False) for s, app in apps.items()
    }
    conversions: list[int] = []

    def counting(messages: list[ChatMessage]) -> list[dict[str, object]]:
        conversions.append(len(messages))
        return to_openai(messages)

    monkeypatch.setattr(_convert, "to_openai", counting)
    for _ in range(2):
        for session, app in apps.items():
            history = histories[session]
            assert history is not None
            sent = [dict(d) for d in history.pending]
            out = from_openai(sent, app, history.pending, history)
            assert all(m is a for m, a in zip(out, app, strict=True))
    assert conversions == []
    shared.content = "You are verbose."  # changed in place: now it is read again
    history = histories["alice"]
    assert history is not None
    first, _ = from_openai(
        [dict(d) for d in history.pending], apps["alice"], history.pending, history
    )
    assert first is not shared and first.content == "You are terse."
    assert conversions == [1]


def test_messages_restored_from_their_dumps_continue_the_history() -> None:
    # a chat store keeps ChatMessages as JSON: every read builds new objects
    app = [ChatMessage(role=MessageRole.SYSTEM, content="Be brief.")]
    for i in range(6):
        app += [
            ChatMessage(role=MessageRole.USER, content=f"Question {i}?"),
            ChatMessage(role=MessageRole.ASSISTANT, content=f"Answer {i}."),
        ]
    restored = [ChatMessage.model_validate_json(m.model_dump_json()) for m in app]
    restored.append(ChatMessage(role=MessageRole.USER, content="And now?"))
    assert_restored_history_continues(app, restored, to_openai, _opaque, fingerprint)
