"""ce-haystack on a history the app continues: a chat generator called again with the same
message objects followed by new ones converts only the new ones (an Agent's tool loop too),
and an old message the app changed in place after a call never reaches the model as it now
is: it goes as the engine holds it (the real OpenAIChatGenerator on the scripted server)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage, TextContent
from hs_apps import LOOKUP, generator, wire

import ce.haystack
import ce.haystack._inject
from ce.core.engine import ContextEngine
from ce.core.integration import SESSION_KEY
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.core.testing.assertions import assert_restored_history_continues
from ce.haystack._convert import opaque, to_openai

CANARY = "edit.canary@example.com"


def _edit(message: ChatMessage, how: str, text: str) -> None:
    """Change ``message``'s text in place, as an app could (Haystack only warns)."""
    if how == "text":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            message._content[0].text = text  # type: ignore[union-attr]
    else:
        message._content[0] = TextContent(text)  # type: ignore[index]


@pytest.mark.parametrize("how", ["text", "part"])
@pytest.mark.parametrize("path", ["run", "run_async"])
async def test_a_message_changed_in_place_after_a_call_never_goes_as_it_now_is(
    path: str, how: str, engine: ContextEngine
) -> None:
    script = [ScriptedResponse(text="one"), ScriptedResponse(text="two")]
    with ScriptedOpenAIServer(script) as server:
        llm = generator(server)
        ce.haystack.install(engine, session_id="s-edited")
        messages = [ChatMessage.from_system("You are terse."), ChatMessage.from_user("Hi!")]

        async def call() -> None:
            if path == "run":
                result = llm.run(messages=messages)
            else:
                result = await llm.run_async(messages=messages)
            messages.append(result["replies"][0])

        await call()
        _edit(messages[1], how, f"Hi! Mail {CANARY}")  # changed in place, after the call
        messages.append(ChatMessage.from_user("And now?"))
        await call()
        first, second = server.requests
    assert messages[1].text == f"Hi! Mail {CANARY}"  # the app's own object stays as it made it
    assert [m["content"] for m in first["messages"][1:]] == ["Hi!"]
    assert CANARY not in wire(second)
    sent = [(m["role"], m["content"]) for m in second["messages"]]
    assert sent[1:] == [("user", "Hi!"), ("assistant", "one"), ("user", "And now?")]
    doc = await engine.get_session("s-edited")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert users == ["Hi!", "And now?"]


async def test_an_unchanged_continued_history_goes_as_the_apps_own(
    engine: ContextEngine,
) -> None:
    script = [ScriptedResponse(text="one"), ScriptedResponse(text="two")]
    with ScriptedOpenAIServer(script) as server:
        llm = generator(server)
        ce.haystack.install(engine, session_id="s-kept")
        messages = [ChatMessage.from_system("You are terse."), ChatMessage.from_user("Hi!")]
        messages.append(llm.run(messages=messages)["replies"][0])
        messages.append(ChatMessage.from_user(f"Mail {CANARY}, please."))
        llm.run(messages=messages)
        _, second = server.requests
    sent = [(m["role"], m["content"]) for m in second["messages"]]
    assert sent[1:3] == [("user", "Hi!"), ("assistant", "one")]
    assert sent[3][0] == "user" and sent[3][1].startswith("Mail ")
    assert CANARY not in wire(second)  # the new message is read, and redacted


def _loop_script(body: dict[str, Any]) -> ScriptedResponse:
    if body["messages"][-1]["role"] == "tool":
        return ScriptedResponse(text="Done.")
    return ScriptedResponse(tool_calls=[("call_1", "lookup", json.dumps({"q": "cats"}))])


@pytest.mark.parametrize("path", ["run", "run_async"])
async def test_an_agents_loop_converts_only_its_new_messages(
    path: str, engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    converted: list[int] = []
    to_openai = ce.haystack._inject.to_openai

    def counted(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
        converted.append(len(messages))
        return to_openai(messages)

    monkeypatch.setattr(ce.haystack._inject, "to_openai", counted)
    with ScriptedOpenAIServer(_loop_script) as server:
        agent = Agent(chat_generator=generator(server), tools=[LOOKUP], system_prompt="Be brief.")
        ce.haystack.install(engine)
        context = {"hook_context": {SESSION_KEY: "s-loop"}}
        messages = [ChatMessage.from_user("cats?")]
        if path == "run":
            result = agent.run(messages, **context)
        else:
            result = await agent.run_async(messages, **context)
        first, second = server.requests
    assert result["last_message"].text == "Done."
    assert converted == [2, 2]  # system and user; then the reply and the tool result only
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert "result for cats" in second["messages"][-1]["content"]  # fenced as evidence


def test_messages_restored_from_their_dicts_continue_the_history() -> None:
    # an app that stores its ChatMessages as dicts between runs restores new objects
    app = [ChatMessage.from_system("Be brief.")]
    for i in range(6):
        app += [ChatMessage.from_user(f"Question {i}?"), ChatMessage.from_assistant(f"A{i}.")]
    restored = [ChatMessage.from_dict(m.to_dict()) for m in app]
    restored.append(ChatMessage.from_user("And now?"))
    assert_restored_history_continues(app, restored, to_openai, opaque)
