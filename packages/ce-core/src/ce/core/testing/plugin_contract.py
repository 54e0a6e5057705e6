"""The contract every framework plugin must pass, run against the real framework.

Subclass :class:`PluginContract` in the plugin's tests (the class name must start with
``Test``), provide three fixtures and implement the adapter hooks::

    class TestLangChainContract(PluginContract):
        @pytest.fixture
        def plugin_cls(self):
            return LangChainPlugin

        @pytest.fixture
        async def engine(self):
            engine = ContextEngine(MemoryStore(), config=RuntimeConfig(model_hint="gpt-4o"))
            yield engine
            await engine.close()

        @pytest.fixture
        def make_app(self):
            return lambda server: build_agent(base_url=server.base_url)

        def run_sync(self, app, text, session_id): ...
        async def run_async(self, app, text, session_id): ...
        def run_stream(self, app, text, session_id): ...      # or async def
        def patched_targets(self): return [(BaseChatModel, "_convert_input")]

The app ``make_app(server)`` builds must talk to ``server`` (a :class:`ScriptedOpenAIServer`
answering with :func:`contract_script`) and, per user question: retrieve with a retriever
returning :data:`RETRIEVAL_DOCS` (unless :attr:`PluginContract.supports_retrieval` is false),
then run a tool loop with the system prompt :data:`SYSTEM_PROMPT` and one tool
:data:`TOOL_NAME` taking ``{"q": str}`` and returning ``"result for <q>"``; streamed requests
ask for ``stream_options.include_usage``. The ``run_*`` hooks ask ``text`` in session
``session_id`` (the framework's own session notion where it has one, else
``with engine.session(session_id)``) and return the final answer's text; ``run_sync`` and a
sync ``run_stream`` are called from a worker thread. The tests need ``pytest-asyncio`` with
``asyncio_mode = "auto"``.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from ce.core.engine import ContextEngine
from ce.core.events import Event
from ce.core.formats import from_openai_messages
from ce.core.integration import INTEGRATION_FAILED, Plugin, suppressed
from ce.core.schema import EvidenceType, Role
from ce.core.testing.assertions import assert_tool_pairs_intact
from ce.core.testing.openai_server import ScriptedOpenAIServer, ScriptedResponse

__all__ = [
    "NOTEBOOK_MARKER",
    "RETRIEVAL_DOCS",
    "SYSTEM_PROMPT",
    "TOOL_NAME",
    "TOOL_ROUNDS",
    "InjectedEngineError",
    "PluginContract",
    "contract_script",
]

SYSTEM_PROMPT = "You are the contract test app."
"""The app's own system prompt."""
TOOL_NAME = "lookup"
"""The one tool of the app."""
TOOL_ROUNDS = 2
"""Tool calls the script makes (one per model call) before it answers."""
NOTEBOOK_MARKER = "CE-CONTRACT-NOTEBOOK"
"""Put into the session's notebook: a request that contains it received assembled input."""
RETRIEVAL_DOCS: tuple[tuple[str, str, float], ...] = (
    ("doc://contract/one", "The first contract document.", 0.9),
    ("doc://contract/two", "The second contract document.", 0.4),
)
"""``(uri, content, score)`` of what the app's retriever returns."""

_PATHS = ("sync", "async", "stream")
_MISSING = object()


class InjectedEngineError(Exception):
    """Raised by the engine's ``prepare_call`` in the fail-open and fail-closed tests."""


