"""Installing ce-haystack: one line covers every chat generator of every Pipeline and Agent,
built before or after ``install()``; ``install(target=...)`` only that Pipeline or Agent; the
tracer is chained to the app's own (which keeps getting its spans, without content unless the
app enabled content tracing, and gets its tracer back on uninstall); ``run`` keeps its
signature; ``Agent.to_dict`` never shows the plugin's hook; uninstall puts Haystack's exact
objects back and gives byte-identical requests; the extra and the nox session agree with the
supported range; the package imports without Haystack."""

from __future__ import annotations

import contextlib
import inspect
import subprocess
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import pytest
import tomllib
from haystack import Pipeline, tracing
from haystack.components.agents import Agent
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.tracing import Span, Tracer
from haystack.utils import Secret
from hs_apps import LOOKUP, generator

import ce.haystack
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer
from ce.core.testing.plugin_contract import contract_script
from ce.haystack import HaystackPlugin
from ce.haystack._patch import patched_targets
from ce.haystack.package import LOWEST, REQUIREMENTS

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "You are the install test app."
MARK = "NOTEBOOK-MARK-INSTALL"


class AppSpan(Span):
    def __init__(self, name: str, parent: AppSpan | None) -> None:
        self.name, self.parent, self.tags = name, parent, {}

    def set_tag(self, key: str, value: Any) -> None:
        self.tags[key] = value


class AppTracer(Tracer):
    """The app's own tracer (as Langfuse's or OpenTelemetry's would be)."""

    def __init__(self) -> None:
        self.spans: list[AppSpan] = []
        self._current: ContextVar[AppSpan | None] = ContextVar("app_span", default=None)

    @contextlib.contextmanager
    def trace(
        self, operation_name: str, tags: dict[str, Any] | None = None, parent_span: Any = None
    ) -> Iterator[Span]:
        span = AppSpan(operation_name, parent_span or self._current.get())
        span.set_tags(tags or {})
        self.spans.append(span)
        token = self._current.set(span)
        try:
            yield span
        finally:
            self._current.reset(token)

    def current_span(self) -> Span | None:
        return self._current.get()


@pytest.fixture
def app_tracer() -> Iterator[AppTracer]:
    before = tracing.tracer.actual_tracer
    tracer = AppTracer()
    tracing.enable_tracing(tracer)
    yield tracer
    tracing.tracer.actual_tracer = before


def _agent(server: ScriptedOpenAIServer) -> Agent:
    return Agent(chat_generator=generator(server), tools=[LOOKUP], system_prompt=SYSTEM)


def _ask(agent: Agent, text: str) -> str:
    return str(agent.run([ChatMessage.from_user(text)])["last_message"].text)


