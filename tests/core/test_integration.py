"""ce.core.integration: the plugin kit, proven end to end by a toy framework that runs the
plugin contract suite against the scripted OpenAI server."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.errors import SessionNotFoundError
from ce.core.events import Event
from ce.core.formats import from_openai_messages
from ce.core.integration import (
    INTEGRATION_FAILED,
    AskedToolCalls,
    ModelCall,
    ObjectSessions,
    PatchLedger,
    Plugin,
    PluginVersionError,
    Recorder,
    RetrievalHit,
    Scope,
    ToolRun,
    ToolScopeIds,
    arguments_key,
    assembled_to_openai,
    error_text,
    guarded,
    guarded_sync,
    is_suppressed,
    message_from_openai,
    message_from_part,
    openai_to_messages,
    record_sync,
    requirement_conflicts,
    resolve_scope,
    suppressed,
    tool_call_from_run,
    tool_status,
)
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.schema import (
    AssembledInput,
    Author,
    AuthorKind,
    EvidenceType,
    Message,
    MessagePart,
    ModelInvocation,
    Role,
    ToolCallRequest,
    ToolCallStatus,
)
from ce.core.stores import MemoryStore
from ce.core.testing import PluginContract, ScriptedOpenAIServer
from ce.core.testing.plugin_contract import RETRIEVAL_DOCS, SYSTEM_PROMPT, TOOL_NAME

# == a toy framework ==========================================================================
# An agent with a tool loop over the OpenAI wire (sync, async, streaming), per-thread history,
# a retriever and a callback list: the shapes real frameworks have, in 100 lines.

toy_callbacks: list[Callable[[str, dict[str, Any]], None]] = []
_toy_thread: ContextVar[str | None] = ContextVar("toy_thread", default=None)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    return urllib.request.urlopen(request, timeout=30)


def _fire(event: str, payload: dict[str, Any]) -> None:
    for callback in list(toy_callbacks):
        callback(event, payload)


class ToyBase:
    base_url: str
    model = "toy-model"

    async def _acomplete(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": self.model, "messages": messages, "tools": TOOLS}
        response = await asyncio.to_thread(_post, self.base_url + "/chat/completions", body)
        return dict(json.loads(response.read()))


class ToyAgent(ToyBase):
    """``chat`` / ``achat`` / ``stream`` run retrieval then the tool loop; ``_complete``,
    ``_acomplete`` (inherited) and ``_stream_complete`` are the model calls."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.histories: dict[str, list[dict[str, Any]]] = {}

    def _complete(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": self.model, "messages": messages, "tools": TOOLS}
        with _post(self.base_url + "/chat/completions", body) as response:
            return dict(json.loads(response.read()))

    def _stream_complete(self, messages: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        body = {
            "model": self.model,
            "messages": messages,
            "tools": TOOLS,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with _post(self.base_url + "/chat/completions", body) as response:
            for line in response:
                data = line.decode().strip()
                if data.startswith("data: ") and data != "data: [DONE]":
                    yield json.loads(data[len("data: ") :])

    def _retrieve(self, query: str) -> None:
        hits = [{"uri": u, "content": c, "score": s} for u, c, s in RETRIEVAL_DOCS]
        _fire("retrieved", {"query": query, "hits": hits})

    def _run_tool(self, call: dict[str, Any]) -> dict[str, Any]:
        started = time.time()
        args = json.loads(call["function"]["arguments"])
        result = f"result for {args['q']}"
        _fire(
            "tool_end", {"call": call, "result": result, "started": started, "ended": time.time()}
        )
        return {"role": "tool", "tool_call_id": call["id"], "content": result}

    def _begin(self, text: str, thread: str) -> list[dict[str, Any]]:
        history = self.histories.setdefault(thread, [{"role": "system", "content": SYSTEM_PROMPT}])
        history.append({"role": "user", "content": text})
        self._retrieve(text)
        return history

    def _step(self, history: list[dict[str, Any]], reply: dict[str, Any]) -> str | None:
        history.append(reply)
        if not reply.get("tool_calls"):
            return str(reply["content"])
        history.extend(self._run_tool(call) for call in reply["tool_calls"])
        return None

    def chat(self, text: str, thread: str) -> str:
        token = _toy_thread.set(thread)
        try:
            history = self._begin(text, thread)
            while True:
                reply = self._complete(list(history))["choices"][0]["message"]
                if (answer := self._step(history, reply)) is not None:
                    return answer
        finally:
            _toy_thread.reset(token)

    async def achat(self, text: str, thread: str) -> str:
        token = _toy_thread.set(thread)
        try:
            history = self._begin(text, thread)
            while True:
                reply = (await self._acomplete(list(history)))["choices"][0]["message"]
                if (answer := self._step(history, reply)) is not None:
                    return answer
        finally:
            _toy_thread.reset(token)

    def stream(self, text: str, thread: str) -> Iterator[str]:
        token = _toy_thread.set(thread)
        try:
            history = self._begin(text, thread)
            while True:
                reply = _merge_chunks(self._stream_complete(list(history)))
                if reply.get("content") and not reply.get("tool_calls"):
                    yield from _chunked(reply["content"])
                if self._step(history, reply) is not None:
                    return
        finally:
            _toy_thread.reset(token)


def _chunked(text: str) -> Iterator[str]:
    yield from (text[i : i + 5] for i in range(0, len(text), 5))


def _merge_chunks(chunks: Iterator[dict[str, Any]]) -> dict[str, Any]:
    content = ""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for call in delta.get("tool_calls", ()):
                slot = calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.get("id", "")
                slot["name"] += call["function"].get("name", "")
                slot["arguments"] += call["function"].get("arguments", "")
    tool_calls = [
        {
            "id": s["id"],
            "type": "function",
            "function": {"name": s["name"], "arguments": s["arguments"]},
        }
        for _, s in sorted(calls.items())
    ]
    return {
        "role": "assistant",
        "content": content or None,
        **({"tool_calls": tool_calls} if tool_calls else {}),
    }


# == a plugin for it, built on the kit ========================================================


def _model_call(response_id: str, model: str, usage: Any, text: str, started: float) -> ModelCall:
    usage = usage or {}
    return ModelCall(
        call_id=response_id,
        provider="openai",
        model=model,
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        latency_ms=round((time.perf_counter() - started) * 1000),
        output_text=text,
    )


async def _record_reply(
    engine: ContextEngine, session_id: str, call: ModelCall, reply: dict[str, Any]
) -> None:
    await Recorder(engine, session_id).record_model_call(call)
    message = message_from_openai(reply).model_copy(
        update={"invocation": ModelInvocation(provider=call.provider, model=call.model)}
    )
    await engine.commit_assistant_message(session_id, message)


class ToyPlugin(Plugin):
    name = "toy"
    requirements = ("pytest >= 7",)

    def _install(self, **options: Any) -> None:
        # the toy has no hook for its model calls: patch them (the ledger restores them)
        self.ledger.wrap(ToyAgent, "_complete", self._sync_hook)
        self.ledger.wrap(ToyAgent, "_acomplete", self._async_hook)
        self.ledger.wrap(ToyAgent, "_stream_complete", self._stream_hook)
        toy_callbacks.append(self._on_event)
        self.ledger.register(lambda: toy_callbacks.remove(self._on_event), "toy callback")

    def _session(self) -> str:
        return resolve_scope(self, run_id="toy", framework=_toy_thread.get()).session_id

    def _prepare_sync(self, sid: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        engine = self.engine

        def prepare() -> list[dict[str, Any]]:
            pending = openai_to_messages(messages)
            result = engine.sync.prepare_call(sid, pending, self.config, TOOLS)
            return assembled_to_openai(result.assembled_input)

        sent = guarded_sync(self, prepare, session_id=sid, what="prepare_call")
        return messages if sent is None else sent

    def _record_sync(self, sid: str, call: ModelCall, reply: dict[str, Any]) -> None:
        engine = self.engine
        guarded_sync(
            self,
            lambda: engine.sync.run(_record_reply(engine, sid, call, reply)),
            session_id=sid,
            what="record model call",
        )

    def _sync_hook(self, original: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
        def _complete(agent: ToyAgent, messages: list[dict[str, Any]]) -> dict[str, Any]:
            if is_suppressed():
                return original(agent, messages)
            sid = self._session()
            sent = self._prepare_sync(sid, messages)
            started = time.perf_counter()
            response = original(agent, sent)
            reply = response["choices"][0]["message"]
            call = _model_call(
                response["id"],
                response["model"],
                response["usage"],
                reply["content"] or "",
                started,
            )
            self._record_sync(sid, call, reply)
            return response

        return _complete

    def _async_hook(self, original: Callable[..., Any]) -> Callable[..., Any]:
        async def _acomplete(agent: ToyAgent, messages: list[dict[str, Any]]) -> dict[str, Any]:
            if is_suppressed():
                return dict(await original(agent, messages))
            sid, engine = self._session(), self.engine

            async def prepare() -> list[dict[str, Any]]:
                pending = openai_to_messages(messages)
                result = await engine.prepare_call(sid, pending, self.config, TOOLS)
                return assembled_to_openai(result.assembled_input)

            sent = await guarded(self, prepare, session_id=sid, what="prepare_call")
            started = time.perf_counter()
            response = dict(await original(agent, messages if sent is None else sent))
            reply = response["choices"][0]["message"]
            call = _model_call(
                response["id"],
                response["model"],
                response["usage"],
                reply["content"] or "",
                started,
            )
            await guarded(
                self,
                lambda: _record_reply(engine, sid, call, reply),
                session_id=sid,
                what="record model call",
            )
            return response

        return _acomplete

    def _stream_hook(self, original: Callable[..., Iterator[dict[str, Any]]]) -> Callable[..., Any]:
        def _stream_complete(
            agent: ToyAgent, messages: list[dict[str, Any]]
        ) -> Iterator[dict[str, Any]]:
            if is_suppressed():
                yield from original(agent, messages)
                return
            sid = self._session()
            sent = self._prepare_sync(sid, messages)
            started = time.perf_counter()
            chunks = []
            for chunk in original(agent, sent):
                chunks.append(chunk)
                yield chunk
            reply = _merge_chunks(iter(chunks))
            usage = next((c["usage"] for c in chunks if c.get("usage")), None)
            call = _model_call(
                chunks[0]["id"], chunks[0]["model"], usage, reply.get("content") or "", started
            )
            self._record_sync(sid, call, reply)

        return _stream_complete

    def _on_event(self, event: str, payload: dict[str, Any]) -> None:
        if is_suppressed():
            return
        sid, engine = self._session(), self.engine
        recorder = Recorder(engine, sid)
        if event == "tool_end":
            call = payload["call"]
            run = ToolRun(
                tool_call_id=call["id"],
                name=call["function"]["name"],
                args=call["function"]["arguments"],
                result=payload["result"],
                error=None,
                started_at=payload["started"],
                ended_at=payload["ended"],
                provider_name="toy",
            )
            guarded_sync(
                self,
                lambda: engine.sync.run(recorder.record_tool_run(run)),
                session_id=sid,
                what="record tool run",
            )
        elif event == "retrieved":
            hits = [RetrievalHit(h["content"], h["uri"], h["score"]) for h in payload["hits"]]
            guarded_sync(
                self,
                lambda: engine.sync.run(recorder.record_retrieval(hits)),
                session_id=sid,
                what="record retrieval",
            )


def make_engine(**kwargs: Any) -> ContextEngine:
    kwargs.setdefault("config", RuntimeConfig(model_hint="gpt-4o"))
    return ContextEngine(
        MemoryStore(), clock=SteppingClock(), id_generator=SequentialIdGenerator("id"), **kwargs
    )


class TestToyPluginContract(PluginContract):
    @pytest.fixture
    def plugin_cls(self) -> type[Plugin]:
        return ToyPlugin

    @pytest.fixture
    async def engine(self) -> AsyncIterator[ContextEngine]:
        engine = make_engine()
        yield engine
        await engine.close()

    @pytest.fixture
    def make_app(self) -> Callable[[ScriptedOpenAIServer], ToyAgent]:
        return lambda server: ToyAgent(server.base_url)

    def run_sync(self, app: ToyAgent, text: str, session_id: str) -> str:
        return app.chat(text, session_id)

    async def run_async(self, app: ToyAgent, text: str, session_id: str) -> str:
        return await app.achat(text, session_id)

    def run_stream(self, app: ToyAgent, text: str, session_id: str) -> str:
        return "".join(app.stream(text, session_id))

    def patched_targets(self) -> list[tuple[Any, str]]:
        return [(ToyAgent, "_complete"), (ToyAgent, "_acomplete"), (ToyAgent, "_stream_complete")]


# == PatchLedger ==============================================================================


class Base:
    def inherited(self) -> str:
        return "base"

    @staticmethod
    def static() -> str:
        return "static"


class Child(Base):
    def own(self) -> str:
        return "own"


def _wrapper(original: Callable[..., str]) -> Callable[..., str]:
    def replacement(*args: Any) -> str:
        return "wrapped " + original(*args)

    return replacement


def test_ledger_restores_own_and_inherited_methods_exactly() -> None:
    own, inherited = Child.__dict__["own"], Base.__dict__["inherited"]
    ledger = PatchLedger()
    assert ledger.wrap(Child, "own", _wrapper) is own
    assert ledger.wrap(Child, "inherited", _wrapper) is inherited
    assert (Child().own(), Child().inherited(), Base().inherited()) == (
        "wrapped own",
        "wrapped base",
        "base",
    )
    assert [e.what for e in ledger.entries] == ["wrap Child.own", "wrap Child.inherited"]
    ledger.undo()
    assert Child.__dict__["own"] is own and Child.own is own
    assert "inherited" not in Child.__dict__ and Child.inherited is inherited
    assert ledger.entries == ()
    # after an undo the same attribute can be wrapped again
    ledger.wrap(Child, "own", _wrapper)
    ledger.undo()
    assert Child.own is own


def test_ledger_restores_the_raw_descriptor_modules_and_instances() -> None:
    static = Base.__dict__["static"]
    ledger = PatchLedger()
    ledger.wrap(Base, "static", lambda original: staticmethod(_wrapper(original)))
    assert Base.static() == "wrapped static"
    ledger.wrap(json, "dumps", lambda original: lambda *a, **k: "patched")
    child = Child()
    ledger.wrap(child, "own", _wrapper)
    assert (json.dumps({}), child.own(), Child().own()) == ("patched", "wrapped own", "own")
    ledger.undo()
    assert Base.__dict__["static"] is static
    assert json.dumps({}) == "{}"
    assert "own" not in vars(child)


def test_ledger_refuses_to_wrap_twice_and_missing_attributes() -> None:
    ledger = PatchLedger()
    ledger.wrap(Child, "own", _wrapper)
    try:
        with pytest.raises(ValueError, match="already wrapped"):
            ledger.wrap(Child, "own", _wrapper)
        with pytest.raises(AttributeError):
            ledger.wrap(Child, "missing", _wrapper)
    finally:
        ledger.undo()
    assert len(ledger.entries) == 0


def test_ledger_undoes_in_reverse_and_finishes_despite_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: list[str] = []
    ledger = PatchLedger()
    ledger.register(lambda: done.append("first"), "first")

    def fail() -> None:
        raise RuntimeError("undo failed")

    ledger.register(fail, "failing")
    ledger.register(lambda: done.append("third"), "third")
    with pytest.raises(RuntimeError, match="undo failed"):
        ledger.undo()
    assert done == ["third", "first"]
    assert ledger.entries == ()
    assert "undoing failing failed" in caplog.text


def test_ledger_warns_when_someone_else_replaced_the_wrap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    own = Child.__dict__["own"]
    ledger = PatchLedger()
    ledger.wrap(Child, "own", _wrapper)
    Child.own = lambda self: "other"  # type: ignore[method-assign]
    ledger.undo()
    assert Child.own is own
    assert "replaced by someone else" in caplog.text


def test_ledger_wraps_classmethods_without_a_false_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Owner:
        @classmethod
        def make(cls) -> str:
            return "original"

    original = Owner.__dict__["make"]
    ledger = PatchLedger()
    ledger.wrap(Owner, "make", lambda before: classmethod(lambda cls: "wrapped"))
    assert Owner.make() == "wrapped"
    ledger.undo()
    assert Owner.__dict__["make"] is original and Owner.make() == "original"
    assert "replaced by someone else" not in caplog.text


# == Plugin ===================================================================================


class RecordingPlugin(Plugin):
    name = "recording"

    def _install(self, **options: Any) -> None:
        self.ledger.wrap(Child, "own", _wrapper)
        if options.get("explode"):
            raise RuntimeError("install failed")


class FuturePlugin(Plugin):
    name = "future"
    requirements = ("pytest >= 999", "surely-not-a-package-ce >= 1")

    def _install(self, **options: Any) -> None:
        raise AssertionError("never reached")


@pytest.fixture
def engine() -> Iterator[ContextEngine]:
    engine = make_engine()
    yield engine
    for plugin in (RecordingPlugin(), ToyPlugin()):
        if plugin.installed:
            plugin.uninstall()
    engine.sync.close()


def test_one_instance_per_plugin_class() -> None:
    assert RecordingPlugin() is RecordingPlugin()
    assert ToyPlugin() is ToyPlugin()
    assert len({id(RecordingPlugin()), id(ToyPlugin())}) == 2


def test_install_stores_its_settings_and_uninstall_undoes_the_ledger(
    engine: ContextEngine,
) -> None:
    own = Child.__dict__["own"]
    config = RuntimeConfig(model_hint="gpt-4o-mini")
    plugin = RecordingPlugin().install(
        engine, session_id="s0", config=config, mode="augment", fail_closed=True, extra=1
    )
    assert plugin.installed and plugin.engine is engine
    assert (plugin.session_id, plugin.config, plugin.mode, plugin.fail_closed) == (
        "s0",
        config,
        "augment",
        True,
    )
    assert plugin.options == {"extra": 1}
    assert Child().own() == "wrapped own"
    plugin.uninstall()
    assert not plugin.installed and Child.own is own
    with pytest.raises(RuntimeError, match="not installed"):
        _ = plugin.engine


def test_install_loads_the_tokenizer_of_the_hooks_model(engine: ContextEngine) -> None:
    # not in the first model call, which may run on an event loop every request waits on
    asked: list[str | None] = []
    estimate = engine.estimator.estimate_text

    def recording(text: str, model_hint: str | None = None) -> int:
        asked.append(model_hint)
        return estimate(text, model_hint)

    engine.estimator.estimate_text = recording  # type: ignore[method-assign]
    RecordingPlugin().install(engine, config=RuntimeConfig(model_hint="gpt-4o-mini"))
    assert asked == ["gpt-4o-mini"]


def test_repeated_install_and_uninstall_are_logged_no_ops(
    engine: ContextEngine, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = RecordingPlugin().install(engine)
    entries = plugin.ledger.entries
    with caplog.at_level(logging.WARNING, logger="ce.core.integration"):
        assert RecordingPlugin().install(make_engine()) is plugin
    assert plugin.engine is engine and plugin.ledger.entries == entries
    assert "already installed" in caplog.text
    plugin.uninstall()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ce.core.integration"):
        plugin.uninstall()
    assert "not installed; uninstall() does nothing" in caplog.text


def test_a_failing_install_is_rolled_back(engine: ContextEngine) -> None:
    own = Child.__dict__["own"]
    with pytest.raises(RuntimeError, match="install failed"):
        RecordingPlugin().install(engine, explode=True)
    assert not RecordingPlugin().installed
    assert Child.own is own and RecordingPlugin().ledger.entries == ()


def test_install_rejects_an_unknown_mode(engine: ContextEngine) -> None:
    with pytest.raises(ValueError, match="mode"):
        RecordingPlugin().install(engine, mode="merge")  # type: ignore[arg-type]


def test_install_without_an_engine_creates_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CE_STORE_URL", "memory://")
    plugin = RecordingPlugin().install()
    try:
        assert isinstance(plugin.engine, ContextEngine)
    finally:
        plugin.uninstall()


def test_version_conflicts_are_logged_or_raised(
    engine: ContextEngine, caplog: pytest.LogCaptureFixture
) -> None:
    conflicts = requirement_conflicts(FuturePlugin.requirements)
    assert len(conflicts) == 2
    assert "pytest" in conflicts[0] and "is installed, needs" in conflicts[0]
    assert "surely-not-a-package-ce is not installed" in conflicts[1]
    with caplog.at_level(logging.ERROR, logger="ce.core.integration"):
        assert not FuturePlugin().install(engine).installed
    assert "not installed: pytest" in caplog.text
    with pytest.raises(PluginVersionError, match="surely-not-a-package-ce"):
        FuturePlugin().install(engine, strict=True)
    assert not FuturePlugin().installed


def test_requirement_markers_and_invalid_requirements() -> None:
    assert requirement_conflicts(("pytest >= 7", 'nothing-here-ce; python_version < "3"')) == []
    (conflict,) = requirement_conflicts(("not a requirement!!",))
    assert conflict.startswith("invalid requirement")


# == suppression, guard, sessions =============================================================


async def test_suppression_nests_and_follows_the_context() -> None:
    assert not is_suppressed()
    with suppressed():
        assert is_suppressed()
        with suppressed():
            assert is_suppressed()
        assert is_suppressed()
        assert await asyncio.to_thread(is_suppressed)
    assert not is_suppressed()
    assert not await asyncio.to_thread(is_suppressed)


def _collect(engine: ContextEngine) -> list[Event]:
    events: list[Event] = []
    engine.events.on("Degraded", events.append)
    return events


async def test_guard_fails_open_with_a_degraded_event(engine: ContextEngine) -> None:
    plugin = RecordingPlugin().install(engine)
    events = _collect(engine)

    async def ok() -> int:
        return 7

    async def broken() -> int:
        raise KeyError("boom")

    assert await guarded(plugin, ok, session_id="s1", what="prepare_call") == 7
    assert await guarded(plugin, broken, session_id="s1", what="prepare_call") is None
    (event,) = events
    assert (event.event_type, event.session_id) == ("Degraded", "s1")
    assert event.payload == {
        "reason": INTEGRATION_FAILED,
        "detail": "prepare_call: KeyError: 'boom'",
    }
    assert event.tags == {"plugin": "recording"}


async def test_guard_sync_twin_works_inside_a_running_loop(engine: ContextEngine) -> None:
    plugin = RecordingPlugin().install(engine)
    events = _collect(engine)

    def broken() -> int:
        raise ValueError("nope")

    assert guarded_sync(plugin, lambda: 3, session_id="s1", what="x") == 3
    assert guarded_sync(plugin, broken, session_id="s1", what="record") is None
    assert [e.payload["detail"] for e in events] == ["record: ValueError: nope"]


async def test_fail_closed_reraises_the_engine_error(engine: ContextEngine) -> None:
    plugin = RecordingPlugin().install(engine, fail_closed=True)
    events = _collect(engine)

    async def broken() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        await guarded(plugin, broken, session_id="s1", what="prepare_call")
    with pytest.raises(KeyError):
        guarded_sync(plugin, lambda: dict[str, int]()["k"], session_id="s1", what="prepare_call")
    assert events == []


def test_the_guard_never_catches_base_exceptions(engine: ContextEngine) -> None:
    plugin = RecordingPlugin().install(engine)

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        guarded_sync(plugin, interrupted, session_id="s1", what="x")


def test_a_guarded_hook_after_uninstall_stays_silent(engine: ContextEngine) -> None:
    plugin = RecordingPlugin().install(engine)
    plugin.uninstall()
    # a hook still running after uninstall: its engine call fails, the user's call goes on
    assert guarded_sync(plugin, lambda: plugin.engine, session_id="s1", what="late") is None


def test_record_sync_on_an_event_loop_never_calls_the_engine_from_the_hook(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = RecordingPlugin().install(engine)

    class NoBlocking:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"engine.sync.{name} called from a hook on the loop")

    monkeypatch.setattr(engine, "sync", NoBlocking())

    async def app() -> None:
        # hooks running on the loop's thread queue their records and return at once ...
        for n in range(3):
            hit = RetrievalHit(content=f"hit {n}", uri=f"doc://{n}", score=0.1)
            record_sync(plugin, "s-o", "record retrieval", lambda r, h=hit: r.record_retrieval([h]))
        # ... the session's next engine call (or a task on the loop) writes them, in order
        await engine.prepare_turn("s-o", "next question")
        doc = await engine.store.get_session("s-o")
        assert doc is not None
        assert [e.content for e in doc.evidences.values()] == ["hit 0", "hit 1", "hit 2"]
        record_sync(plugin, "s-t", "record retrieval", lambda r: r.record_retrieval([hit]))
        # without any engine call of the app: a task on the loop writes it
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others
        await asyncio.gather(*others)
        assert await engine.store.get_session("s-t") is not None

    asyncio.run(app())
    monkeypatch.undo()
    plugin.uninstall()


def test_record_sync_writes_from_blocking_hooks_and_fails_open(engine: ContextEngine) -> None:
    plugin = RecordingPlugin().install(engine)
    events = _collect(engine)
    hit = RetrievalHit(content="a recorded hit", uri="doc://one", score=0.5)
    record_sync(plugin, "s-rec", "record retrieval", lambda r: r.record_retrieval([hit]))
    doc = engine.sync.get_session("s-rec")
    assert [e.content for e in doc.evidences.values()] == ["a recorded hit"]

    async def broken(recorder: Recorder) -> None:
        raise KeyError(recorder.session_id)

    record_sync(plugin, "s-rec", "record tool run", broken)
    assert [e.payload["detail"] for e in events] == ["record tool run: KeyError: 's-rec'"]
    plugin.uninstall()
    record_sync(plugin, "s-late", "record retrieval", lambda r: r.record_retrieval([hit]))
    with pytest.raises(SessionNotFoundError):  # nothing was written after uninstall
        engine.sync.get_session("s-late")


def test_session_resolution_order(engine: ContextEngine) -> None:
    plugin = RecordingPlugin().install(engine)

    def sid(**kwargs: Any) -> str:
        return resolve_scope(plugin, run_id="r1", **kwargs).session_id

    # nothing named: the call's own run, never a shared "default"
    assert resolve_scope(plugin, run_id="r1") == Scope("run:r1", "run")
    assert sid(framework="") == sid(explicit="") == "run:r1"
    plugin.session_id = "installed"
    assert sid() == "installed"
    assert sid(framework="thread-1") == "thread-1"
    assert sid(framework=7) == "7"
    assert sid(framework=True) == "installed"  # not an id
    with engine.session("scoped"):
        assert sid() == "scoped"
        assert sid(framework="thread-1") == "scoped"
        assert sid(explicit="named", framework="thread-1") == "named"
        # a session the call's flow inherited from the code that started it does not count
        assert sid(framework="thread-1", inherited="scoped") == "thread-1"
        assert sid(inherited="scoped") == "installed"
        assert sid(inherited="other") == "scoped"


def test_nested_calls_get_a_child_scope(engine: ContextEngine) -> None:
    plugin = RecordingPlugin().install(engine)
    outer = resolve_scope(plugin, run_id="r1", explicit="alice", framework="t-1")
    assert outer == Scope("alice", "explicit")
    # inherited names (the outer run's metadata, thread id, engine.session) do not count
    inner = resolve_scope(
        plugin, run_id="r1", explicit="alice", framework="t-1", parent=outer, parent_call_id="c1"
    )
    assert inner == Scope("alice/c1", "nested", ("alice",), "alice", "c1")
    assert inner.nested and not outer.nested
    deeper = resolve_scope(plugin, run_id="r1", explicit="alice", parent=inner, parent_call_id="c2")
    assert deeper.session_id == "alice/c1/c2"
    assert deeper.lineage == ("alice", "alice/c1")
    with engine.session("alice"):
        assert resolve_scope(plugin, run_id="r1", parent=outer, parent_call_id="c1") == inner
    # a session the nested call names itself wins
    own = resolve_scope(plugin, run_id="r1", explicit="helper", parent=outer, parent_call_id="c1")
    assert own == Scope("helper", "explicit")
    with engine.session("helper-2"):
        assert resolve_scope(plugin, run_id="r1", parent=outer).session_id == "helper-2"
    # without a call id the child is named after the run
    assert resolve_scope(plugin, run_id="r9", parent=outer).session_id == "alice/r9"


# == mappers and the Recorder =================================================================


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (None, ToolCallStatus.SUCCESS),
        ("TimeoutError: too slow", ToolCallStatus.TIMEOUT),
        ("the call timed out", ToolCallStatus.TIMEOUT),
        ("PermissionError: no", ToolCallStatus.FORBIDDEN),
        ("FileNotFoundError: x", ToolCallStatus.NOT_FOUND),
        ("ValueError: bad", ToolCallStatus.ERROR),
    ],
)
def test_tool_status_from_the_error_text(error: str | None, status: ToolCallStatus) -> None:
    assert tool_status(error) is status


def run(call_id: str = "c1", **kwargs: Any) -> ToolRun:
    fields: dict[str, Any] = {
        "tool_call_id": call_id,
        "name": "lookup",
        "args": '{"q": "x"}',
        "result": "found x",
        "error": None,
        "started_at": 1_700_000_000.0,
        "ended_at": 1_700_000_000.25,
    }
    return ToolRun(**{**fields, **kwargs})


def test_tool_call_from_a_run() -> None:
    record = tool_call_from_run(run(args={"q": "x", "blob": "y" * 5000}), ["ev1"])
    assert (record.tool_call_id, record.tool, record.status) == (
        "c1",
        "lookup",
        ToolCallStatus.SUCCESS,
    )
    assert record.duration_ms == 250
    assert record.called_at.startswith("2023-11-14T22:13:20")
    assert record.args_digest == {"q": "x", "blob": "<5000 chars>"}
    assert record.result_evidence_ids == ["ev1"]
    assert tool_call_from_run(run(args="not json")).args_digest == {"raw": "not json"}
    failed = tool_call_from_run(run(result=None, error=error_text(TimeoutError("slow"))))
    assert failed.status is ToolCallStatus.TIMEOUT


async def test_recorder_writes_tool_runs_idempotently() -> None:
    engine = make_engine()
    recorder = Recorder(engine, "s1")
    first = await recorder.record_tool_run(run())
    again = await recorder.record_tool_run(run())
    await recorder.record_tool_run(run("c2", result=None, error="ValueError: bad"))
    doc = await engine.get_session("s1")
    assert again.evidence_id == first.evidence_id
    records = doc.session.tool_state.tool_calls
    assert [(r.tool_call_id, r.status.value) for r in records] == [
        ("c1", "success"),
        ("c2", "error"),
    ]
    assert records[0].result_evidence_ids == [first.evidence_id]
    evidence = doc.evidences[first.evidence_id]
    assert (evidence.type, evidence.content) == (EvidenceType.TOOL_RESULT, "found x")
    assert evidence.links.tool_call_id == "c1"
    assert doc.evidences[records[1].result_evidence_ids[0]].content == "ValueError: bad"


async def test_recorder_writes_retrieval_hits_with_confidence_and_dedup() -> None:
    engine = make_engine()
    recorder = Recorder(engine, "s1")
    hits = [
        RetrievalHit("alpha text", "doc://a", 0.8, doc_id="a", doc_version="3", metadata={"k": 1}),
        RetrievalHit("gamma text", "doc://c", None),
    ]
    stored = await recorder.record_retrieval(hits, tool_call_id="c9")
    assert [e.evidence_id for e in await recorder.record_retrieval(hits)] == [
        e.evidence_id for e in stored
    ]
    (raw,) = await recorder.record_retrieval([RetrievalHit("beta text", "doc://b", 1.7)])
    doc = await engine.get_session("s1")
    assert len(doc.evidences) == 3
    alpha, beta = doc.evidences[stored[0].evidence_id], doc.evidences[raw.evidence_id]
    assert (alpha.type, alpha.source.uri, alpha.confidence) == (
        EvidenceType.RAG_DOC,
        "doc://a",
        0.8,
    )
    assert {k: alpha.metadata[k] for k in ("doc_id", "doc_version", "score", "k")} == {
        "doc_id": "a",
        "doc_version": "3",
        "score": 0.8,
        "k": 1,
    }
    assert alpha.links.tool_call_id == "c9"
    # a score outside [0, 1] (BM25, a distance) ranks; it is no confidence
    assert (beta.confidence, beta.metadata["score"]) == (None, 1.7)


async def test_recorder_writes_model_calls_with_their_output() -> None:
    engine = make_engine()
    recorder = Recorder(engine, "s1")
    call = ModelCall(
        "run-1",
        "openai",
        "gpt-4o",
        prompt_tokens=12,
        completion_tokens=3,
        latency_ms=40,
        first_token_latency_ms=9,
        output_text="hello",
        params={"temperature": 0.2},
    )
    usage = await recorder.record_model_call(call)
    await recorder.record_model_call(call)
    await recorder.record_model_call(ModelCall("run-2", "openai", "gpt-4o", error="RateLimit"))
    doc = await engine.get_session("s1")
    first, failed = doc.session.model_usage
    assert first == usage
    assert (first.total_tokens, first.latency_ms, first.first_token_latency_ms) == (15, 40, 9)
    assert first.params == {"temperature": 0.2}
    assert (failed.status.value, failed.error) == ("error", "RateLimit")
    (output,) = doc.evidences.values()
    assert (output.type, output.content) == (EvidenceType.LLM_OUTPUT, "hello")
    assert output.links.model_usage_id == "run-1"


# == conversion ===============================================================================

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "find x", "name": "ana"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"q":"x"}'},
            },
            {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "x is 1"},
    {"role": "tool", "tool_call_id": "c2", "content": "nothing"},
    {"role": "assistant", "content": "x is 1"},
]


def test_openai_dicts_to_messages() -> None:
    messages = openai_to_messages(
        [
            *CONVERSATION,
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    )
    assert [m.role for m in messages] == [
        Role.SYSTEM,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.TOOL,
        Role.ASSISTANT,
        Role.USER,
    ]
    calls = messages[2].tool_calls or []
    assert [(c.tool_call_id, c.arguments) for c in calls] == [("c1", {"q": "x"}), ("c2", {})]
    assert (messages[3].tool_call_id, messages[3].name) == ("c1", "lookup")
    assert messages[1].name == "ana"
    assert messages[-1].content == "a\nb"
    assert all(m.invocation is None for m in messages)
    with pytest.raises(ValueError, match="role"):
        openai_to_messages([{"role": "robot", "content": "?"}])


def test_assembled_input_round_trips_through_openai_dicts() -> None:
    messages = openai_to_messages(CONVERSATION)
    parts = [
        MessagePart(
            role=m.role,
            content=m.content,
            tool_calls=m.tool_calls,
            tool_call_id=m.tool_call_id,
            name=m.name if m.role is not Role.TOOL else None,
        )
        for m in messages
    ]
    assert assembled_to_openai(AssembledInput(parts=parts, total_tokens=0)) == CONVERSATION


def test_message_from_openai_carries_the_author() -> None:
    author = Author(kind=AuthorKind.AGENT, id="planner")
    message = message_from_openai({"role": "assistant", "content": "plan"}, author=author)
    assert message == Message(role=Role.ASSISTANT, content="plan", author=author)
    call = ToolCallRequest(tool_call_id="c1", name="f", raw_arguments="{}", arguments={})
    reply = message_from_openai(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        }
    )
    assert reply.tool_calls == [call] and reply.content == ""


def test_deferred_records_are_written_when_the_process_exits(tmp_path: Any) -> None:
    import subprocess
    import sys
    import textwrap

    from ce.core.stores import SQLiteStore

    path = tmp_path / "s.db"
    script = textwrap.dedent(
        f"""
        from ce.core import ContextEngine, EvidenceSource, EvidenceType, SourceKind
        from ce.core.stores import SQLiteStore

        engine = ContextEngine(SQLiteStore({str(path)!r}))
        source = EvidenceSource(kind=SourceKind.TOOL, name="t")
        kind = EvidenceType.TOOL_RESULT
        engine.defer("s", lambda: engine.ingest_evidence("s", "kept at exit", source, kind))
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    doc = asyncio.run(SQLiteStore(str(path)).get_session("s"))
    assert doc is not None
    assert [e.content for e in doc.evidences.values()] == ["kept at exit"]


def test_openai_to_messages_converts_each_message_once() -> None:
    history = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q1"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "k1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
    ]
    first = openai_to_messages(history)
    again = openai_to_messages([*history, {"role": "tool", "tool_call_id": "k1", "content": "r"}])
    assert all(a is b for a, b in zip(first, again, strict=False))  # converted once
    assert again[-1].role is Role.TOOL and again[-1].name == "f"  # named after its call
    assert again == openai_to_messages(
        [dict(m) for m in [*history, {"role": "tool", "tool_call_id": "k1", "content": "r"}]]
    )
    with pytest.raises(ValueError, match=r"messages\[3\]"):
        openai_to_messages([*history, {"role": "robot", "content": "x"}])


def test_a_deferred_record_cancelled_midway_runs_again_once(engine: ContextEngine) -> None:
    """An event loop that shuts down while its flush task is inside a write (asyncio.run
    cancels it) puts the write back; it runs later, and records are idempotent."""
    plugin = RecordingPlugin().install(engine)
    calls: list[int] = []
    reply = message_from_openai({"role": "assistant", "content": "the answer"}).model_copy(
        update={"invocation": ModelInvocation(provider="p", model="m")}
    )
    model_call = ModelCall(call_id="run-1", provider="p", model="m")

    async def work() -> None:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.Event().wait()  # the loop shuts down meanwhile
        await Recorder(engine, "s-c").record_model_call(model_call, reply)

    async def app() -> None:
        engine.defer("s-c", work)
        asyncio.get_running_loop().create_task(engine.flush("s-c"))
        await asyncio.sleep(0)  # the flush task starts and waits inside the write

    asyncio.run(app())
    assert len(calls) == 1
    # the same record written twice (a retry) is stored once
    engine.defer("s-c", work)
    doc = engine.sync.get_session("s-c")
    assert len(calls) == 3
    assert [m.content for m in doc.session.messages] == ["the answer"]
    assert len(doc.session.model_usage) == 1
    plugin.uninstall()


def test_ledger_replace_puts_back_the_very_object_the_class_held() -> None:
    """``replace`` sets what the class holds (a classmethod object, not the bound method
    ``getattr`` returns) and undo restores that very object, or deletes an attribute the
    class only inherited."""

    class Base:
        @classmethod
        def make(cls) -> str:
            return "base"

    class Child(Base):
        @classmethod
        def build(cls) -> str:
            return "child"

    held = vars(Child)["build"]
    ledger = PatchLedger()
    ledger.replace(Child, "build", classmethod(lambda cls: "patched"))
    ledger.replace(Child, "make", classmethod(lambda cls: "patched make"))
    assert Child.build() == "patched" and Child.make() == "patched make"
    ledger.undo()
    assert vars(Child)["build"] is held and "make" not in vars(Child)
    assert Child.build() == "child" and Child.make() == "base"


def test_ledger_for_subclasses_reaches_classes_made_before_and_after_until_undo() -> None:
    class Base:
        made: list[str] = []

        def __init_subclass__(cls, **kwargs: Any) -> None:
            super().__init_subclass__(**kwargs)
            Base.made.append(cls.__name__)

    class Before(Base):
        pass

    seen: list[str] = []
    held = vars(Base)["__init_subclass__"]
    ledger = PatchLedger()
    ledger.for_subclasses(Base, lambda cls: seen.append(cls.__name__))

    class After(Before):
        pass

    assert seen == ["Before", "After"] and Base.made == ["Before", "After"]  # own hook kept
    ledger.undo()
    assert vars(Base)["__init_subclass__"] is held

    class Later(Base):
        pass

    assert seen == ["Before", "After"] and Base.made[-1] == "Later"


def test_tool_scope_ids_name_each_run_of_a_reused_call_id_apart() -> None:
    ids = ToolScopeIds(sessions=2)
    assert [ids.take("s", "call_0") for _ in range(3)] == ["call_0", "call_0~2", "call_0~3"]
    assert ids.take("t", "call_0") == "call_0"  # per session
    ids.take("u", "x")  # a third session: the least recently used one ("s") is forgotten
    assert ids.take("s", "call_0") == "call_0"
    ids.clear()
    assert ids.take("t", "call_0") == "call_0"


async def test_tool_scope_ids_of_a_new_process_know_the_runs_the_session_holds() -> None:
    """A process that did not make the session's earlier runs (a restarted app, another
    worker) names a reused call id's run apart from them, as the session stores the call:
    ``call_0~2`` for the second turn's ``call_0``, whether the reply asking for it is recorded
    yet or not; a process without the session names it ``call_0``."""
    from types import SimpleNamespace

    store = MemoryStore()

    def process(name: str) -> ContextEngine:
        return ContextEngine(
            store,
            config=RuntimeConfig(model_hint="gpt-4o"),
            clock=SteppingClock(),
            id_generator=SequentialIdGenerator(name),
        )

    first = process("first")

    def asks(turn: int) -> list[Message]:
        call = ToolCallRequest(tool_call_id="call_0", name="lookup", raw_arguments="{}")
        return [
            Message(role=Role.USER, content=f"question {turn}"),
            Message(role=Role.ASSISTANT, content="", tool_calls=[call]),
            Message(role=Role.TOOL, content=f"result {turn}", tool_call_id="call_0"),
        ]

    await first.prepare_call("s", asks(0))
    await first.close()
    for replied in (False, True):
        engine = process(f"later-{replied}")  # a new process on the same store
        await engine.prepare_call("s", [*asks(0), Message(role=Role.USER, content="question 1")])
        if replied:
            call = ToolCallRequest(tool_call_id="call_0", name="lookup", raw_arguments="{}")
            await engine.commit_assistant_message(
                "s", Message(role=Role.ASSISTANT, content="", tool_calls=[call])
            )
        ids = ToolScopeIds(cast(Plugin, SimpleNamespace(installed=True, engine=engine)))
        assert ids.take("s", "call_0") == "call_0~2"
        assert ids.take("other", "call_0") == "call_0"
        await engine.close()


def test_asked_tool_calls_give_each_run_the_call_with_its_arguments() -> None:
    asked = AskedToolCalls()
    asked.note("s", [("c1", "weather", '{"city": "Oslo"}'), ("c2", "weather", {"city": "Rome"})])
    asked.note("s", [("c3", "weather", "{not json")])
    # a run ending first takes its own call, whichever form its arguments have
    assert asked.take("s", "weather", '{"city":"Rome"}', fallback=False) == "c2"
    assert asked.take("s", "other", {}, fallback=True) is None
    assert asked.take("s", "weather", {"city": "Bergen"}, fallback=False) is None
    assert asked.take("s", "weather", {"city": "Bergen"}, fallback=True) == "c1"
    asked.note("s", [("c4", "weather", {})], replace=True)  # a new reply supersedes
    assert asked.take("s", "weather", "{not json", fallback=True) == "c4"
    asked.note(("run", "s"), [("c5", "lookup", {})])
    asked.drop(lambda key: key == ("run", "s"))
    assert asked.take(("run", "s"), "lookup", {}, fallback=True) is None
    assert arguments_key('{"b": 1, "a": [2]}') == arguments_key({"a": [2], "b": 1})


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["assistant", "user", "system"]),
    st.text(max_size=40),
    st.sampled_from([None, Author(kind=AuthorKind.AGENT, id="planner")]),
)
def test_a_text_message_is_the_message_its_parts_make(
    role: str, text: str, author: Author | None
) -> None:
    """``message_from_openai`` of a dict of a role and text alone (built at once) gives the
    message that reading it into parts gives, or fails as that does."""
    entry = {"role": role, "content": text}
    try:
        (part,) = from_openai_messages([entry])
        expected: Message | None = message_from_part(part, author)
    except ValueError:
        expected = None
    if expected is None:
        with pytest.raises(ValueError):
            message_from_openai(entry, author)
    else:
        assert message_from_openai(entry, author).model_dump() == expected.model_dump()


_TURN = st.one_of(
    st.tuples(st.sampled_from(["user", "assistant", "system"]), st.text(max_size=12)).map(
        lambda t: [{"role": t[0], "content": t[1]}]
    ),
    st.tuples(st.text(max_size=8), st.sampled_from(["c1", "c2"]), st.booleans()).map(
        lambda t: [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": t[1], "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": t[1], "content": t[0]}
            | ({"name": "f"} if t[2] else {}),
        ]
    ),
    st.text(max_size=8).map(lambda text: [{"role": "user", "content": text, "name": "ann"}]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_TURN, min_size=1, max_size=6))
def test_pending_messages_are_those_their_parts_make(turns: list[list[dict[str, Any]]]) -> None:
    """``openai_to_messages`` (messages of text alone made at once, the others read into
    parts, each message met before taken from its cache) gives what reading the whole list
    into parts gives."""
    messages = [m for turn in turns for m in turn]
    expected = [message_from_part(p) for p in from_openai_messages(messages)]
    for _ in range(2):  # the second time from the cache
        got = openai_to_messages(messages)
        assert [m.model_dump() for m in got] == [m.model_dump() for m in expected]


async def test_scores_of_a_retrieval_are_confidences_only_when_all_lie_in_0_1() -> None:
    """A BM25 retriever's raw scores (2.28 for the best document, 0.885 for a weak one) say
    nothing about confidence: none of them becomes one, so the weak document does not outrank
    the best as high-confidence evidence. A retrieval of similarities in [0, 1] keeps them."""
    engine = make_engine()
    recorder = Recorder(engine, "s-scores")
    raw = await recorder.record_retrieval(
        [
            RetrievalHit("Best match about tides.", "doc://best", 2.28),
            RetrievalHit("Weak match about tides.", "doc://weak", 0.885),
        ]
    )
    similar = await recorder.record_retrieval(
        [RetrievalHit("Close.", "doc://close", 0.91), RetrievalHit("Far.", "doc://far", None)]
    )
    assert [(e.confidence, e.metadata["score"]) for e in raw] == [(None, 2.28), (None, 0.885)]
    assert [e.confidence for e in similar] == [0.91, None]
    await engine.close()


def test_object_sessions_hold_objects_weakly_by_identity() -> None:
    class Unhashable:  # as pydantic models are
        __hash__ = None  # type: ignore[assignment]

    sessions = ObjectSessions()
    alice, bob = Unhashable(), Unhashable()
    assert sessions.sessions(alice) is None  # never seen
    sessions.note(alice, "s1")
    sessions.note(alice, None)  # seen in no session of its own: nothing added
    sessions.note(alice, "s2")
    sessions.note(alice, "s1")  # the most recent last
    sessions.note(bob, None)
    assert sessions.sessions(alice) == ["s2", "s1"]
    assert sessions.take(bob) == [] and sessions.take(bob) is None
    assert sessions.take(alice) == ["s2", "s1"] and sessions.sessions(alice) is None

    sessions.note(alice, "s3")
    del alice
    gc.collect()
    assert sessions._held == {}  # a dropped object is forgotten
    with pytest.raises(TypeError):
        sessions.note(1, "s")  # an int cannot be referenced weakly
