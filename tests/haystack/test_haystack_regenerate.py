"""A Haystack chat app that goes back in its conversation — "regenerate" (it drops the answer
it got and runs its pipeline again on the same question), "edit" (it replaces a message and
drops what followed) — gets the conversation it went back to: the model receives what the
app passes, not the turns it took back nor the documents retrieved for them (the real
OpenAIChatGenerator in a Pipeline, on the scripted server; the assertions are on the request
bodies)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from haystack import Document, Pipeline, component
from haystack.components.builders import ChatPromptBuilder
from haystack.dataclasses import ChatMessage
from hs_apps import generator

import ce.haystack
from ce.core.engine import ContextEngine
from ce.core.testing import CITY_GUIDES, ScriptedOpenAIServer, numbered_answer


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


QUESTION = ChatMessage.from_user(
    "Documents:\n{% for d in documents %}{{ d.content }}\n{% endfor %}Question: {{ query }}"
)


@component
class CityGuides:
    @component.output_types(documents=list[Document])
    def run(self, query: str) -> dict[str, Any]:
        return {
            "documents": [
                Document(content=text, meta={"source": f"kb://{city.lower()}"}, score=1.0)
                for city, text in CITY_GUIDES.items()
                if city in query
            ]
        }


@pytest.mark.parametrize("kept", ["rendered prompts", "bare questions"])
@pytest.mark.parametrize("path", ["run", "run_async"])
async def test_a_conversational_rag_pipeline_edited(
    engine: ContextEngine, path: str, kept: str
) -> None:
    """Retriever, ChatPromptBuilder over the app's history (the prompts it sent, documents
    inline, or its bare questions, and the replies) and the generator: the edit gets its own
    documents and the first turn's, never those of the question the user edited away; one
    retrieved again is sent once. Each turn is stored once (a short question the app keeps
    bare is found in the prompt rendered around it, by its place)."""
    with ScriptedOpenAIServer(numbered_answer) as server:
        pipeline = Pipeline()
        pipeline.add_component("retriever", CityGuides())
        pipeline.add_component("prompt", ChatPromptBuilder(variables=["documents", "query"]))
        pipeline.add_component("llm", generator(server))
        pipeline.connect("retriever.documents", "prompt.documents")
        pipeline.connect("prompt.prompt", "llm.messages")
        ce.haystack.install(engine)

        async def ask(history: list[ChatMessage], query: str) -> list[ChatMessage]:
            data = {
                "retriever": {"query": query},
                "prompt": {"template": [*history, QUESTION], "query": query},
            }
            outputs = {"prompt"}
            with engine.session("rag-user"):
                if path == "run_async":
                    result = await pipeline.run_async(data, include_outputs_from=outputs)
                else:
                    result = await asyncio.to_thread(pipeline.run, data, outputs)
            reply = result["llm"]["replies"][0]
            if kept == "rendered prompts":
                return [*result["prompt"]["prompt"], reply]
            return [*history, ChatMessage.from_user(query), reply]

        def asked() -> list[str]:  # the questions of the conversation the model got
            return [t.rsplit("Question: ", 1)[-1] for t in server.last_conversation()[::2]]

        first = await ask([ChatMessage.from_system("Answer from the guides.")], "Paris?")
        await ask(first, "And Oslo?")
        assert server.sent_counts(CITY_GUIDES) == {"Paris": 1, "Oslo": 1}

        edited = await ask(first, "And Rome?")
        assert asked() == ["Paris?", "And Rome?"]
        assert len(server.last_conversation()) == 3
        assert server.sent_counts(CITY_GUIDES) == {"Paris": 1, "Rome": 1}
        await ask(edited, "And Oslo, then?")
        assert server.sent_counts(CITY_GUIDES) == {"Paris": 1, "Oslo": 1, "Rome": 1}
    doc = await engine.get_session("rag-user")
    asked_once = [
        m.content.rsplit(": ", 1)[-1] for m in doc.session.messages if m.role.value == "user"
    ]
    assert asked_once == ["Paris?", "And Oslo?", "And Rome?", "And Oslo, then?"]
