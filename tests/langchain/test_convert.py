"""The plugin's conversions between LangChain messages and the engine's: a history passed
anew is read as the previous call's only when it reads the same, and a reply of text alone
becomes the message its OpenAI form makes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    convert_to_openai_messages,
)

from ce.core.integration import HistoryMemo, message_from_openai
from ce.core.schema import ModelInvocation, Role
from ce.langchain._convert import ai_to_message, fingerprint, opaque, to_openai


def test_a_loaded_message_of_another_class_or_role_is_not_read_as_the_previous_one() -> None:
    memo = HistoryMemo()
    first = [SystemMessage("be terse"), ChatMessage(role="user", content="hi")]
    assert memo.convert("s", first, to_openai, opaque, fingerprint_of=fingerprint) is not None
    roles = [SystemMessage("be terse"), ChatMessage(role="assistant", content="hi")]
    history = memo.convert(
        "s", [*roles, HumanMessage("and?")], to_openai, opaque, None, fingerprint
    )
    assert history is not None
    assert [m.role for m in history.messages] == [Role.SYSTEM, Role.ASSISTANT, Role.USER]
    classes = [SystemMessage("be terse"), AIMessage("hi"), HumanMessage("and?"), HumanMessage("?")]
    history = memo.convert("s", classes, to_openai, opaque, None, fingerprint)
    assert history is not None
    expected = [Role.SYSTEM, Role.ASSISTANT, Role.USER, Role.USER]
    assert [m.role for m in history.messages] == expected


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=60),
    st.sampled_from([{}, {"refusal": None}, {"refusal": "I cannot."}, {"other": 1}]),
    st.sampled_from([None, "helper"]),
    st.booleans(),
)
def test_a_text_reply_becomes_the_message_its_openai_form_makes(
    text: str, kwargs: dict[str, Any], name: str | None, chunk: bool
) -> None:
    cls = AIMessageChunk if chunk else AIMessage
    reply = cls(content=text, additional_kwargs=dict(kwargs), name=name)
    (converted,) = to_openai([reply])
    converted["content"] = converted.get("content") or ""
    general = message_from_openai(converted).model_copy(
        update={"invocation": ModelInvocation(provider="openai", model="gpt-4o")}
    )
    assert ai_to_message(reply, "openai", "gpt-4o").model_dump() == general.model_dump()


_CLASSES = [AIMessage, AIMessageChunk, HumanMessage, SystemMessage]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(_CLASSES),
    st.one_of(
        st.text(max_size=30),
        st.just([{"type": "text", "text": "a block"}]),
    ),
    st.sampled_from(
        [{}, {"refusal": None}, {"refusal": "No."}, {"__openai_role__": "developer"}, {"k": 1}]
    ),
    st.sampled_from([None, "someone"]),
    st.booleans(),
)
def test_a_message_of_text_alone_converts_as_langchain_converts_it(
    cls: type, content: Any, kwargs: dict[str, Any], name: str | None, calls: bool
) -> None:
    fields: dict[str, Any] = {"content": content, "additional_kwargs": dict(kwargs), "name": name}
    if calls and issubclass(cls, AIMessage):
        fields["tool_calls"] = [{"name": "lookup", "args": {"q": "x"}, "id": "c1"}]
    message = cls(**fields)
    assert to_openai([message]) == [dict(m) for m in convert_to_openai_messages([message])]
