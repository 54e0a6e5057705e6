"""Shared fixtures of the ce-llamaindex tests: they drive the real framework (skipped when
LlamaIndex is not installed, e.g. in the core-only virtualenv)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

pytest.importorskip("llama_index.core")

from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.stores import MemoryStore
from ce.llamaindex import LlamaIndexPlugin


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    """A deterministic engine on a MemoryStore (modules with another budget override it)."""
    engine = ContextEngine(
        MemoryStore(),
        clock=SteppingClock(),
        id_generator=SequentialIdGenerator("id"),
        config=RuntimeConfig(model_hint="gpt-4o"),
    )
    yield engine
    await engine.close()


@pytest.fixture(autouse=True)
def _uninstall() -> Iterator[None]:
    """Every test leaves LlamaIndex as it found it, even when it fails."""
    yield
    if LlamaIndexPlugin().installed:
        LlamaIndexPlugin().uninstall()
