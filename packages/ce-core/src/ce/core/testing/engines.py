"""Engines for tests: deterministic, in memory."""

from __future__ import annotations

from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.stores import MemoryStore

__all__ = ["deterministic_engine"]


def deterministic_engine(config: RuntimeConfig | None = None) -> ContextEngine:
    """A :class:`ContextEngine` on a fresh :class:`MemoryStore` with a stepping clock and
    sequential ids (``id-000001``, ``id-000002``, …), so the same test run stores the same
    session; the default config targets ``gpt-4o``. Plugin tests use it as their ``engine``
    fixture."""
    return ContextEngine(
        MemoryStore(),
        clock=SteppingClock(),
        id_generator=SequentialIdGenerator("id"),
        config=config or RuntimeConfig(model_hint="gpt-4o"),
    )
