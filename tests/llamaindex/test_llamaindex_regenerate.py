"""A LlamaIndex chat app that goes back in its conversation — "regenerate" (it drops the
answer it got and asks again), "edit" (it replaces a message and drops what followed) — with
the LLM called on the app's own history, or a chat engine given ``chat_history``, gets the
conversation it went back to: the model receives what the app passes, not the turns it took
back, nor what a chat engine retrieved for them. llama-index-llms-openai's ``OpenAI`` against
the scripted OpenAI server; the assertions are on the request bodies it received."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core.chat_engine import ContextChatEngine, SimpleChatEngine
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.llms.openai import OpenAI

import ce.llamaindex
from ce.core.engine import ContextEngine
from ce.core.testing import CITY_GUIDES, ScriptedOpenAIServer, numbered_answer

SYS = "You answer in one line."


async def _chat(llm: OpenAI, history: list[ChatMessage], path: str) -> ChatMessage:
    if path == "chat":
        return (await asyncio.to_thread(llm.chat, history)).message
    if path == "achat":
        return (await llm.achat(history)).message
    chunks = [chunk async for chunk in await llm.astream_chat(history)]
    return chunks[-1].message


@pytest.mark.parametrize("path", ["chat", "achat", "astream_chat"])
async def test_the_llm_on_the_apps_history_gets_what_it_went_back_to(
    engine: ContextEngine, path: str
) -> None:
    with ScriptedOpenAIServer(numbered_answer) as server:
        llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="k", max_retries=0)
        ce.llamaindex.install(engine)
        with engine.session("user-1"):
            history = [ChatMessage(role="system", content=SYS)]
            for question in ("Where is Paris?", "What is the plan?"):
                history.append(ChatMessage(role="user", content=question))
                history.append(await _chat(llm, history, path))
            history.pop()  # regenerate

            await _chat(llm, history, path)
            assert server.last_conversation() == [
                "Where is Paris?",
                "answer 0 to Where is Paris?",
                "What is the plan?",
            ]

            edited = [*history[:3], ChatMessage(role="user", content="What is in Rome?")]
            edited.append(await _chat(llm, edited, path))
            assert server.last_conversation() == [
                "Where is Paris?",
                "answer 0 to Where is Paris?",
                "What is in Rome?",
            ]
            edited.append(ChatMessage(role="user", content="And tomorrow?"))
            await _chat(llm, edited, path)
            assert server.last_conversation() == [
                "Where is Paris?",
                "answer 0 to Where is Paris?",
                "What is in Rome?",
                "answer 1 to What is in Rome?",
                "And tomorrow?",
            ]


def test_a_chat_engine_given_an_earlier_history(engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(numbered_answer) as server:
        llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="k", max_retries=0)
        ce.llamaindex.install(engine)
        chat_engine = SimpleChatEngine.from_defaults(llm=llm, system_prompt=SYS)
        with engine.session("user-2"):
            chat_engine.chat("Where is Paris?")
            chat_engine.chat("What is the plan?")
            first_turn = chat_engine.chat_history[:2]

            chat_engine.chat("What is the plan?", chat_history=list(first_turn))
            assert server.last_conversation() == [
                "Where is Paris?",
                "answer 0 to Where is Paris?",
                "What is the plan?",
            ]
            chat_engine.chat("What is in Rome?", chat_history=list(first_turn))
            assert server.last_conversation() == [
                "Where is Paris?",
                "answer 0 to Where is Paris?",
                "What is in Rome?",
            ]
            chat_engine.chat("And tomorrow?")
            assert server.last_conversation() == [
                "Where is Paris?",
                "answer 0 to Where is Paris?",
                "What is in Rome?",
                "answer 1 to What is in Rome?",
                "And tomorrow?",
            ]


class CityGuides(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [
            NodeWithScore(node=TextNode(text=text, id_=city), score=1.0)
            for city, text in CITY_GUIDES.items()
            if city in query_bundle.query_str
        ]


@pytest.mark.parametrize("path", ["chat", "achat"])
async def test_a_context_chat_engine_given_an_earlier_history(
    engine: ContextEngine, path: str
) -> None:
    """The documents a ContextChatEngine retrieved for the question the user edited away
    are not sent with the edit; one retrieved again for it is, once."""
    with ScriptedOpenAIServer(numbered_answer) as server:
        llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="k", max_retries=0)
        ce.llamaindex.install(engine)
        chat_engine = ContextChatEngine.from_defaults(
            retriever=CityGuides(),
            llm=llm,
            memory=ChatMemoryBuffer.from_defaults(),
            system_prompt=SYS,
        )

        async def chat(question: str, history: list[ChatMessage] | None = None) -> None:
            if path == "chat":
                await asyncio.to_thread(chat_engine.chat, question, history)
            else:
                await chat_engine.achat(question, history)

        with engine.session("user-3"):
            await chat("Weather in Paris?")
            first_turn = chat_engine.chat_history[:2]
            await chat("And in Oslo?")
            assert server.sent_counts(CITY_GUIDES) == {"Paris": 1, "Oslo": 1}

            await chat("And in Rome?", list(first_turn))
            assert server.last_conversation() == [
                "Weather in Paris?",
                "answer 0 to Weather in Paris?",
                "And in Rome?",
            ]
            assert server.sent_counts(CITY_GUIDES) == {"Paris": 1, "Rome": 1}
            await chat("And in Oslo or Rome, after all?")
            assert server.sent_counts(CITY_GUIDES) == {"Paris": 1, "Oslo": 1, "Rome": 1}
