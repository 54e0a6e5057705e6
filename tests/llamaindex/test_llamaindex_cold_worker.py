"""A worker that has not served a conversation yet answers a LlamaIndex chat engine's turn:
the request body llama-index-llms-openai's ``OpenAI`` sends to the scripted OpenAI server is
what a worker holding the whole session sends, and the session ends the same, whether the
app's memory passes its whole history (prepared from the session's newest records) or a
window of it (the session is read whole)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.storage.chat_store import SimpleChatStore
from llama_index.llms.openai import OpenAI

import ce.llamaindex
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.schema import Role
from ce.core.stores import SQLiteStore, Store
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.core.testing.engines import note_reads, whole_copy

CONFIG = RuntimeConfig(
    model_hint="gpt-4o", budget=BudgetConfig(max_input_tokens=1200, reserved_reply_tokens=200)
)


def _engine(store: Store) -> ContextEngine:
    return ContextEngine(
        store, config=CONFIG, clock=SteppingClock(), id_generator=SequentialIdGenerator("c")
    )


def _answer(body: dict[str, Any]) -> ScriptedResponse:
    return ScriptedResponse(text=f"Noted, {len(body['messages'])} messages.")


async def _stored(engine: ContextEngine) -> list[tuple[Role, str]]:
    doc = await engine.get_session("user-1")
    return [(m.role, m.content) for m in doc.session.messages]


@pytest.mark.parametrize("window", [None, 400], ids=["whole-history", "memory-window"])
async def test_a_cold_worker_sends_what_a_worker_with_the_whole_session_sends(
    tmp_path: Path, window: int | None
) -> None:
    server = ScriptedOpenAIServer(_answer).start()
    try:
        llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
        chats = SimpleChatStore()  # the app's own history of its users, shared by its workers

        def chat(store: SimpleChatStore) -> SimpleChatEngine:
            memory = ChatMemoryBuffer.from_defaults(
                chat_store=store, chat_store_key="user-1", token_limit=window or 10**7
            )
            return SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt="SYS")

        served = _engine(SQLiteStore(tmp_path / "chat.db"))
        ce.llamaindex.install(served)
        first = chat(chats)
        for i in range(120):  # far more than one model call can keep
            await first.achat(f"Question {i}: remember the number {i * 7}.")
        ce.llamaindex.uninstall()
        whole_store = await whole_copy(served, "user-1")  # every read of it: the whole session
        cold_store = SQLiteStore(tmp_path / "chat.db")  # a new process on the shared store
        log: list[str] = []
        # each read with the number of requests sent before it
        note_reads(cold_store, lambda name: log.append(f"{name}:{len(server.requests)}"))
        sent, stored = [], []
        for store in (whole_store, cold_store):
            engine = _engine(store)
            ce.llamaindex.install(engine)
            before = len(server.requests)
            log.clear()
            await chat(copy.deepcopy(chats)).achat("Which number did I ask you to remember first?")
            await engine.flush()
            ce.llamaindex.uninstall()
            sent.append(server.requests[before:])
            stored.append(await _stored(engine))
            await engine.close()
        await cold_store.close()
    finally:
        server.close()

    assert len(sent[0]) == len(sent[1]) == 1
    assert sent[1][0]["messages"] == sent[0][0]["messages"]
    assert stored[1] == stored[0]
    asked = len(server.requests) - 1  # requests before the cold worker's own
    before_model = [name for name, count in (e.split(":") for e in log) if int(count) <= asked]
    if window is None:  # the whole history lines up with the newest records
        assert before_model and set(before_model) == {"read_tail"}, log
    else:  # a window of it does not: the session is read whole
        assert "read_since" in before_model, log
