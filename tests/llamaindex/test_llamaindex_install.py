"""Install / uninstall on LlamaIndex's root dispatcher, the caller's own message lists, the
supported range, and importing the plugin without LlamaIndex."""

from __future__ import annotations

import ast
import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.dispatcher import Dispatcher
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import (
    ChatMemoryBuffer,
    ChatSummaryMemoryBuffer,
    Memory,
    SimpleComposableMemory,
    VectorMemory,
)
from llama_index.core.memory.types import BaseChatStoreMemory, BaseMemory
from llamaindex_fakes import ScriptedLLM

import ce.llamaindex
from ce.core.engine import ContextEngine
from ce.core.integration import requirement_conflicts
from ce.core.schema import Role
from ce.llamaindex import ContextEngineMemory, LlamaIndexPlugin
from ce.llamaindex.package import LOWEST, REQUIREMENTS

ROOT = Path(__file__).resolve().parents[2]


def _echo(messages: list[dict[str, str]]) -> tuple[str, list[tuple[str, str, dict[str, int]]]]:
    return f"{len(messages)} messages", []


async def test_uninstall_restores_the_root_dispatchers_handler_lists(engine: ContextEngine) -> None:
    root = get_dispatcher()
    span_list, event_list = root.span_handlers, root.event_handlers
    spans, events = list(span_list), list(event_list)
    span_enter = vars(Dispatcher)["span_enter"]
    plugin = ce.llamaindex.install(engine, session_id="s-inst", fail_closed=True)
    assert len(root.span_handlers) == len(spans) + 1
    assert len(root.event_handlers) == len(events) + 1
    assert vars(Dispatcher)["span_enter"] is not span_enter  # fail_closed raises from here
    assert ce.llamaindex.install(engine) is plugin  # twice = once
    assert len(root.span_handlers) == len(spans) + 1
    plugin.uninstall()
    assert root.span_handlers is span_list and root.event_handlers is event_list
    assert root.span_handlers == spans and root.event_handlers == events
    assert all(a is b for a, b in zip(root.span_handlers, spans, strict=True))
    assert all(a is b for a, b in zip(root.event_handlers, events, strict=True))
    assert vars(Dispatcher)["span_enter"] is span_enter
    llm = ScriptedLLM(script=_echo, seen=[])
    llm.chat([ChatMessage(role="user", content="after uninstall")])
    assert [m.content for m in llm.seen[0]] == ["after uninstall"]
    assert await engine.list_turns("s-inst") == []
    # and it installs again
    ce.llamaindex.install(engine, session_id="s-inst")
    assert len(root.span_handlers) == len(spans) + 1
    llm.chat([ChatMessage(role="user", content="installed again")])
    assert len(await engine.list_turns("s-inst")) == 1


MEMORY_METHODS = ("reset", "areset", "get", "set")


def _own_methods(cls: type) -> dict[str, object]:
    return {name: vars(cls)[name] for name in MEMORY_METHODS if name in vars(cls)}


async def test_uninstall_restores_every_memory_classes_reset(engine: ContextEngine) -> None:
    """The memory classes' ``reset`` / ``areset`` (wrapped so that a reset clears the
    memory's session; classes created after install too) and the memory-work marks."""
    classes = [
        BaseMemory,
        BaseChatStoreMemory,
        ChatMemoryBuffer,
        ChatSummaryMemoryBuffer,
        Memory,
        SimpleComposableMemory,
        VectorMemory,
        ContextEngineMemory,
    ]
    originals = {cls: _own_methods(cls) for cls in classes}
    plugin = ce.llamaindex.install(engine)
    wrapped = {
        BaseMemory: {"areset"},
        BaseChatStoreMemory: {"reset", "areset"},
        ChatMemoryBuffer: set(),
        ChatSummaryMemoryBuffer: {"reset", "get"},
        Memory: {"reset", "areset"},
        SimpleComposableMemory: {"reset"},
        VectorMemory: {"reset", "set"},
        ContextEngineMemory: set(),  # it clears in its own reset
    }
    for cls, names in wrapped.items():
        now = _own_methods(cls)
        assert now.keys() == originals[cls].keys()
        assert {n for n, method in now.items() if method is not originals[cls][n]} == names
    assert "__init_subclass__" in vars(BaseMemory)

    class Later(ChatMemoryBuffer):
        def reset(self) -> None:
            super().reset()

    later = vars(Later)["reset"].__wrapped__
    assert vars(Later)["reset"] is not later
    plugin.uninstall()
    for cls in classes:
        now = _own_methods(cls)
        assert now.keys() == originals[cls].keys()
        assert all(now[n] is originals[cls][n] for n in now)
    assert "__init_subclass__" not in vars(BaseMemory)
    assert vars(Later)["reset"] is later


