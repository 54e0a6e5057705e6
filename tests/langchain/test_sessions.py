"""Which conversation a LangChain model call belongs to (issue 10): no history crosses users,
runs or nested calls. Real LangChain apps, offline; the assertions are on what the fake models
received and on what the store holds."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import ConfigurableFieldSpec
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

import ce.langchain
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.events import Event
from ce.core.schema import Role
from ce.core.stores import MemoryStore
from ce.core.testing import deterministic_engine

# RunnableWithMessageHistory and InMemoryChatMessageHistory are deprecated (still shipped)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

OUTER_SYSTEM = "You are the outer travel agent."
HELPER_SYSTEM = "You are a terse summarizer."
EXPERT_SYSTEM = "You are the visa expert."
REWRITER_SYSTEM = "Rewrite the query for search."


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


# -- 3. nested calls: an LLM-backed tool, a sub-agent as a tool, an LLM query rewriter --------


def nested_app(
    middleware: Sequence[Any] = (),
) -> tuple[Any, Scripted, Scripted, Scripted, Scripted]:
    helper = replies("SUMMARY-REPLY")
    expert = replies("EXPERT-REPLY")
    rewriter = replies("REWRITTEN-QUERY")
    summarize_prompt = ChatPromptTemplate.from_messages(
        [("system", HELPER_SYSTEM), ("human", "Summarize: {text}")]
    )
    expert_agent = create_agent(expert, tools=[], system_prompt=EXPERT_SYSTEM)

    @tool
    def summarize(text: str) -> str:
        """Summarize a text with a helper model."""
        reply = (summarize_prompt | helper).invoke({"text": text})
        return f"summary is {str(reply.content).lower()}"

    @tool
    def ask_expert(question: str) -> str:
        """Ask the visa expert (a sub-agent)."""
        state = expert_agent.invoke({"messages": [("user", f"Expert question: {question}")]})
        return f"expert says {str(state['messages'][-1].content).lower()}"

    class Rewriting(BaseRetriever):
        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            better = rewriter.invoke(
                [("system", REWRITER_SYSTEM), ("user", query)],
                {"callbacks": run_manager.get_child()},
            )
            return [Document(page_content=f"doc for {better.content}", metadata={"source": "kb"})]

    @tool
    def search(query: str) -> str:
        """Search the knowledge base (an LLM rewrites the query first)."""
        return "found " + " ".join(d.page_content for d in Rewriting().invoke(query))

    outer = replies(
        call("summarize", {"text": "a long itinerary"}, "call_sum"),
        call("ask_expert", {"question": "do I need a visa?"}, "call_exp"),
        call("search", {"query": "visa rules"}, "call_kb"),
        "All done.",
        "You are welcome.",
    )
    agent = create_agent(
        outer,
        tools=[summarize, ask_expert, search],
        system_prompt=OUTER_SYSTEM,
        checkpointer=InMemorySaver(),
        middleware=middleware,
    )
    return agent, outer, helper, expert, rewriter


@pytest.mark.parametrize("seam", ["install", "middleware"])
async def test_nested_calls_get_a_child_scope(engine: ContextEngine, seam: str) -> None:
    if seam == "middleware":
        app = nested_app([ce.langchain.middleware(engine)])
    else:
        ce.langchain.install(engine)
        app = nested_app()
    agent, outer, helper, expert, rewriter = app
    config = {"configurable": {"thread_id": "trip"}}
    question = "Plan my trip to Japan, my code word is SAKURA."
    await asyncio.to_thread(agent.invoke, {"messages": [("user", question)]}, config)
    await agent.ainvoke({"messages": [("user", "Thanks!")]}, config)

    # the nested calls received only their own messages
    for model, system, prompt in (
        (helper, HELPER_SYSTEM, "Summarize: a long itinerary"),
        (expert, EXPERT_SYSTEM, "Expert question: do I need a visa?"),
        (rewriter, REWRITER_SYSTEM, "visa rules"),
    ):
        (seen,) = model.seen
        assert [m.type for m in seen] == ["system", "human"]
        assert str(seen[0].content).startswith(system) and seen[1].content == prompt
        assert "SAKURA" not in texts(seen) and OUTER_SYSTEM not in texts(seen)
    # the outer agent keeps its instruction and each next call ends with the tool result
    assert len(outer.seen) == 5
    for seen in outer.seen:
        assert seen[0].type == "system" and str(seen[0].content).startswith(OUTER_SYSTEM)
        for foreign in (HELPER_SYSTEM, EXPERT_SYSTEM, REWRITER_SYSTEM, "Summarize:", "Expert q"):
            assert foreign not in texts(seen)
        assert "SUMMARY-REPLY" not in texts(seen) and "EXPERT-REPLY" not in texts(seen)
    results = [seen[-1] for seen in outer.seen[1:4]]
    assert all(isinstance(m, ToolMessage) for m in results)
    assert [m.content for m in results[:2]] == [
        "summary is summary-reply",
        "expert says expert-reply",
    ]
    assert "doc for REWRITTEN-QUERY" in str(results[2].content)  # fenced as rag evidence
    assert outer.seen[4][-1].type == "human" and outer.seen[4][-1].content == "Thanks!"

    # the store: the outer session holds the outer conversation only
    doc = await engine.get_session("trip")
    stored = doc.session.model_dump_json()
    for foreign in (HELPER_SYSTEM, EXPERT_SYSTEM, REWRITER_SYSTEM, "Summarize:", "Expert q"):
        assert foreign not in stored
    assert await user_texts(engine, "trip") == [question, "Thanks!"]
    assistant = [m.content for m in doc.session.messages if m.role is Role.ASSISTANT]
    assert "SUMMARY-REPLY" not in assistant and "EXPERT-REPLY" not in assistant
    assert {c.tool_call_id for c in doc.session.tool_state.tool_calls} == {
        "call_sum",
        "call_exp",
        "call_kb",
    }
    # ... and each nested call is in its child session (with middleware() only the agent's
    # own calls are injected: the nested ones are recorded, their prompts not assembled)
    sessions = set(await engine.store.list_sessions())
    assert {"trip", "trip/call_sum", "trip/call_exp"} <= sessions
    (rewrite,) = sessions - {"trip", "trip/call_sum", "trip/call_exp"}
    assert rewrite.startswith("trip/call_kb/")  # under the tool, then the retriever run
    nested = {
        "trip/call_sum": ("Summarize: a long itinerary", "SUMMARY-REPLY"),
        "trip/call_exp": ("Expert question: do I need a visa?", "EXPERT-REPLY"),
        rewrite: ("visa rules", "REWRITTEN-QUERY"),
    }
    for session_id, (prompt, reply) in nested.items():
        child = await engine.get_session(session_id)
        replies_there = [m.content for m in child.session.messages if m.role is Role.ASSISTANT]
        assert replies_there == [reply]
        assert len(child.session.model_usage) == 1
        expected = [prompt] if seam == "install" else []
        assert await user_texts(engine, session_id) == expected


async def test_a_nested_call_naming_its_own_session_goes_there(engine: ContextEngine) -> None:
    helper = replies("noted")

    @tool
    def remember(fact: str) -> str:
        """Remember a fact in the shared notes conversation."""
        helper.invoke([("user", fact)], {"metadata": {"ce_session_id": "notes"}})
        return "remembered"

    outer = replies(call("remember", {"fact": "the sky is blue"}, "call_r"), "ok")
    agent = create_agent(outer, tools=[remember], system_prompt=OUTER_SYSTEM)
    ce.langchain.install(engine)
    config = {"configurable": {"thread_id": "main"}}
    await asyncio.to_thread(agent.invoke, {"messages": [("user", "remember this")]}, config)
    assert await user_texts(engine, "notes") == ["the sky is blue"]
    assert await user_texts(engine, "main") == ["remember this"]
    assert texts(helper.seen[0]) == "the sky is blue"


# -- 4. a reused tool-call id does not switch the engine off ----------------------------------


async def test_a_reused_tool_call_id_keeps_the_session_working() -> None:
    budget = BudgetConfig(max_input_tokens=2000, reserved_reply_tokens=200)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=budget))
    events: list[Event] = []
    engine.events.on("Degraded", events.append)

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    outer = replies(
        call("get_weather", {"city": "Paris"}, "call_0"),
        "Paris is sunny.",
        call("get_weather", {"city": "Oslo"}, "call_0"),  # the same id again, next turn
        "Oslo is sunny.",
        "Noted.",
    )
    agent = create_agent(
        outer, tools=[get_weather], system_prompt=OUTER_SYSTEM, checkpointer=InMemorySaver()
    )
    plugin = ce.langchain.install(engine)
    before = failures(plugin)  # the counter lives as long as the plugin object
    config = {"configurable": {"thread_id": "reuse"}}
    try:
        for text in ("Weather in Paris?", "Weather in Oslo?", "Mail me at jo@example.com"):
            await agent.ainvoke({"messages": [("user", text)]}, config)
        assert failures(plugin) == before
        reasons = [e.payload.get("reason") for e in events]
        assert "integration_failed" not in reasons and "redaction_failed" not in reasons
        assert len(outer.seen) == 5
        last = outer.seen[-1]
        assert "jo@example.com" not in texts(last) and "[REDACTED:email]" in texts(last)
        assert str(last[0].content).startswith(OUTER_SYSTEM)
        turns = await engine.list_turns("reuse")
        assert len(turns) == 5  # every call assembled by the engine
        limit = budget.max_input_tokens - budget.reserved_reply_tokens
        assert all(t.report is not None and t.report.token_used <= limit for t in turns)
    finally:
        await engine.close()


# -- 5. fail-open is redacted -----------------------------------------------------------------


class BrokenStore(MemoryStore):
    """A store whose reads fail."""

    async def get_session(self, session_id: str) -> Any:
        raise OSError("the store is down")

    async def read_since(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError("the store is down")

    async def get_version(self, session_id: str) -> int:
        raise OSError("the store is down")


@pytest.mark.parametrize("path", ["sync", "async", "middleware"])
async def test_fail_open_is_redacted(path: str) -> None:
    engine = ContextEngine(BrokenStore(), config=RuntimeConfig(model_hint="gpt-4o"))
    before = failures(ce.langchain.LangChainPlugin())["integration_failed"]
    model = replies("ok")
    question = [("system", "Be brief."), ("user", "Mail me at jo@example.com please")]
    try:
        if path == "middleware":
            agent = create_agent(model, tools=[], middleware=[ce.langchain.middleware(engine)])
            await agent.ainvoke({"messages": question[1:]})
        else:
            ce.langchain.install(engine)
            if path == "sync":
                await asyncio.to_thread(model.invoke, question)
            else:
                await model.ainvoke(question)
        (seen,) = model.seen
        assert "jo@example.com" not in texts(seen)
        assert "Mail me at [REDACTED:email] please" in texts(seen)
        assert failures(ce.langchain.LangChainPlugin())["integration_failed"] > before
    finally:
        await engine.close()


async def test_a_conversion_failure_is_redacted_too(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ce.langchain import _inject

    def broken(messages: Any) -> Any:
        raise ValueError("cannot convert")

    monkeypatch.setattr(_inject, "to_openai", broken)
    plugin = ce.langchain.install(engine)
    before = failures(plugin)["integration_failed"]
    model = replies("ok", "ok")
    await asyncio.to_thread(model.invoke, [("user", "Mail me at jo@example.com")])
    await model.ainvoke([("user", "Mail me at jo@example.com")])
    assert failures(plugin)["integration_failed"] == before + 2
    assert [texts(seen) for seen in model.seen] == ["Mail me at [REDACTED:email]"] * 2


# -- 6. concurrent users in one process -------------------------------------------------------

USERS = 20


def canary(user: int) -> str:
    return f"CANARY{user:02d}X"


def owners(seen: Sequence[BaseMessage]) -> set[int]:
    text = texts(seen)
    return {user for user in range(USERS) if canary(user) in text}


def check_isolated(model: Scripted, turns: int) -> None:
    assert len(model.seen) == USERS * turns
    counts = [0] * USERS
    for seen in model.seen:
        found = owners(seen)
        assert len(found) == 1, found  # its own canary only
        counts[found.pop()] += 1
    assert counts == [turns] * USERS


def concurrent_agent(checkpointer: bool = True) -> tuple[Any, Scripted]:
    model = Scripted(script=lambda messages: f"noted ({len(messages)})")
    agent = create_agent(
        model,
        tools=[],
        system_prompt=OUTER_SYSTEM,
        checkpointer=InMemorySaver() if checkpointer else None,
    )
    return agent, model


async def test_concurrent_users_async(engine: ContextEngine) -> None:
    agent, model = concurrent_agent()
    chain_model = Scripted(script=lambda messages: "noted")
    chain = history_chain(chain_model, {})
    ce.langchain.install(engine)

    async def user(n: int, question: str) -> None:
        await agent.ainvoke(
            {"messages": [("user", question)]}, {"configurable": {"thread_id": f"user-{n}"}}
        )
        await chain.ainvoke({"question": question}, {"configurable": {"session_id": f"u{n}"}})

    await asyncio.gather(*(user(n, f"My word is {canary(n)}.") for n in range(USERS)))
    await asyncio.gather(*(user(n, f"User {n}: what is my word?") for n in range(USERS)))
    # the second question carries no canary: only the user's own history can put one there
    check_isolated(model, 2)
    check_isolated(chain_model, 2)


async def test_concurrent_users_threads(engine: ContextEngine) -> None:
    agent, model = concurrent_agent()
    chain_model = Scripted(script=lambda messages: "noted")
    chain = history_chain(chain_model, {})
    ce.langchain.install(engine)

    def user(n: int, question: str) -> None:
        agent.invoke(
            {"messages": [("user", question)]}, {"configurable": {"thread_id": f"user-{n}"}}
        )
        chain.invoke({"question": question}, {"configurable": {"session_id": f"u{n}"}})

    def run_all(question: str) -> None:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda n: user(n, question.format(n=n, c=canary(n))), range(USERS)))

    await asyncio.to_thread(run_all, "My word is {c}.")
    await asyncio.to_thread(run_all, "User {n}: what is my word?")
    check_isolated(model, 2)
    check_isolated(chain_model, 2)
    stored = set(await engine.store.list_sessions())
    assert stored == {f"user-{n}" for n in range(USERS)} | {f"u{n}" for n in range(USERS)}


async def test_concurrent_runs_without_identity_stay_apart(engine: ContextEngine) -> None:
    agent, model = concurrent_agent(checkpointer=False)
    ce.langchain.install(engine)
    await asyncio.gather(
        *(agent.ainvoke({"messages": [("user", f"My word is {canary(n)}.")]}) for n in range(USERS))
    )
    check_isolated(model, 1)
    sessions = await engine.store.list_sessions()
    assert len(sessions) == USERS and all(s.startswith("run:") for s in sessions)


# -- the explicit seams and streaming follow the same rule ------------------------------------


class StreamingScripted(Scripted):
    """A :class:`Scripted` model that also streams (one chunk per reply)."""

    def _stream(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Iterator[Any]:
        from langchain_core.messages import AIMessageChunk
        from langchain_core.outputs import ChatGenerationChunk

        message = self._generate(messages).generations[0].message
        yield ChatGenerationChunk(message=AIMessageChunk(content=message.content))


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
    assert outer.seen[1][-1].content == "helper: helper-reply"
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
