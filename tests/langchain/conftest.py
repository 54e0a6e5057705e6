"""Shared fixtures of the ce-langchain tests: they drive the real framework (skipped when
LangChain is not installed, e.g. in the core-only virtualenv)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain")

from ce.core.engine import ContextEngine
from ce.core.testing import deterministic_engine
from ce.langchain import LangChainPlugin


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    """A deterministic engine on a MemoryStore (modules with another budget override it)."""
    engine = deterministic_engine()
    yield engine
    await engine.close()


@pytest.fixture(autouse=True)
def _uninstall() -> Iterator[None]:
    """Every test leaves LangChain as it found it, even when it fails."""
    yield
    if LangChainPlugin().installed:
        LangChainPlugin().uninstall()
