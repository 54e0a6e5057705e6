"""ce-haystack on a chat app whose ``ChatPromptBuilder`` template renders the earlier turns as
text inside the prompt (``{% for m in memories %}...{% endfor %}``, the app keeping its
conversation as ``ChatMessage`` objects): in a named session the model gets each earlier turn
once, as the session's messages, and the session stores the prompt without the rendered copy;
where the session does not hold those turns (a run that names no session, ``mode="augment"``)
the prompt goes as Haystack renders it (the real Haystack on the scripted OpenAI server)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from haystack import Pipeline
from haystack.components.builders import ChatPromptBuilder
from haystack.dataclasses import ChatMessage
from hs_apps import generator, wire

import ce.haystack
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.integration import SESSION_KEY
from ce.core.schema import Role
from ce.core.stores import SQLiteStore
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.haystack._rendered import TURNS_POINTER

SYSTEM = "You are a helpful assistant."
TEMPLATES = {
    "texts": "Conversation history:\n{% for m in memories %}{{ m.text }}\n{% endfor %}",
    "role labels": (
        "Conversation history:\n{% for m in memories %}{{ m.role.value }}: {{ m.text }}\n"
        "{% endfor %}"
    ),
}
QUESTIONS = (
    "What is the capital of Norway?",
    "How many people live there?",
    "And the second largest city?",
)
ANSWERS = ("Oslo is the capital of Norway.", "About 700,000 people.", "Bergen.")


def _chat(server: ScriptedOpenAIServer, template: str, metadata: dict[str, Any]) -> Pipeline:
    messages = [
        ChatMessage.from_system(SYSTEM),
        ChatMessage.from_user(template + "\nQuestion: {{ query }}"),
    ]
    pipeline = Pipeline(metadata=metadata)
    pipeline.add_component("prompt", ChatPromptBuilder(messages, required_variables=["query"]))
    pipeline.add_component("llm", generator(server))
    pipeline.connect("prompt.prompt", "llm.messages")
    return pipeline


def _converse(
    engine: ContextEngine, template: str, named: str | None, **install: Any
) -> list[list[dict[str, Any]]]:
    """Three turns of the chat app, the session named as ``named`` says, the plugin
    installed with ``install``'s ``mode`` (none with ``plugin=False``); the messages of each
    request."""
    answers = iter(ANSWERS)
    with ScriptedOpenAIServer(lambda _: ScriptedResponse(text=next(answers))) as server:
        metadata = {SESSION_KEY: "user-1"} if named == "pipeline metadata" else {}
        pipeline = _chat(server, template, metadata)
        plugin = install.get("plugin", True)
        if plugin:
            ce.haystack.install(
                engine,
                session_id="user-1" if named == "install" else None,
                mode=install.get("mode", "replace"),
            )
        scoped = engine.session("user-1") if named == "engine.session" else nullcontext()
        memories: list[ChatMessage] = []
        with scoped:
            for question in QUESTIONS:
                result = pipeline.run({"prompt": {"query": question, "memories": memories}})
                memories += [ChatMessage.from_user(question), result["llm"]["replies"][0]]
        if plugin:
            ce.haystack.uninstall()
        return [r["messages"] for r in server.requests]


@pytest.mark.parametrize("template", list(TEMPLATES))
@pytest.mark.parametrize("named", ["engine.session", "install", "pipeline metadata"])
async def test_history_rendered_into_the_prompt_reaches_the_model_once(
    named: str, template: str, engine: ContextEngine
) -> None:
    *_, last = _converse(engine, TEMPLATES[template], named)
    body = wire({"messages": last})
    for text in (*QUESTIONS, *ANSWERS[:2]):
        assert body.count(text) == 1, text  # once: as the session's turn, not in the prompt
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    prompt = last[-1]["content"]
    assert prompt == f"Conversation history:\n{TURNS_POINTER}\n\nQuestion: {QUESTIONS[2]}"
    doc = await engine.get_session("user-1")
    stored = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert stored[0] == f"Conversation history:\n\nQuestion: {QUESTIONS[0]}"
    assert stored[1:] == [
        f"Conversation history:\n{TURNS_POINTER}\n\nQuestion: {q}" for q in QUESTIONS[1:]
    ]


@pytest.mark.parametrize("how", ["no session", "augment"])
async def test_history_the_engine_does_not_send_stays_in_the_prompt(
    how: str, engine: ContextEngine
) -> None:
    """A run that names no session is a session new with the run, and ``mode="augment"``
    sends the app's own messages: the rendered history is the only copy, kept."""
    template = TEMPLATES["role labels"]
    native = _converse(engine, template, None, plugin=False)
    if how == "no session":
        assert _converse(engine, template, None) == native
        return
    *_, last = _converse(engine, template, "engine.session", mode="augment")
    assert last[-1] == native[-1][-1]
    assert [m["role"] for m in last] == ["system", "user"]


