"""A Haystack chat app that goes back in its conversation — "regenerate" (it drops the answer
it got and runs its pipeline again on the same question), "edit" (it replaces a message and
drops what followed) — gets the conversation it went back to: the model receives what the
app passes, not the turns it took back (the real OpenAIChatGenerator in a Pipeline, on the
scripted server; the assertions are on the request bodies)."""

from __future__ import annotations

import asyncio

import pytest
from haystack import Pipeline
from haystack.dataclasses import ChatMessage
from hs_apps import generator

import ce.haystack
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, numbered_answer


@pytest.mark.parametrize("path", ["run", "run_async"])
async def test_regenerate_and_edit_send_the_conversation_the_app_went_back_to(
    engine: ContextEngine, path: str
) -> None:
    with ScriptedOpenAIServer(numbered_answer) as server:
        pipeline = Pipeline()
        pipeline.add_component("llm", generator(server))
        ce.haystack.install(engine)

        async def ask(history: list[ChatMessage]) -> ChatMessage:
            data = {"llm": {"messages": history}}
            with engine.session("user-1"):
                if path == "run_async":
                    result = await pipeline.run_async(data)
                else:
                    result = await asyncio.to_thread(pipeline.run, data)
            return result["llm"]["replies"][0]

        history = [ChatMessage.from_system("You answer in one line.")]
        for question in ("Where is Paris?", "What is the plan?"):
            history.append(ChatMessage.from_user(question))
            history.append(await ask(history))
        history.pop()  # regenerate

        await ask(history)
        assert server.last_conversation() == [
            "Where is Paris?",
            "answer 0 to Where is Paris?",
            "What is the plan?",
        ]

        edited = [*history[:3], ChatMessage.from_user("What is in Rome?")]
        edited.append(await ask(edited))
        assert server.last_conversation() == [
            "Where is Paris?",
            "answer 0 to Where is Paris?",
            "What is in Rome?",
        ]
        edited.append(ChatMessage.from_user("And tomorrow?"))
        await ask(edited)
        assert server.last_conversation() == [
            "Where is Paris?",
            "answer 0 to Where is Paris?",
            "What is in Rome?",
            "answer 1 to What is in Rome?",
            "And tomorrow?",
        ]
