"""Shared fixtures of the ce-crewai tests: they drive the real CrewAI (its OpenAI provider on
the scripted OpenAI server; skipped when crewai is not installed, e.g. in the core-only
virtualenv)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("OPENAI_API_KEY", "sk-scripted")
# CrewAI's own storage (its kickoff task outputs, memory) under a directory of this run only
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="ce-crewai-tests-")

pytest.importorskip("crewai")

sys.path.insert(0, str(Path(__file__).parent))

from ce.core.engine import ContextEngine
from ce.core.testing import deterministic_engine
from ce.crewai import CrewAIPlugin


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    """A deterministic engine on a MemoryStore."""
    engine = deterministic_engine()
    yield engine
    await engine.close()


@pytest.fixture(autouse=True)
def _uninstall() -> Iterator[None]:
    """Every test leaves CrewAI as it found it, even when it fails."""
    yield
    if CrewAIPlugin().installed:
        CrewAIPlugin().uninstall()
