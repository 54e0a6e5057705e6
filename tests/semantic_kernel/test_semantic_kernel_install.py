"""Install / uninstall on Semantic Kernel (the exact originals come back, the instance
wrappers and filters it added are gone, requests are byte-identical again), a global install
covers kernels and services built before it and clones, ``install(kernel=k)`` acts on ``k``
and its clones only and removes exactly its filters, recording only, the supported range, and
importing the plugin without Semantic Kernel."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

from semantic_kernel import Kernel
from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai import FunctionChoiceBehavior
from sk_apps import kernel_with

import ce.semantic_kernel
from ce.core.engine import ContextEngine
from ce.core.integration import requirement_conflicts
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.semantic_kernel._inject import INNER, INNER_STREAM
from ce.semantic_kernel._patch import patched_targets
from ce.semantic_kernel.package import LOWEST, REQUIREMENTS

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "You are the install test agent."
MARK = "NOTEBOOK-MARK-INSTALL"
ASK = "Weather in Oslo? Mail me at zed.canary@example.com"
_MISSING = object()


class Weather:
    from semantic_kernel.functions import kernel_function

    @kernel_function(name="weather", description="The weather in a city.")
    def weather(self, city: Annotated[str, "the city"]) -> str:
        return f"sunny in {city}"


def _script(body: dict[str, Any]) -> ScriptedResponse:
    if body["messages"][-1]["role"] == "tool":
        return ScriptedResponse(text="It is sunny.")
    return ScriptedResponse(tool_calls=[("call_w", "W-weather", json.dumps({"city": "Oslo"}))])


async def _run(
    kernel: Kernel, thread_id: str = "s-inst", question: str = "Weather in Oslo?"
) -> str:
    agent = ChatCompletionAgent(
        kernel=kernel,
        name="helper",
        instructions=SYSTEM,
        function_choice_behavior=FunctionChoiceBehavior.Auto(),
    )
    thread = ChatHistoryAgentThread(thread_id=thread_id)
    return str((await agent.get_response(messages=question, thread=thread)).message)


def _held(targets: list[tuple[Any, str]]) -> list[Any]:
    return [vars(owner).get(attr, _MISSING) for owner, attr in targets]


def _bodies(server: ScriptedOpenAIServer) -> list[str]:
    return [json.dumps(r, sort_keys=True) for r in server.requests]


def _filters(kernel: Kernel) -> list[Any]:
    return [
        *kernel.function_invocation_filters,
        *kernel.auto_function_invocation_filters,
        *kernel.prompt_rendering_filters,
    ]


async def test_uninstall_restores_the_exact_originals_and_byte_identical_requests(
    engine: ContextEngine,
) -> None:
    targets = patched_targets()
    before = _held(targets)
    with ScriptedOpenAIServer(_script) as server:
        kernel = kernel_with(server, (Weather(), "W"))  # built before install
        service = kernel.get_service(type=None)
        await _run(kernel)
        untouched = _bodies(server)
        plugin = ce.semantic_kernel.install(engine)
        await engine.update_notebook("s-inst", MARK)
        await _run(kernel)
        await _run(kernel.clone(), "s-clone")
        injected = _bodies(server)[len(untouched) :]
        assert INNER in vars(service) and INNER_STREAM in vars(service)
        assert all(a is not b for a, b in zip(_held(targets), before, strict=True))
        plugin.uninstall()
        assert plugin.ledger.entries == ()
        assert all(a is b for a, b in zip(_held(targets), before, strict=True))
        assert INNER not in vars(service) and INNER_STREAM not in vars(service)
        assert _filters(kernel) == []
        seen = len(server.requests)
        await _run(kernel)
        after = _bodies(server)[seen:]
    assert len(untouched) == 2
    assert all(MARK in body for body in injected[:2])
    assert len(injected) == 4  # the clone's requests were injected too
    assert after == untouched
    assert (await engine.get_session("s-clone")).session.tool_state.tool_calls


async def test_install_on_one_kernel_acts_on_it_and_its_clones_only(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_script) as server:
        mine = kernel_with(server, (Weather(), "W"))
        other = kernel_with(server, (Weather(), "W"))
        await _run(other, "s-before")
        untouched = _bodies(server)
        plugin = ce.semantic_kernel.install(engine, kernel=mine)
        assert len(mine.function_invocation_filters) == 1
        assert len(mine.auto_function_invocation_filters) == 1
        clone = mine.clone()
        assert [f for _, f in clone.function_invocation_filters] == [
            f for _, f in mine.function_invocation_filters
        ]
        for session_id in ("s-mine", "s-mine-clone", "s-other"):
            await engine.update_notebook(session_id, MARK)
        await _run(mine, "s-mine")
        await _run(clone, "s-mine-clone")
        await _run(other, "s-other")
        bodies = _bodies(server)[len(untouched) :]
        plugin.uninstall()
        assert _filters(mine) == []
    assert all(MARK in body for body in bodies[:4])
    assert bodies[4:] == untouched
    assert (await engine.get_session("s-mine")).session.tool_state.tool_calls
    assert await engine.list_turns("s-other") == []


async def test_a_service_added_after_install_is_covered(engine: ContextEngine) -> None:
    """select_ai_service returns a service the kernel did not have at install: its first
    call wraps it."""
    with ScriptedOpenAIServer(_script) as server:
        ce.semantic_kernel.install(engine)
        await engine.update_notebook("s-late", MARK)
        kernel = kernel_with(server, (Weather(), "W"))
        await _run(kernel, "s-late")
        bodies = _bodies(server)
    assert len(bodies) == 2 and all(MARK in body for body in bodies)


async def test_inject_false_records_only(engine: ContextEngine) -> None:
    """The model gets SK's own messages as they are (not even redacted); the session records
    the run (redacted, as always)."""
    with ScriptedOpenAIServer(_script) as server:
        kernel = kernel_with(server, (Weather(), "W"))
        await _run(kernel, "s-plain", ASK)
        untouched = _bodies(server)
        ce.semantic_kernel.install(engine, inject=False)
        await engine.update_notebook("s-record", MARK)
        await _run(kernel, "s-plain", ASK)
        bodies = _bodies(server)[len(untouched) :]
    assert bodies == untouched
    doc = await engine.get_session("s-plain")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        "Weather in Oslo? Mail me at [REDACTED:email]"
    ]
    assert len(doc.session.model_usage) == 2
    assert [r.tool_call_id for r in doc.session.tool_state.tool_calls] == ["call_w"]


def test_the_supported_range_is_the_pyproject_extra_and_is_installed() -> None:
    pyproject = (ROOT / "packages/ce-semantic-kernel/pyproject.toml").read_text(encoding="utf-8")
    extra = re.search(r"^semantic-kernel = (\[.*\])$", pyproject, flags=re.M)
    assert extra is not None, "the semantic-kernel extra is missing"
    assert tuple(ast.literal_eval(extra.group(1))) == REQUIREMENTS
    assert requirement_conflicts(REQUIREMENTS) == []
    assert requirement_conflicts(tuple(f"{k}>={v}" for k, v in LOWEST.items())) == []
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    for name, version in LOWEST.items():
        assert re.search(rf"{re.escape(name)}=={re.escape(version)}", noxfile), name


def test_the_plugin_imports_without_semantic_kernel() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'semantic_kernel':\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import ce.semantic_kernel\n"
        "import ce.semantic_kernel._inject, ce.semantic_kernel._record\n"
        "import ce.semantic_kernel._convert, ce.semantic_kernel._patch\n"
        "print(sorted(ce.semantic_kernel.__all__))\n"
        "plugin = ce.semantic_kernel.SemanticKernelPlugin()\n"
        "print(plugin.name, plugin.installed)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "['SemanticKernelPlugin', 'install', 'uninstall']" in done.stdout
    assert "semantic_kernel False" in done.stdout
