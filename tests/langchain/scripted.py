"""A scripted offline chat model and the helpers the session tests share."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from ce.core.engine import ContextEngine
from ce.core.schema import Role

OUTER_SYSTEM = "You are the outer travel agent."


class Scripted(BaseChatModel):
    """A chat model that answers ``script(messages)`` (an AIMessage or a text) and keeps every
    message list it received (thread-safe: concurrent users share one instance)."""

    script: Any
    seen: list[list[BaseMessage]] = []
    lock: Any = None

    def model_post_init(self, context: Any) -> None:
        self.seen = []
        self.lock = threading.Lock()

    @property
    def _llm_type(self) -> str:
        return "scripted-fake"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Scripted:  # type: ignore[override]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        with self.lock:
            self.seen.append(list(messages))
            reply = self.script(list(messages))
        message = reply if isinstance(reply, AIMessage) else AIMessage(content=str(reply))
        return ChatResult(generations=[ChatGeneration(message=message)])


def replies(*answers: AIMessage | str) -> Scripted:
    """A scripted model answering ``answers`` in turn."""
    queue = list(answers)
    return Scripted(script=lambda _: queue.pop(0))


def texts(messages: Sequence[BaseMessage]) -> str:
    return "\n".join(str(m.content) for m in messages)


def call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


def failures(plugin: Any) -> Counter[str]:
    """A copy of ``plugin.failures`` (the counter lives as long as the plugin object)."""
    return Counter(getattr(plugin, "failures", None) or {})


async def user_texts(engine: ContextEngine, session_id: str) -> list[str]:
    doc = await engine.get_session(session_id)
    return [str(m.content) for m in doc.session.messages if m.role is Role.USER]


def history_chain(model: BaseChatModel, histories: dict[str, InMemoryChatMessageHistory]) -> Any:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are helpful."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    return RunnableWithMessageHistory(
        prompt | model,
        lambda session_id: histories.setdefault(session_id, InMemoryChatMessageHistory()),
        input_messages_key="question",
        history_messages_key="history",
    )


class StreamingScripted(Scripted):
    """A :class:`Scripted` model that also streams (one chunk per reply)."""

    def _stream(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Iterator[Any]:
        message = self._generate(messages).generations[0].message
        yield ChatGenerationChunk(message=AIMessageChunk(content=message.content))


async def ask_graph(graph: Any, questions: Sequence[str], config: Any, path: str) -> None:
    """Each of ``questions`` as a new user message to a LangGraph ``graph`` on one thread,
    through ``invoke`` (``path == "invoke"``) or ``ainvoke``."""
    for question in questions:
        inputs = {"messages": [HumanMessage(question)]}
        if path == "invoke":
            graph.invoke(inputs, config)
        else:
            await graph.ainvoke(inputs, config)
