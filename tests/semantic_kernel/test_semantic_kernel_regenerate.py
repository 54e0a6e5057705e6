"""A Semantic Kernel chat app that goes back in its conversation — "regenerate" (it removes the
answer it got from its ``ChatHistory`` and asks the service again), "edit" (it replaces a
message and drops what followed) — gets the conversation it went back to: the model receives
what the ``ChatHistory`` holds, not the turns it took back (SK's own OpenAI chat service on the
scripted server; the assertions are on the request bodies)."""

from __future__ import annotations

import pytest
from semantic_kernel.connectors.ai.open_ai import OpenAIChatPromptExecutionSettings
from semantic_kernel.contents import ChatHistory
from sk_apps import service

import ce.semantic_kernel
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, numbered_answer


@pytest.mark.parametrize("path", ["get_chat_message_content", "get_streaming_chat_message_content"])
async def test_regenerate_and_edit_send_the_conversation_the_app_went_back_to(
    engine: ContextEngine, path: str
) -> None:
    with ScriptedOpenAIServer(numbered_answer) as server:
        chat = service(server)
        settings = OpenAIChatPromptExecutionSettings()
        ce.semantic_kernel.install(engine)

        async def ask(history: ChatHistory) -> None:
            with engine.session("user-1"):
                if path == "get_chat_message_content":
                    reply = await chat.get_chat_message_content(history, settings)
                    assert reply is not None
                    history.add_message(reply)
                    return
                text = ""
                async for chunk in chat.get_streaming_chat_message_content(history, settings):
                    text += str(chunk or "")
                history.add_assistant_message(text)

        history = ChatHistory(system_message="You answer in one line.")
        for question in ("Where is Paris?", "What is the plan?"):
            history.add_user_message(question)
            await ask(history)
        history.messages.pop()  # regenerate

        await ask(history)
        assert server.last_conversation() == [
            "Where is Paris?",
            "answer 0 to Where is Paris?",
            "What is the plan?",
        ]

        del history.messages[3:]  # edit the second question
        history.add_user_message("What is in Rome?")
        await ask(history)
        assert server.last_conversation() == [
            "Where is Paris?",
            "answer 0 to Where is Paris?",
            "What is in Rome?",
        ]
        history.add_user_message("And tomorrow?")
        await ask(history)
        assert server.last_conversation() == [
            "Where is Paris?",
            "answer 0 to Where is Paris?",
            "What is in Rome?",
            "answer 1 to What is in Rome?",
            "And tomorrow?",
        ]