async def _each_turn_a_worker(
    path: str, run: str, answers: tuple[str, ...]
) -> list[dict[str, Any]]:
    """The chat app's three turns, each served by another worker process (a new engine on
    the same SQLite file, the plugin installed anew); the messages of the last request."""
    replies = iter(answers)
    with ScriptedOpenAIServer(lambda _: ScriptedResponse(text=next(replies))) as server:
        memories: list[ChatMessage] = []
        for question in QUESTIONS:
            worker = ContextEngine(SQLiteStore(path), config=RuntimeConfig(model_hint="gpt-4o"))
            ce.haystack.install(worker)
            pipeline = _chat(server, TEMPLATES["role labels"], {SESSION_KEY: "user-1"})
            data = {"prompt": {"query": question, "memories": memories}}
            result = await pipeline.run_async(data) if run == "run_async" else pipeline.run(data)
            memories += [ChatMessage.from_user(question), result["llm"]["replies"][0]]
            ce.haystack.uninstall()
            await worker.close()
        return list(server.requests[-1]["messages"])


@pytest.mark.parametrize("run", ["run", "run_async"])
async def test_turns_another_worker_recorded_reach_the_model_once(run: str, tmp_path: Path) -> None:
    """Every turn served by another worker: each worker finds the replies the prompt renders
    in the session's newest records, so the model still gets every earlier turn once, as the
    session's messages, and the session stores each prompt without the rendered copy."""
    path = str(tmp_path / "s.db")
    last = await _each_turn_a_worker(path, run, ANSWERS)
    body = wire({"messages": last})
    for text in (*QUESTIONS, *ANSWERS[:2]):
        assert body.count(text) == 1, text
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert (
        last[-1]["content"] == f"Conversation history:\n{TURNS_POINTER}\n\nQuestion: {QUESTIONS[2]}"
    )
    reader = ContextEngine(SQLiteStore(path))
    doc = await reader.get_session("user-1")
    await reader.close()
    stored = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert stored[1:] == [
        f"Conversation history:\n{TURNS_POINTER}\n\nQuestion: {q}" for q in QUESTIONS[1:]
    ]


async def test_a_reply_stored_redacted_is_found_by_another_worker(tmp_path: Path) -> None:
    """A reply holding an e-mail address is stored redacted; the next worker finds it as it
    is stored, so the prompt renders it once: as the session's message, redacted."""
    answers = ("Write to ops@example.com for that.", *ANSWERS[1:])
    last = await _each_turn_a_worker(str(tmp_path / "s.db"), "run", answers)
    body = wire({"messages": last})
    assert "ops@example.com" not in body
    assert body.count("Write to [REDACTED:email] for that.") == 1
    assert last[-1]["content"].startswith(f"Conversation history:\n{TURNS_POINTER}")


async def test_turns_older_than_the_session_are_asked_of_the_engine_once(
    engine: ContextEngine,
) -> None:
    """A conversation the app held before the session (an import, a chat from before the
    plugin): its replies are not the session's and stay in the prompt; the engine is asked
    about them once, not on every call."""
    asked: list[list[str]] = []
    lookup = engine.replies_held

    async def counted(session_id: str, texts: Any) -> frozenset[str]:
        asked.append(list(texts))
        return await lookup(session_id, texts)

    engine.replies_held = counted  # type: ignore[method-assign]
    older = [
        ChatMessage.from_user("Hello there?"),
        ChatMessage.from_assistant("Hi, how can I help?"),
    ]
    answers = iter(ANSWERS)
    with ScriptedOpenAIServer(lambda _: ScriptedResponse(text=next(answers))) as server:
        pipeline = _chat(server, TEMPLATES["role labels"], {SESSION_KEY: "user-1"})
        ce.haystack.install(engine)
        memories = list(older)
        for question in QUESTIONS:
            result = pipeline.run({"prompt": {"query": question, "memories": memories}})
            memories += [ChatMessage.from_user(question), result["llm"]["replies"][0]]
        ce.haystack.uninstall()
        last = server.requests[-1]["messages"]
    assert asked == [["Hi, how can I help?"]]
    assert "Hi, how can I help?" in last[-1]["content"]  # not the session's: it stays
    body = wire({"messages": last})
    for text in (*QUESTIONS, *ANSWERS[:2]):
        assert body.count(text) == 1, text
