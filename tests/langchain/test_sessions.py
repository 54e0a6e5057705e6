"""Which conversation a LangChain model call belongs to (issue 10): users of one
RunnableWithMessageHistory, runs that name no conversation (in one process and across
processes on one store), and the seams and paths that must agree on the session. Real LangChain
apps, offline; the assertions are on what the fake models received and what the store holds."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from langchain.agents import create_agent
from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.messages import BaseMessage, messages_from_dict, messages_to_dict
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import ConfigurableFieldSpec
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from scripted import (
    OUTER_SYSTEM,
    StreamingScripted,
    call,
    history_chain,
    replies,
    texts,
    user_texts,
)

import ce.langchain
import ce.langchain._inject
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing.assertions import unfenced

# RunnableWithMessageHistory and InMemoryChatMessageHistory are deprecated (still shipped)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

HELPER_SYSTEM = "You are a terse summarizer."


# -- 1. several users on one RunnableWithMessageHistory ---------------------------------------


async def test_users_of_one_history_chain_never_share(engine: ContextEngine) -> None:
    model = replies("Hello Alice.", "Hello Bob.", "Your word is ALPACA.")
    chain = history_chain(model, {})
    ce.langchain.install(engine)
    alice = {"configurable": {"session_id": "alice"}}
    bob = {"configurable": {"session_id": "bob"}}
    await asyncio.to_thread(chain.invoke, {"question": "I am Alice, my word is ALPACA."}, alice)
    await chain.ainvoke({"question": "I am Bob, my word is ZEBRA."}, bob)
    await asyncio.to_thread(chain.invoke, {"question": "What is my word?"}, alice)

    first, to_bob, again = (texts(seen) for seen in model.seen)
    assert "ALPACA" in first and "ZEBRA" not in first
    assert "ZEBRA" in to_bob and "ALPACA" not in to_bob and "Alice" not in to_bob
    assert "I am Alice, my word is ALPACA." in again and "Hello Alice." in again
    assert "ZEBRA" not in again and "Bob" not in again
    assert sorted(await engine.store.list_sessions()) == ["alice", "bob"]
    assert await user_texts(engine, "alice") == [
        "I am Alice, my word is ALPACA.",
        "What is my word?",
    ]
    assert await user_texts(engine, "bob") == ["I am Bob, my word is ZEBRA."]


async def test_history_factory_config_keys_name_the_conversation(engine: ContextEngine) -> None:
    """Custom ``history_factory_config`` keys (user + conversation) scope the run together."""
    histories: dict[tuple[str, str], InMemoryChatMessageHistory] = {}
    prompt = ChatPromptTemplate.from_messages(
        [MessagesPlaceholder("history"), ("human", "{question}")]
    )
    model = replies("one", "two", "three")
    chain = RunnableWithMessageHistory(
        prompt | model,
        lambda user_id, conversation_id: histories.setdefault(
            (user_id, conversation_id), InMemoryChatMessageHistory()
        ),
        input_messages_key="question",
        history_messages_key="history",
        history_factory_config=[
            ConfigurableFieldSpec(id="user_id", annotation=str, is_shared=True),
            ConfigurableFieldSpec(id="conversation_id", annotation=str, is_shared=True),
        ],
    )
    ce.langchain.install(engine)

    def ask(question: str, user: str, conversation: str) -> None:
        config = {"configurable": {"user_id": user, "conversation_id": conversation}}
        chain.invoke({"question": question}, config)

    await asyncio.to_thread(ask, "u1 c1 says KIWI", "u1", "c1")
    await asyncio.to_thread(ask, "u1 c2 says MANGO", "u1", "c2")
    await asyncio.to_thread(ask, "u1 c1 again", "u1", "c1")
    assert "KIWI" not in texts(model.seen[1])
    assert "KIWI" in texts(model.seen[2]) and "MANGO" not in texts(model.seen[2])
    assert sorted(await engine.store.list_sessions()) == [
        "user_id=u1&conversation_id=c1",
        "user_id=u1&conversation_id=c2",
    ]


# -- 2. no identity: every run is its own session, across processes ---------------------------

APP = """
import json, sys
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

import ce.langchain
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.stores import open_store