@pytest.mark.parametrize("method", ["chat", "achat", "stream_chat", "astream_chat"])
async def test_the_callers_own_list_is_unchanged(method: str, engine: ContextEngine) -> None:
    ce.llamaindex.install(engine, session_id="s-own")
    await engine.update_notebook("s-own", "NOTEBOOK-MARK")
    llm = ScriptedLLM(script=_echo, seen=[])
    mine = [
        ChatMessage(role="system", content="app system"),
        ChatMessage(role="user", content="hello there"),
    ]
    before = list(mine)
    if method == "chat":
        reply = llm.chat(mine).message.content
    elif method == "achat":
        reply = (await llm.achat(mine)).message.content
    elif method == "stream_chat":
        reply = [r for r in llm.stream_chat(mine)][-1].message.content
    else:
        reply = [r async for r in await llm.astream_chat(mine)][-1].message.content
    assert reply == "2 messages"
    assert mine == before and all(a is b for a, b in zip(mine, before, strict=True))
    assert mine[0].content == "app system"
    (received,) = llm.seen
    assert received is not mine
    assert "NOTEBOOK-MARK" in str(received[0].content) and "app system" in str(received[0].content)
    doc = await engine.get_session("s-own")
    assert [m.content for m in doc.session.messages if m.role is Role.ASSISTANT] == ["2 messages"]


async def test_langchain_and_llamaindex_install_on_one_engine(engine: ContextEngine) -> None:
    langchain = pytest.importorskip("ce.langchain")
    fake_chat_models = pytest.importorskip("langchain_core.language_models.fake_chat_models")
    ce.llamaindex.install(engine, session_id="s-both")
    try:
        assert langchain.install(engine, session_id="s-both").installed
        assert LlamaIndexPlugin().installed and LlamaIndexPlugin().engine is engine
        llm = ScriptedLLM(script=_echo, seen=[])
        llm.chat([ChatMessage(role="user", content="asked through llamaindex")])
        model = fake_chat_models.GenericFakeChatModel(messages=iter(["from langchain"]))
        await asyncio.to_thread(model.invoke, [("user", "asked through langchain")])
    finally:
        langchain.uninstall()
    assert len(await engine.list_turns("s-both")) == 2
    doc = await engine.get_session("s-both")
    assert [m.content for m in doc.session.messages if m.role is not Role.SYSTEM] == [
        "asked through llamaindex",
        "1 messages",
        "asked through langchain",
        "from langchain",
    ]


def test_the_supported_range_is_the_pyproject_extra_and_is_installed() -> None:
    pyproject = (ROOT / "packages/ce-llamaindex/pyproject.toml").read_text(encoding="utf-8")
    extra = re.search(r"^llamaindex = (\[.*\])$", pyproject, flags=re.M)
    assert extra is not None, "the llamaindex extra is missing"
    assert tuple(ast.literal_eval(extra.group(1))) == REQUIREMENTS
    assert requirement_conflicts(REQUIREMENTS) == []
    assert requirement_conflicts(tuple(f"{k}>={v}" for k, v in LOWEST.items())) == []


def test_the_plugin_imports_without_llamaindex() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('llama_index', 'llama_index_instrumentation'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import ce.llamaindex\n"
        "print(sorted(ce.llamaindex.__all__))\n"
        "try:\n"
        "    ce.llamaindex.ContextEngineMemory\n"
        "except ImportError as exc:\n"
        "    print('memory needs', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert (
        "'ContextEngineMemory', 'LlamaIndexPlugin', 'install', 'uninstall', 'wrap'" in done.stdout
    )
    assert "memory needs llama_index" in done.stdout


async def test_uninstall_puts_back_the_list_of_a_stream_never_consumed(
    engine: ContextEngine,
) -> None:
    ce.llamaindex.install(engine, session_id="s-abandoned")
    await engine.update_notebook("s-abandoned", "NOTEBOOK-MARK")
    llm = ScriptedLLM(script=_echo, seen=[])
    mine = [ChatMessage(role="user", content="never read to the end")]
    stream = llm.stream_chat(mine)
    next(stream)
    assert "NOTEBOOK-MARK" in str(llm.seen[0][0].content)
    assert len(mine) == 2  # rewritten while the stream is open: the provider may read it lazily
    ce.llamaindex.uninstall()
    assert [m.content for m in mine] == ["never read to the end"]


async def test_augment_mode_keeps_the_apps_messages_and_adds_the_context(
    engine: ContextEngine,
) -> None:
    ce.llamaindex.install(engine, session_id="s-augment", mode="augment")
    await engine.update_notebook("s-augment", "NOTEBOOK-MARK")
    llm = ScriptedLLM(script=_echo, seen=[])
    mine = [
        ChatMessage(role="system", content="app system"),
        ChatMessage(role="user", content="augment me"),
    ]
    llm.chat(mine)
    (received,) = llm.seen
    assert [m.role.value for m in received] == ["system", "system", "user"]
    assert received[0] is mine[0] and received[2] is mine[1]  # the app's own objects
    assert "NOTEBOOK-MARK" in str(received[1].content)
    assert "app system" not in str(received[1].content)
    assert [m.content for m in mine] == ["app system", "augment me"]