async def test_agents_built_before_and_after_install_are_covered(engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(contract_script) as server:
        before = _agent(server)
        ce.haystack.install(engine, session_id="s-both")
        after = _agent(server)
        await engine.update_notebook("s-both", MARK)
        _ask(before, "built before?")
        _ask(after, "built after?")
        requests = server.requests
    assert len(requests) == 6
    assert all(MARK in r["messages"][0]["content"] for r in requests)


async def test_a_chat_generator_class_registered_after_install_is_covered(
    engine: ContextEngine,
) -> None:
    from haystack import component

    ce.haystack.install(engine, session_id="s-late")
    await engine.update_notebook("s-late", MARK)

    @component
    class EchoChatGenerator:
        """A chat generator of the app's own, defined after install()."""

        @component.output_types(replies=list[ChatMessage])
        def run(self, messages: list[ChatMessage], tools: Any = None) -> dict[str, Any]:
            self.seen = messages
            return {"replies": [ChatMessage.from_assistant("echo")]}

    echo = EchoChatGenerator()
    echo.run(messages="hello")  # a str is one user message
    assert MARK in echo.seen[0].text and echo.seen[-1].text == "hello"
    assert "tools" in inspect.signature(EchoChatGenerator.run).parameters
    HaystackPlugin().uninstall()
    echo.run(messages=[ChatMessage.from_user("plain")])
    assert [m.text for m in echo.seen] == ["plain"]


async def test_the_apps_tracer_keeps_its_spans_and_gets_no_content(
    engine: ContextEngine, app_tracer: AppTracer
) -> None:
    with ScriptedOpenAIServer(contract_script) as server:
        agent = _agent(server)
        _ask(agent, "before?")
        alone = [(s.name, s.parent.name if s.parent else None) for s in app_tracer.spans]
        app_tracer.spans.clear()
        ce.haystack.install(engine, session_id="s-traced")
        assert tracing.tracer.actual_tracer is not app_tracer
        _ask(agent, "before?")
        chained = [(s.name, s.parent.name if s.parent else None) for s in app_tracer.spans]
        HaystackPlugin().uninstall()
    assert tracing.tracer.actual_tracer is app_tracer
    assert not tracing.tracer.is_content_tracing_enabled
    # the same spans with the same parents, minus the plugin's own after_tool hook span
    assert [s for s in chained if s[0] != "haystack.agent.hook"] == alone
    assert all(not any("input" in k or "output" in k for k in s.tags) for s in app_tracer.spans)
    doc = await engine.get_session("s-traced")
    assert len(doc.session.tool_state.tool_calls) == 2  # the plugin saw the content it needs


async def test_the_apps_tracer_gets_content_when_the_app_enabled_it(
    engine: ContextEngine, app_tracer: AppTracer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing.tracer, "is_content_tracing_enabled", True)
    with ScriptedOpenAIServer(contract_script) as server:
        agent = _agent(server)
        ce.haystack.install(engine, session_id="s-content")
        _ask(agent, "content?")
    llm = [s for s in app_tracer.spans if s.name == "haystack.agent.step.llm"]
    assert llm and all("haystack.agent.step.llm.input" in s.tags for s in llm)


async def test_install_target_covers_that_pipeline_only(engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(contract_script) as server:
        target, other = Pipeline(), Pipeline()
        target.add_component("agent", _agent(server))
        other.add_component("agent", _agent(server))
        target_gen = target.get_component("agent").chat_generator
        ce.haystack.install(engine, session_id="s-target", target=target)
        await engine.update_notebook("s-target", MARK)
        assert "run" in vars(target_gen)  # the instance, not the class
        assert "run" not in vars(OpenAIChatGenerator) or not hasattr(
            vars(OpenAIChatGenerator)["run"], "ce_wrapped"
        )
        data = {"agent": {"messages": [ChatMessage.from_user("target?")]}}
        target.run(data)
        mine = server.requests
        other.run({"agent": {"messages": [ChatMessage.from_user("other?")]}})
        theirs = server.requests[len(mine) :]
        HaystackPlugin().uninstall()
        assert "run" not in vars(target_gen) and "run" not in vars(target)
    assert all(MARK in r["messages"][0]["content"] for r in mine)
    assert all(r["messages"][0]["content"] == SYSTEM for r in theirs)
    doc = await engine.get_session("s-target")
    assert [m.content for m in doc.session.messages if m.role.value == "user"] == ["target?"]


async def test_install_target_takes_an_agent(engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(contract_script) as server:
        agent, other = _agent(server), _agent(server)
        ce.haystack.install(engine, session_id="s-agent", target=agent)
        await engine.update_notebook("s-agent", MARK)
        _ask(agent, "mine?")
        _ask(other, "theirs?")
        requests = server.requests
    assert all(MARK in r["messages"][0]["content"] for r in requests[:3])
    assert all(r["messages"][0]["content"] == SYSTEM for r in requests[3:])


def test_install_target_rejects_anything_else(engine: ContextEngine) -> None:
    with pytest.raises(TypeError, match="Pipeline or an Agent"):
        ce.haystack.install(engine, target=object())
    assert not HaystackPlugin().installed
    assert all(not hasattr(vars(o).get(a), "ce_wrapped") for o, a in patched_targets()[-2:])


def test_run_keeps_its_signature_and_agents_see_tools(engine: ContextEngine) -> None:
    before = inspect.signature(OpenAIChatGenerator.run)
    before_async = inspect.signature(OpenAIChatGenerator.run_async)
    ce.haystack.install(engine)
    assert inspect.signature(OpenAIChatGenerator.run) == before
    assert inspect.signature(OpenAIChatGenerator.run_async) == before_async
    with ScriptedOpenAIServer(contract_script) as server:
        agent = _agent(server)  # built while installed: checks run's signature for "tools"
        assert agent._chat_generator_supports_tools
        assert set(agent.chat_generator.__haystack_input__._sockets_dict) >= {"messages", "tools"}


async def test_to_dict_never_shows_the_plugins_hook(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with ScriptedOpenAIServer(contract_script) as server:
        agent = Agent(
            chat_generator=generator(server, api_key=Secret.from_env_var("OPENAI_API_KEY")),
            tools=[LOOKUP],
            system_prompt=SYSTEM,
        )
        saved = agent.to_dict()
        ce.haystack.install(engine, session_id="s-dict")
        _ask(agent, "dict?")
        assert agent.hooks.get("after_tool")  # in place while installed
        assert agent.to_dict() == saved
        HaystackPlugin().uninstall()
        assert agent.hooks == {}
        assert agent.to_dict() == saved


async def test_uninstall_gives_byte_identical_requests(engine: ContextEngine) -> None:
    targets = patched_targets()
    originals = [vars(owner).get(attr) for owner, attr in targets]
    with ScriptedOpenAIServer(contract_script) as server:
        agent = _agent(server)
        _ask(agent, "same?")
        alone = server.requests
        ce.haystack.install(engine, session_id="s-same")
        _ask(agent, "same?")
        HaystackPlugin().uninstall()
        _ask(agent, "same?")
        after = server.requests[2 * len(alone) :]
    assert [vars(owner).get(attr) for owner, attr in targets] == originals
    assert all(
        vars(owner).get(attr) is original
        for (owner, attr), original in zip(targets, originals, strict=True)
    )
    assert after == alone


def test_the_extra_and_the_nox_session_match_the_supported_range() -> None:
    pyproject = tomllib.loads((ROOT / "packages/ce-haystack/pyproject.toml").read_text())
    assert tuple(pyproject["project"]["optional-dependencies"]["haystack"]) == REQUIREMENTS
    assert HaystackPlugin.requirements == REQUIREMENTS
    noxfile = (ROOT / "noxfile.py").read_text()
    assert f'"lowest": ["haystack-ai=={LOWEST["haystack-ai"]}"]' in noxfile
    assert f'"latest": ["{REQUIREMENTS[0]}"]' in noxfile


def test_the_package_imports_without_haystack() -> None:
    code = (
        "import sys; sys.modules['haystack'] = None\n"
        "import ce.haystack\n"
        "assert not ce.haystack.HaystackPlugin().installed\n"
        "print('imported')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "imported"


async def test_a_tracer_the_app_enables_after_install_is_chained_too(
    engine: ContextEngine,
) -> None:
    before = tracing.tracer.actual_tracer
    try:
        with ScriptedOpenAIServer(contract_script) as server:
            agent = _agent(server)
            ce.haystack.install(engine, session_id="s-late-tracer")
            late = AppTracer()
            tracing.enable_tracing(late)  # the app's tracer, after install
            assert tracing.tracer.actual_tracer is not late
            _ask(agent, "late?")
            HaystackPlugin().uninstall()
        assert tracing.tracer.actual_tracer is late
        assert "haystack.agent.step.tool" in {s.name for s in late.spans}
        doc = await engine.get_session("s-late-tracer")
        assert len(doc.session.tool_state.tool_calls) == 2  # the plugin still recorded
    finally:
        tracing.tracer.actual_tracer = before
