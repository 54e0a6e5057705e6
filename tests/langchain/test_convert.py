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
