"""Shared fixtures of the ce-haystack tests: they drive the real Haystack (Pipelines, Agents,
OpenAIChatGenerator with its own OpenAI client on the scripted OpenAI server; skipped when
haystack-ai is not installed, e.g. in the core-only virtualenv)."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
pytest.importorskip("haystack")

sys.path.insert(0, str(Path(__file__).parent))

from ce.core.engine import ContextEngine
from ce.core.testing import deterministic_engine
from ce.haystack import HaystackPlugin


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    """A deterministic engine on a MemoryStore (modules with another budget override it)."""
    engine = deterministic_engine()
    yield engine
    await engine.close()


@pytest.fixture(autouse=True)
def _uninstall() -> Iterator[None]:
    """Every test leaves Haystack as it found it, even when it fails."""
    yield
    if HaystackPlugin().installed:
        HaystackPlugin().uninstall()
