"""ce.core.integration.prepare_openai / prepare_openai_sync: a guarded prepare_call on
OpenAI-style message dicts, for plugins of frameworks that speak them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.events import Event
from ce.core.integration import INTEGRATION_FAILED, Plugin, prepare_openai, prepare_openai_sync
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
    assert await prepare_openai(plugin, "s", MESSAGES) is None
    assert prepare_openai_sync(plugin, "s", MESSAGES) is None
    assert [e.payload["reason"] for e in events] == [INTEGRATION_FAILED] * 2
    plugin.fail_closed = True
    with pytest.raises(RuntimeError, match="down"):
        await prepare_openai(plugin, "s", MESSAGES)
    with pytest.raises(RuntimeError, match="down"):
        prepare_openai_sync(plugin, "s", MESSAGES)