seen = []


class Fake(GenericFakeChatModel):
    def bind_tools(self, tools, **kwargs):
        return self

    def _generate(self, messages, *args, **kwargs):
        seen.append([(m.type, str(m.content)) for m in messages])
        return super()._generate(messages, *args, **kwargs)


engine = ContextEngine(open_store(sys.argv[1]), config=RuntimeConfig(model_hint="gpt-4o"))
ce.langchain.install(engine)
agent = create_agent(Fake(messages=iter(["Paris."])), tools=[], system_prompt="Be brief.")
agent.invoke({"messages": [("user", "What is the capital of France?")]})
ce.langchain.uninstall()
engine.sync.close()
print(json.dumps(seen))
"""


def test_runs_without_a_thread_id_share_nothing_across_processes(tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(APP))
    url = f"sqlite:///{tmp_path / 's.db'}"
    received = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script), url],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        received.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for calls in received:
        (messages,) = calls
        assert [t for t, _ in messages] == ["system", "human"]
        assert messages[0][1].startswith("Be brief.")
        assert messages[1][1] == "What is the capital of France?"
        assert "Paris." not in json.dumps(messages)  # the first run's answer stays there

    async def sessions() -> list[str]:
        from ce.core.stores import open_store

        store = open_store(url)
        try:
            return await store.list_sessions()
        finally:
            await store.close()

    stored = asyncio.run(sessions())
    assert len(stored) == 2 and all(s.startswith("run:") for s in stored)


async def test_a_direct_model_call_is_its_own_run(engine: ContextEngine) -> None:
    model = replies("one", "two")
    ce.langchain.install(engine)
    await asyncio.to_thread(model.invoke, [("user", "first question")])
    await model.ainvoke([("user", "second question")])
    assert texts(model.seen[1]) == "second question"
    sessions = await engine.store.list_sessions()
    assert len(sessions) == 2 and all(s.startswith("run:") for s in sessions)
    assert sorted([(await user_texts(engine, s))[0] for s in sessions]) == [
        "first question",
        "second question",
    ]
    for session_id in sessions:  # injection and recording agree: the reply is there too
        doc = await engine.get_session(session_id)
        assert [m.role for m in doc.session.messages] == [Role.USER, Role.ASSISTANT]


# -- the explicit seams and streaming follow the same rule ------------------------------------


@pytest.mark.parametrize("path", ["invoke", "ainvoke", "stream", "astream"])
@pytest.mark.parametrize("seam", ["install", "wrap"])
async def test_unnamed_calls_are_their_own_runs_on_every_path(
    engine: ContextEngine, seam: str, path: str
) -> None:
    inner = StreamingScripted(script=lambda messages: "ok")
    model: Any = inner
    if seam == "wrap":
        model = ce.langchain.wrap(inner, engine)
    else:
        ce.langchain.install(engine)

    async def ask(text: str) -> None:
        messages = [("user", text)]
        if path == "invoke":
            await asyncio.to_thread(model.invoke, messages)
        elif path == "ainvoke":
            await model.ainvoke(messages)
        elif path == "stream":
            await asyncio.to_thread(lambda: list(model.stream(messages)))
        else:
            [chunk async for chunk in model.astream(messages)]

    await ask("first CANARY-A")
    await ask("second CANARY-B")
    assert texts(inner.seen[1]) == "second CANARY-B"
    sessions = await engine.store.list_sessions()
    assert len(sessions) == 2 and all(s.startswith("run:") for s in sessions)
    for session_id in sessions:  # assembled and recorded in the same session
        doc = await engine.get_session(session_id)
        assert [m.role for m in doc.session.messages] == [Role.USER, Role.ASSISTANT]
        assert len(doc.session.model_usage) == 1


async def test_wrap_inside_a_tool_gets_a_child_scope(engine: ContextEngine) -> None:
    helper = StreamingScripted(script=lambda messages: "HELPER-REPLY")
    wrapped = ce.langchain.wrap(helper, engine)

    @tool
    def consult(topic: str) -> str:
        """Consult a helper model."""
        chunks = list(wrapped.stream([("system", HELPER_SYSTEM), ("user", f"About {topic}")]))
        return "helper: " + "".join(str(c.content) for c in chunks).lower()

    outer = replies(call("consult", {"topic": "trains"}, "call_c"), "Done.")
    agent = create_agent(
        ce.langchain.wrap(outer),
        tools=[consult],
        system_prompt=OUTER_SYSTEM,
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "w-trip"}}
    await agent.ainvoke({"messages": [("user", "Trains in SAKURA land?")]}, config)
    (seen,) = helper.seen
    assert [(m.type, m.content) for m in seen] == [
        ("system", HELPER_SYSTEM),
        ("human", "About trains"),
    ]
    assert unfenced(outer.seen[1][-1].content) == "helper: helper-reply"
    assert str(outer.seen[1][0].content).startswith(OUTER_SYSTEM)
    assert await user_texts(engine, "w-trip") == ["Trains in SAKURA land?"]
    assert await user_texts(engine, "w-trip/call_c") == ["About trains"]
    child = await engine.get_session("w-trip/call_c")
    assert [m.content for m in child.session.messages if m.role is Role.ASSISTANT] == [
        "HELPER-REPLY"
    ]


async def test_a_session_tag_and_engine_session_name_the_session(engine: ContextEngine) -> None:
    model = replies("one", "two", "three")
    ce.langchain.install(engine, session_id="fallback")
    await asyncio.to_thread(model.invoke, [("user", "tagged")], {"tags": ["ce_session_id:tagged"]})

    def in_engine_session() -> None:
        with engine.session("named"):
            model.invoke([("user", "in engine.session")])

    await asyncio.to_thread(in_engine_session)
    await asyncio.to_thread(model.invoke, [("user", "nothing named")])
    assert await user_texts(engine, "tagged") == ["tagged"]
    assert await user_texts(engine, "named") == ["in engine.session"]
    assert await user_texts(engine, "fallback") == ["nothing named"]


async def test_uninstall_restores_the_session_hooks(engine: ContextEngine) -> None:
    from langchain_core.tools import BaseTool

    originals = (
        RunnableWithMessageHistory.__dict__["_merge_configs"],
        BaseTool.__dict__["run"],
        BaseTool.__dict__["arun"],
    )
    plugin = ce.langchain.install(engine)
    assert RunnableWithMessageHistory.__dict__["_merge_configs"] is not originals[0]
    assert BaseTool.__dict__["run"] is not originals[1]
    plugin.uninstall()
    assert (
        RunnableWithMessageHistory.__dict__["_merge_configs"],
        BaseTool.__dict__["run"],
        BaseTool.__dict__["arun"],
    ) == originals


# -- 8. a history loaded from a database: new objects on every call ---------------------------


class _LoadedHistory(BaseChatMessageHistory):
    """A chat history kept as dicts, as a database-backed one keeps it: every read builds
    new message objects."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return messages_from_dict(self.rows)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.rows += messages_to_dict(list(messages))

    def clear(self) -> None:
        self.rows = []


async def test_a_history_loaded_anew_on_every_call_is_converted_only_for_what_is_new(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = mock.Mock(wraps=ce.langchain._inject.to_openai)
    monkeypatch.setattr(ce.langchain._inject, "to_openai", spy)
    model = replies("One.", "Two.", "Three.", "Four.")
    stored = _LoadedHistory()
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are helpful."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    chain = RunnableWithMessageHistory(
        prompt | model,
        lambda session_id: stored,
        input_messages_key="question",
        history_messages_key="history",
    )
    ce.langchain.install(engine)
    config = {"configurable": {"session_id": "loaded"}}
    questions = ["First?", "Second?", "Third?", "Fourth?"]
    for question in questions:
        await asyncio.to_thread(chain.invoke, {"question": question}, config)
    # the first call converts its two messages; each later one only the reply stored since
    # and the new question (the system message and the loaded history read as before)
    assert [len(c.args[0]) for c in spy.call_args_list] == [2, 2, 2, 2]
    last = model.seen[-1]
    assert [m.content for m in last if m.type != "system"] == [
        "First?",
        "One.",
        "Second?",
        "Two.",
        "Third?",
        "Three.",
        "Fourth?",
    ]
    assert await user_texts(engine, "loaded") == questions
