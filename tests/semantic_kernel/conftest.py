"""Shared fixtures of the ce-semantic-kernel tests: they drive the real Semantic Kernel
(OpenAIChatCompletion with an AsyncOpenAI client on the scripted OpenAI server; skipped when
semantic-kernel is not installed, e.g. in the core-only virtualenv)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

pytest.importorskip("semantic_kernel")

sys.path.insert(0, str(Path(__file__).parent))

from ce.core.engine import ContextEngine
from ce.core.testing import deterministic_engine
from ce.semantic_kernel import SemanticKernelPlugin


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    """A deterministic engine on a MemoryStore (modules with another budget override it)."""
    engine = deterministic_engine()
    yield engine
    await engine.close()


@pytest.fixture(autouse=True)
def _uninstall() -> Iterator[None]:
    """Every test leaves Semantic Kernel as it found it, even when it fails."""
    yield
    if SemanticKernelPlugin().installed:
        SemanticKernelPlugin().uninstall()
