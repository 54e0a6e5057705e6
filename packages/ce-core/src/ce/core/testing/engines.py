"""Engines for tests: deterministic, in memory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.stores import MemoryStore, Store

__all__ = ["NoBlockingEngine", "deterministic_engine", "no_blocking", "note_reads", "whole_copy"]


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


class NoBlockingEngine:
    """Stands in for ``engine.sync`` in a test of an async path: every attribute use is noted
    in ``used`` and fails (an async framework path must await the engine, never block)."""

    def __init__(self) -> None:
        self.used: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.used.append(name)
        raise AssertionError(f"a blocking engine call on an async path: engine.sync.{name}")


@contextmanager
def no_blocking(engine: ContextEngine) -> Iterator[NoBlockingEngine]:
    """Within this block any use of ``engine.sync`` fails (and is noted)."""
    real, guard = engine.sync, NoBlockingEngine()
    engine.sync = guard  # type: ignore[assignment]
    try:
        yield guard
    finally:
        engine.sync = real


async def whole_copy(served: ContextEngine, session_id: str) -> MemoryStore:
    """The session ``served`` holds, copied into a :class:`MemoryStore` (every read of it
    reads the whole session: what a cold worker's reads are compared with); ``served`` and
    its store are closed (its deferred records written first)."""
    await served.flush()
    doc = await served.get_session(session_id)
    await served.close()
    await served.store.close()
    assert doc is not None, f"no session {session_id!r}"
    copy = MemoryStore()
    await copy.put_session(session_id, doc)
    return copy


def note_reads(store: Store, note: Callable[[str], None]) -> None:
    """Call ``note("read_tail")`` or ``note("read_since")`` before each of ``store``'s reads
    of a session's newest records or of a whole session (or what is new in it), so a test
    sees which reads an engine made before its model call."""
    for name in ("read_tail", "read_since"):
        read = getattr(store, name)

        def noted(*args: Any, _read: Any = read, _name: str = name, **kwargs: Any) -> Any:
            note(_name)
            return _read(*args, **kwargs)

        setattr(store, name, noted)
