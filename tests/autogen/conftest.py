"""Shared fixtures of the ce-autogen tests: they drive the real AutoGen (autogen-agentchat with
autogen-ext's OpenAIChatCompletionClient on the scripted OpenAI server; skipped when AutoGen is
not installed, e.g. in the core-only virtualenv)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

pytest.importorskip("autogen_agentchat")
pytest.importorskip("autogen_ext.models.openai")

from ce.autogen import AutoGenPlugin
from ce.core.engine import ContextEngine
from ce.core.testing import deterministic_engine


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    """A deterministic engine on a MemoryStore (modules with another budget override it)."""
    engine = deterministic_engine()
    yield engine
    await engine.close()


@pytest.fixture(autouse=True)
def _uninstall() -> Iterator[None]:
    """Every test leaves AutoGen as it found it, even when it fails."""
    yield
    if AutoGenPlugin().installed:
        AutoGenPlugin().uninstall()
