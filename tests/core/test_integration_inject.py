"""ce.core.integration.prepare_openai / prepare_openai_sync: a guarded prepare_call on
OpenAI-style message dicts, for plugins of frameworks that speak them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.events import Event
from ce.core.integration import (
    INTEGRATION_FAILED,
    Plugin,
    augment_openai,
    prepare_openai,
    prepare_openai_sync,
)
from ce.core.schema import AssembledInput, MessagePart, Role
from ce.core.stores import MemoryStore


class InjectPlugin(Plugin):
    name = "inject-test"

    def _install(self, **options: Any) -> None:
        pass


MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi, I am bob@example.com"},
]


@pytest.fixture
async def plugin() -> AsyncIterator[Plugin]:
    engine = ContextEngine(MemoryStore(), config=RuntimeConfig(model_hint="gpt-4o"))
    plugin = InjectPlugin().install(engine)
    yield plugin
    plugin.uninstall()
    await engine.close()


async def test_prepare_openai_async_and_sync_return_the_assembled_input(plugin: Plugin) -> None:
    await plugin.engine.update_notebook("s", "NOTE-1")
    sent = await prepare_openai(plugin, "s", MESSAGES)
    assert sent is not None and sent[0]["role"] == "system" and "NOTE-1" in sent[0]["content"]
    assert "[REDACTED:email]" in sent[-1]["content"]
    again = prepare_openai_sync(plugin, "s", [*MESSAGES, {"role": "user", "content": "more"}])
    assert again is not None and again[-1] == {"role": "user", "content": "more"}
    assert len(await plugin.engine.list_turns("s")) == 2


async def test_prepare_openai_fails_open_and_closed(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[Event] = []
    plugin.engine.events.on("Degraded", events.append)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("down")

    monkeypatch.setattr(plugin.engine, "prepare_call", broken)
    # fail-open, but redacted: the app's own messages through the redactor
    for sent in (
        await prepare_openai(plugin, "s", MESSAGES),
        prepare_openai_sync(plugin, "s", MESSAGES),
    ):
        assert sent is not None and len(sent) == len(MESSAGES)
        assert "[REDACTED:email]" in sent[-1]["content"]
        assert "@" not in json.dumps(sent)
    assert [e.payload["reason"] for e in events] == [INTEGRATION_FAILED] * 2
    assert plugin.failures[INTEGRATION_FAILED] == 2
    plugin.fail_closed = True
    with pytest.raises(RuntimeError, match="down"):
        await prepare_openai(plugin, "s", MESSAGES)
    with pytest.raises(RuntimeError, match="down"):
        prepare_openai_sync(plugin, "s", MESSAGES)


async def test_prepare_openai_augment_keeps_the_apps_messages_and_adds_the_context() -> None:
    engine = ContextEngine(MemoryStore(), config=RuntimeConfig(model_hint="gpt-4o"))
    plugin = InjectPlugin().install(engine, mode="augment")
    try:
        await engine.update_notebook("s", "NOTE-1")
        for sent in (
            await prepare_openai(plugin, "s", MESSAGES),
            prepare_openai_sync(plugin, "s", MESSAGES),
        ):
            assert sent is not None
            # the app's own messages stay (redacted); the context follows its system prompt
            assert sent[0] == MESSAGES[0]
            assert sent[-1] == {"role": "user", "content": "hi, I am [REDACTED:email]"}
            assert len(sent) == 3 and sent[1]["role"] == "system"
            assert "NOTE-1" in sent[1]["content"] and "be brief" not in sent[1]["content"]
        assert len(await engine.list_turns("s")) == 2
    finally:
        plugin.uninstall()
        await engine.close()


class TenPerMessage:
    """Every message costs 10 tokens, the reply priming none."""

    def estimate_part(self, part: MessagePart, model_hint: str | None = None) -> int:
        return 10

    def reply_priming(self, model_hint: str | None = None) -> int:
        return 0


def _round(n: int) -> list[dict[str, Any]]:
    call = {"id": f"c{n}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [
        {"role": "user", "content": f"q{n}"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{n}", "content": f"result {n}"},
        {"role": "assistant", "content": f"a{n}"},
    ]


@pytest.mark.parametrize(
    ("budget", "kept_from"),
    [(1000, 0), (75, 4), (65, 5), (55, 7), (5, 8)],
)
def test_augment_openai_trims_the_history_to_the_budget(budget: int, kept_from: int) -> None:
    history = [*_round(0), *_round(1), {"role": "user", "content": "q2"}]
    app = [{"role": "system", "content": "be brief"}, *history]
    assembled = AssembledInput(
        parts=[
            MessagePart(role=Role.SYSTEM, content="be brief\n\nCONTEXT"),
            MessagePart(role=Role.USER, content="q2"),
        ],
        total_tokens=0,
    )
    sent = augment_openai(app, assembled, budget, TenPerMessage())  # type: ignore[arg-type]
    assert sent[:2] == [app[0], {"role": "system", "content": "CONTEXT"}]
    # a suffix of the app's history, never opening on a tool result, the last user kept
    assert sent[2:] == history[kept_from:]
    assert sent[2]["role"] != "tool"


def test_augment_openai_without_a_system_prompt_or_context() -> None:
    app = [{"role": "user", "content": "hi"}]
    context_only = AssembledInput(
        parts=[MessagePart(role=Role.SYSTEM, content="CONTEXT")], total_tokens=0
    )
    sent = augment_openai(app, context_only, 100, TenPerMessage())  # type: ignore[arg-type]
    assert sent == [{"role": "system", "content": "CONTEXT"}, *app]
    prompt_only = AssembledInput(
        parts=[MessagePart(role=Role.SYSTEM, content="be brief")], total_tokens=0
    )
    with_prompt = [{"role": "system", "content": "be brief"}, *app]
    sent = augment_openai(with_prompt, prompt_only, 100, TenPerMessage())  # type: ignore[arg-type]
    assert sent == with_prompt


async def test_prepare_openai_records_new_messages_with_their_authors(plugin: Plugin) -> None:
    """``authors`` (one per message) is who wrote each message: a message the session does
    not hold yet is stored with it (frameworks with several agents)."""
    from ce.core.schema import Author, AuthorKind

    alice = Author(kind=AuthorKind.AGENT, id="alice")
    user = Author(kind=AuthorKind.USER, id="user")
    messages = [*MESSAGES, {"role": "assistant", "content": "alice says hi"}]
    sent = await prepare_openai(plugin, "s-authors", messages, None, [None, user, alice])
    assert sent is not None
    again = prepare_openai_sync(
        plugin,
        "s-authors",
        [*messages, {"role": "user", "content": "and?"}],
        None,
        [None, user, alice, user],
    )
    assert again is not None
    doc = await plugin.engine.get_session("s-authors")
    stored = [
        (m.role, m.content, m.author) for m in doc.session.messages if m.role is not Role.SYSTEM
    ]
    assert stored == [
        (Role.USER, "hi, I am [REDACTED:email]", user),
        (Role.ASSISTANT, "alice says hi", alice),
        (Role.USER, "and?", user),
    ]
    # authors that do not match the messages: a plugin bug, served fail-open (redacted)
    failed = plugin.failures["integration_failed"]
    fallback = await prepare_openai(plugin, "s-authors", messages, None, [None, user])
    assert fallback is not None and fallback[1]["content"] == "hi, I am [REDACTED:email]"
    assert plugin.failures["integration_failed"] == failed + 1