def _tail(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The last user text and the messages after it."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            content = messages[index].get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            return text, messages[index + 1 :]
    return "", messages


def contract_script(body: dict[str, Any]) -> ScriptedResponse:
    """The model of the contract: after the last user message it calls :data:`TOOL_NAME`
    once per model call until :data:`TOOL_ROUNDS` results are back, then answers. Tool call
    ids are unique per question and round."""
    question, after = _tail(body["messages"])
    answered = sum(1 for m in after if m.get("role") == "tool")
    if answered < TOOL_ROUNDS:
        digest = hashlib.sha256(question.encode()).hexdigest()[:8]
        args = json.dumps({"q": f"{question} #{answered}"})
        return ScriptedResponse(tool_calls=[(f"call_{digest}_{answered}", TOOL_NAME, args)])
    return ScriptedResponse(text=f"answer to {question!r} after {answered} tool results")


def _first_text(request: dict[str, Any]) -> str:
    first = request["messages"][0]
    assert first["role"] in ("system", "developer"), f"first message is {first['role']}"
    content = first["content"]
    return content if isinstance(content, str) else json.dumps(content)


def _request_text(request: dict[str, Any]) -> str:
    return json.dumps(request["messages"])


class PluginContract:
    """Behaviour every plugin must show; see the module docstring for what to provide."""

    supports_retrieval: ClassVar[bool] = True
    """Whether the app retrieves (and the plugin records rag_doc evidence)."""

    # -- what subclasses provide ------------------------------------------------------------

    def run_sync(self, app: Any, text: str, session_id: str) -> str:
        """Ask ``text`` through the framework's blocking API."""
        raise NotImplementedError

    async def run_async(self, app: Any, text: str, session_id: str) -> str:
        """Ask ``text`` through the framework's async API."""
        raise NotImplementedError

    def run_stream(self, app: Any, text: str, session_id: str) -> Any:
        """Ask ``text`` through the framework's streaming API (sync, or ``async def``)."""
        raise NotImplementedError

    def patched_targets(self) -> list[tuple[Any, str]]:
        """The ``(owner, attribute)`` pairs the plugin replaces while installed."""
        raise NotImplementedError

    def install_plugin(
        self, plugin_cls: type[Plugin], engine: ContextEngine, app: Any, **kwargs: Any
    ) -> Plugin:
        """Install the plugin (override when the framework needs the app to install on)."""
        return plugin_cls().install(engine, **kwargs)

    # -- fixtures ---------------------------------------------------------------------------

    @pytest.fixture
    def openai_server(self) -> Iterator[ScriptedOpenAIServer]:
        with ScriptedOpenAIServer(contract_script) as server:
            yield server

    @pytest.fixture
    def app(self, make_app: Callable[[ScriptedOpenAIServer], Any], openai_server: Any) -> Any:
        return make_app(openai_server)

    @pytest.fixture(autouse=True)
    def _always_uninstall(self, plugin_cls: type[Plugin]) -> Iterator[None]:
        yield
        if plugin_cls().installed:
            plugin_cls().uninstall()

    @pytest.fixture
    def degraded(self, engine: ContextEngine) -> Iterator[list[Event]]:
        events: list[Event] = []
        engine.events.on("Degraded", events.append)
        yield events
        engine.events.off("Degraded", events.append)

    # -- helpers ----------------------------------------------------------------------------

    async def ask(self, path: str, app: Any, text: str, session_id: str) -> str:
        """Run one question through the ``path`` ("sync", "async" or "stream") hook."""
        if path == "async":
            return await self.run_async(app, text, session_id)
        hook = self.run_sync if path == "sync" else self.run_stream
        if inspect.iscoroutinefunction(hook):
            return str(await hook(app, text, session_id))
        return str(await asyncio.to_thread(hook, app, text, session_id))

    async def _mark(self, engine: ContextEngine, session_id: str, marker: str) -> None:
        await engine.update_notebook(session_id, marker)

    @staticmethod
    def _current(targets: list[tuple[Any, str]]) -> list[Any]:
        return [vars(owner).get(attr, _MISSING) for owner, attr in targets]

    @staticmethod
    def _break_prepare_call(engine: ContextEngine, monkeypatch: pytest.MonkeyPatch) -> None:
        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise InjectedEngineError("prepare_call failed on purpose")

        monkeypatch.setattr(engine, "prepare_call", broken)

    # -- install / uninstall ----------------------------------------------------------------

    async def test_install_twice_installs_once(
        self, plugin_cls: type[Plugin], engine: ContextEngine, app: Any, openai_server: Any
    ) -> None:
        plugin = self.install_plugin(plugin_cls, engine, app)
        assert plugin.installed
        entries = plugin.ledger.entries
        hooks = self._current(self.patched_targets())
        assert self.install_plugin(plugin_cls, engine, app) is plugin
        assert plugin.ledger.entries == entries
        now = self._current(self.patched_targets())
        assert all(a is b for a, b in zip(now, hooks, strict=True))
        await self.ask("sync", app, "install twice?", "s-twice")
        turns = await engine.list_turns("s-twice")
        assert len(turns) == len(openai_server.requests) == TOOL_ROUNDS + 1

    async def test_uninstall_restores_the_exact_originals(
        self, plugin_cls: type[Plugin], engine: ContextEngine, app: Any, openai_server: Any
    ) -> None:
        targets = self.patched_targets()
        before = self._current(targets)
        plugin = self.install_plugin(plugin_cls, engine, app)
        assert all(a is not b for a, b in zip(self._current(targets), before, strict=True))
        plugin.uninstall()
        assert not plugin.installed
        assert plugin.ledger.entries == ()
        assert all(a is b for a, b in zip(self._current(targets), before, strict=True))
        await self.ask("sync", app, "after uninstall?", "s-gone")
        assert await engine.list_turns("s-gone") == []
        assert all(_first_text(r) == SYSTEM_PROMPT for r in openai_server.requests)

    async def test_reinstall_works(
        self, plugin_cls: type[Plugin], engine: ContextEngine, app: Any, openai_server: Any
    ) -> None:
        self.install_plugin(plugin_cls, engine, app).uninstall()
        self.install_plugin(plugin_cls, engine, app)
        await self._mark(engine, "s-again", NOTEBOOK_MARKER)
        await self.ask("sync", app, "installed again?", "s-again")
        assert openai_server.requests
        assert all(NOTEBOOK_MARKER in _first_text(r) for r in openai_server.requests)

    # -- injection and recording ------------------------------------------------------------

    @pytest.mark.parametrize("path", _PATHS)
    async def test_every_model_call_of_a_tool_loop_gets_the_assembled_input(
        self,
        path: str,
        plugin_cls: type[Plugin],
        engine: ContextEngine,
        app: Any,
        openai_server: Any,
    ) -> None:
        self.install_plugin(plugin_cls, engine, app)
        await self._mark(engine, "s-loop", NOTEBOOK_MARKER)
        answer = await self.ask(path, app, "what is in the loop?", "s-loop")
        assert answer == f"answer to {'what is in the loop?'!r} after {TOOL_ROUNDS} tool results"
        requests = openai_server.requests
        assert len(requests) == TOOL_ROUNDS + 1
        for round_, request in enumerate(requests):
            first = _first_text(request)
            assert NOTEBOOK_MARKER in first and SYSTEM_PROMPT in first
            parts = from_openai_messages(request["messages"])
            assert [p.role for p in parts].count(Role.SYSTEM) == 1
            assert_tool_pairs_intact(parts)
            assert sum(p.role is Role.TOOL for p in parts) == round_
        assert len(await engine.list_turns("s-loop")) == len(requests)

    @pytest.mark.parametrize("path", _PATHS)
    async def test_tool_runs_retrieval_usage_and_messages_are_recorded(
        self,
        path: str,
        plugin_cls: type[Plugin],
        engine: ContextEngine,
        app: Any,
        openai_server: Any,
    ) -> None:
        self.install_plugin(plugin_cls, engine, app)
        await self.ask(path, app, "record this", "s-rec")
        doc = await engine.get_session("s-rec")
        requests = openai_server.requests
        asked = [
            call["id"]
            for request in requests[1:]
            for message in request["messages"]
            if message.get("tool_calls")
            for call in message["tool_calls"]
        ]
        records = doc.session.tool_state.tool_calls
        assert [r.tool_call_id for r in records] == list(dict.fromkeys(asked))
        assert len(records) == TOOL_ROUNDS
        for record in records:
            assert record.tool == TOOL_NAME and record.status.value == "success"
            (evidence_id,) = record.result_evidence_ids
            evidence = doc.evidences[evidence_id]
            assert evidence.type is EvidenceType.TOOL_RESULT
            assert evidence.content.startswith("result for record this #")
            assert evidence.links.tool_call_id == record.tool_call_id
        if self.supports_retrieval:
            hits = {
                e.source.uri: e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC
            }
            assert set(hits) == {uri for uri, _, _ in RETRIEVAL_DOCS}
            for uri, content, score in RETRIEVAL_DOCS:
                assert hits[uri].content == content
                assert hits[uri].confidence == pytest.approx(score)
        usage = doc.session.model_usage
        assert len(usage) == len(requests)
        assert all((u.prompt_tokens, u.completion_tokens) == (10, 5) for u in usage)
        assert all(u.provider and u.model for u in usage)
        messages = doc.session.messages
        assert [m.content for m in messages if m.role is Role.USER] == ["record this"]
        final = [m for m in messages if m.role is Role.ASSISTANT][-1]
        assert final.content.startswith("answer to 'record this'")
        assert final.invocation is not None

    async def test_concurrent_sessions_never_see_each_other(
        self, plugin_cls: type[Plugin], engine: ContextEngine, app: Any, openai_server: Any
    ) -> None:
        self.install_plugin(plugin_cls, engine, app)
        await self._mark(engine, "s-a", "MARKER-ALPHA")
        await self._mark(engine, "s-b", "MARKER-BRAVO")
        await asyncio.gather(
            self.ask("async", app, "question alpha", "s-a"),
            self.ask("sync", app, "question bravo", "s-b"),
            self.ask("async", app, "question alpha two", "s-a2"),
        )
        requests = openai_server.requests
        assert len(requests) == 3 * (TOOL_ROUNDS + 1)
        for request in requests:
            text = _request_text(request)
            if "MARKER-ALPHA" in text:
                assert "MARKER-BRAVO" not in text and "bravo" not in text
                assert "alpha two" not in text
            elif "MARKER-BRAVO" in text:
                assert "alpha" not in text
            else:
                assert "question alpha two" in text and "question bravo" not in text

    # -- suppression and failure ------------------------------------------------------------

    async def test_suppressed_calls_pass_through_untouched(
        self, plugin_cls: type[Plugin], engine: ContextEngine, app: Any, openai_server: Any
    ) -> None:
        self.install_plugin(plugin_cls, engine, app)
        await self._mark(engine, "s-quiet", NOTEBOOK_MARKER)
        with suppressed():
            await self.ask("sync", app, "quietly", "s-quiet")
        assert all(_first_text(r) == SYSTEM_PROMPT for r in openai_server.requests)
        assert await engine.list_turns("s-quiet") == []

    @pytest.mark.parametrize("path", _PATHS)
    async def test_an_engine_failure_lets_the_call_through(
        self,
        path: str,
        plugin_cls: type[Plugin],
        engine: ContextEngine,
        app: Any,
        openai_server: Any,
        degraded: list[Event],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        self.install_plugin(plugin_cls, engine, app)
        self._break_prepare_call(engine, monkeypatch)
        answer = await self.ask(path, app, "still works?", "s-open")
        assert answer.startswith("answer to 'still works?'")
        requests = openai_server.requests
        assert len(requests) == TOOL_ROUNDS + 1
        assert all(_first_text(r) == SYSTEM_PROMPT for r in requests)
        failures = [e for e in degraded if e.payload.get("reason") == INTEGRATION_FAILED]
        assert len(failures) >= len(requests)
        assert all("InjectedEngineError" in e.payload["detail"] for e in failures)

    async def test_fail_closed_raises_the_engine_error(
        self,
        plugin_cls: type[Plugin],
        engine: ContextEngine,
        app: Any,
        openai_server: Any,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        self.install_plugin(plugin_cls, engine, app, fail_closed=True)
        self._break_prepare_call(engine, monkeypatch)
        with pytest.raises(Exception) as info:
            await self.ask("sync", app, "must fail", "s-closed")
        chain: list[BaseException] = []
        error: BaseException | None = info.value
        while error is not None and error not in chain:
            chain.append(error)
            error = error.__cause__ or error.__context__
        assert any(isinstance(e, InjectedEngineError) for e in chain)
        assert openai_server.requests == []
