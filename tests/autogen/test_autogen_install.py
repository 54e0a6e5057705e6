"""Install / uninstall on AutoGen's classes (the exact originals come back, requests are
byte-identical again, a reset clears nothing again), AG2 refused by name, one agent or team as
the target, recording only, ``dump_component`` / ``save_state`` / ``load_state`` with the
plugin installed, the supported range, and importing the plugin without AutoGen."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import BaseGroupChat, RoundRobinGroupChat
from autogen_apps import client
from autogen_core import CancellationToken

import ce.autogen
from ce.autogen import AutoGenPlugin
from ce.autogen._patch import patched_targets
from ce.autogen.package import LOWEST, REQUIREMENTS
from ce.core.engine import ContextEngine
from ce.core.integration import PluginVersionError, requirement_conflicts
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "You are the install test agent."
MARK = "NOTEBOOK-MARK-INSTALL"


def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def _script(body: dict[str, Any]) -> ScriptedResponse:
    if body["messages"][-1]["role"] == "tool":
        return ScriptedResponse(text="It is sunny.")
    return ScriptedResponse(tool_calls=[("call_w", "weather", json.dumps({"city": "Oslo"}))])


def _agent(server: ScriptedOpenAIServer, name: str = "helper", **kwargs: Any) -> AssistantAgent:
    return AssistantAgent(
        name,
        model_client=client(server),
        tools=[weather],
        system_message=SYSTEM,
        reflect_on_tool_use=True,
        **kwargs,
    )


def _same(targets: list[tuple[Any, str]], before: list[Any]) -> list[bool]:
    """Whether each patched class attribute is the very object it was."""
    return [vars(owner)[attr] is old for (owner, attr), old in zip(targets, before, strict=True)]


def _bodies(server: ScriptedOpenAIServer) -> list[str]:
    return [json.dumps(r, sort_keys=True) for r in server.requests]


async def test_uninstall_restores_the_exact_originals_and_byte_identical_requests(
    engine: ContextEngine,
) -> None:
    targets = patched_targets()
    # a reset of an agent or a team clears its session: AutoGen's own reset methods
    assert {(AssistantAgent, "on_reset"), (BaseGroupChat, "reset")} <= set(targets)
    before = [vars(owner)[attr] for owner, attr in targets]
    with ScriptedOpenAIServer(_script) as server:
        await _agent(server).run(task="Weather in Oslo?")
        untouched = _bodies(server)
    plugin = ce.autogen.install(engine)
    await engine.update_notebook("s-inst", MARK)
    with ScriptedOpenAIServer(_script) as server:
        with engine.session("s-inst"):
            await _agent(server).run(task="Weather in Oslo?")
        injected = _bodies(server)
    assert all(MARK in body for body in injected)
    assert not any(_same(targets, before))
    plugin.uninstall()
    assert plugin.ledger.entries == ()
    assert all(_same(targets, before))
    with ScriptedOpenAIServer(_script) as server:
        with engine.session("s-inst"):
            await _agent(server).run(task="Weather in Oslo?")
        after = _bodies(server)
    assert len(untouched) == 2  # the tool call, then the reflection
    assert after == untouched


async def test_after_uninstall_a_reset_leaves_the_session_as_it_is(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    cleared: list[str] = []

    async def clear_history(session_id: str) -> Any:
        cleared.append(session_id)

    monkeypatch.setattr(engine, "clear_history", clear_history)
    with ScriptedOpenAIServer(_script) as server:
        agent = _agent(server)
        team = RoundRobinGroupChat([_agent(server, "mate")], max_turns=1)
        plugin = ce.autogen.install(engine)
        with engine.session("s-gone"):
            await agent.run(task="Weather in Oslo?")
            await team.run(task="Weather in Oslo?")
        plugin.uninstall()
        await agent.on_reset(CancellationToken())
        await team.reset()
    assert cleared == []
    assert await agent.model_context.get_messages() == []


def test_install_refuses_ag2_by_name(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = types.ModuleType("autogen")
    fake.ConversableAgent = type("ConversableAgent", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "autogen", fake)
    targets = patched_targets()
    before = [vars(owner)[attr] for owner, attr in targets]
    with pytest.raises(PluginVersionError, match="AG2") as info:
        ce.autogen.install(engine)
    assert "autogen-agentchat" in str(info.value)
    assert not AutoGenPlugin().installed
    assert all(_same(targets, before))


async def test_target_instruments_that_agent_only(engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(_script) as server:
        chosen, other = _agent(server, "chosen"), _agent(server, "other")
        ce.autogen.install(engine, target=chosen)
        await engine.update_notebook("s-target", MARK)
        with engine.session("s-target"):
            await other.run(task="Weather?")
            assert not any(MARK in body for body in _bodies(server))
            await chosen.run(task="Weather?")
        bodies = _bodies(server)
    assert [MARK in body for body in bodies] == [False, False, True, True]
    doc = await engine.get_session("s-target")
    assert {m.author.id for m in doc.session.messages if m.author and m.role is Role.ASSISTANT} == {
        "chosen"
    }


async def test_target_team_instruments_its_agents(engine: ContextEngine) -> None:
    def text(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text=f"reply {len(body['messages'])}")

    with ScriptedOpenAIServer(text) as server:
        team = RoundRobinGroupChat(
            [_agent(server, "alice"), _agent(server, "bob")],
            termination_condition=MaxMessageTermination(3),
        )
        ce.autogen.install(engine, target=team)
        await engine.update_notebook("s-team", MARK)
        with engine.session("s-team"):
            await team.run(task="Talk.")
        bodies = _bodies(server)
    assert len(bodies) == 2 and all(MARK in body for body in bodies)


async def test_inject_false_records_only(engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(_script) as server:
        ce.autogen.install(engine, inject=False)
        await engine.update_notebook("s-rec", MARK)
        with engine.session("s-rec"):
            await _agent(server).run(task="Weather in Oslo?")
        bodies = _bodies(server)
    assert not any(MARK in body for body in bodies)
    doc = await engine.get_session("s-rec")
    (run,) = doc.session.tool_state.tool_calls
    assert run.tool_call_id == "call_w" and run.status.value == "success"
    assert len(doc.session.model_usage) == len(bodies) == 2
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == ["Weather in Oslo?"]
    assert doc.session.messages[-1].content == "It is sunny."
    assert doc.session.messages[-1].author is not None


async def test_dump_component_and_state_round_trip_with_the_plugin_installed(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_script) as server:
        agent = _agent(server)
        team = RoundRobinGroupChat([agent], termination_condition=MaxMessageTermination(2))
        own_client = agent._model_client
        dumped = agent.dump_component().model_dump()
        ce.autogen.install(engine)
        with engine.session("s-state"):
            await team.run(task="Weather in Oslo?")
        assert agent._model_client is own_client
        assert agent.dump_component().model_dump() == dumped
        assert team.dump_component().config["participants"][0] == dumped
        agent_state = await agent.save_state()
        team_state = await team.save_state()
        json.dumps(agent_state)  # stays JSON, as AutoGen writes it
        fresh = _agent(server)
        await fresh.load_state(agent_state)
        assert await fresh.save_state() == agent_state
        fresh_team = RoundRobinGroupChat(
            [_agent(server)], termination_condition=MaxMessageTermination(2)
        )
        await fresh_team.load_state(team_state)
        assert (await fresh_team.save_state())["agent_states"].keys() == team_state[
            "agent_states"
        ].keys()
        with engine.session("s-state"):
            result = await fresh.run(task="And in Rome?")
        assert result.messages[-1].content == "It is sunny."
        last = server.requests[-1]["messages"]
        assert [m["content"] for m in last if m["role"] == "user"][-1] == "And in Rome?"
        # the restored conversation went to the model: the first question is in the request
        assert "Weather in Oslo?" in json.dumps(last)


def test_the_supported_range_is_the_pyproject_extra_and_is_installed() -> None:
    pyproject = (ROOT / "packages/ce-autogen/pyproject.toml").read_text(encoding="utf-8")
    extra = re.search(r"^autogen = (\[.*\])$", pyproject, flags=re.M)
    assert extra is not None, "the autogen extra is missing"
    assert tuple(ast.literal_eval(extra.group(1))) == REQUIREMENTS
    assert requirement_conflicts(REQUIREMENTS) == []
    assert requirement_conflicts(tuple(f"{k}>={v}" for k, v in LOWEST.items())) == []
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    for name, version in LOWEST.items():
        assert re.search(rf"{re.escape(name)}(\[\w+\])?=={re.escape(version)}", noxfile), name


def test_the_plugin_imports_without_autogen() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('autogen_agentchat', 'autogen_core', 'autogen_ext'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import ce.autogen\n"
        "print(sorted(ce.autogen.__all__))\n"
        "print(ce.autogen.AutoGenPlugin().name, ce.autogen.AutoGenPlugin().installed)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "['AutoGenPlugin', 'install', 'uninstall']" in done.stdout
    assert "autogen False" in done.stdout


def test_the_client_seams_come_off_exactly(engine: ContextEngine) -> None:
    """The ``create`` / ``create_stream`` of every model client class (for model calls a tool
    body makes itself), classes defined after ``install()`` included, are the very objects
    they were after ``uninstall()``."""
    from autogen_core.models import ChatCompletionClient
    from autogen_ext.models.openai import BaseOpenAIChatCompletionClient

    owner = BaseOpenAIChatCompletionClient
    before = (vars(owner)["create"], vars(owner)["create_stream"])
    assert "__init_subclass__" not in vars(ChatCompletionClient)
    ce.autogen.install(engine)
    assert vars(owner)["create"] is not before[0]
    assert vars(owner)["create_stream"] is not before[1]

    async def create(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    later = type("LaterClient", (BaseOpenAIChatCompletionClient,), {"create": create})
    assert vars(later)["create"] is not create  # seamed as it was created
    ce.autogen.uninstall()
    assert (vars(owner)["create"], vars(owner)["create_stream"]) == before
    assert vars(owner)["create"] is before[0] and vars(owner)["create_stream"] is before[1]
    assert vars(later)["create"] is create
    assert "__init_subclass__" not in vars(ChatCompletionClient)
