"""Blocking twins of the engine's coroutines, usable with or without a running event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ce.core.engine._engine import ContextEngine

__all__ = ["SyncEngine"]

_T = TypeVar("_T")

_METHODS = (
    "prepare_turn",
    "prepare_call",
    "commit_assistant_message",
    "commit_assistant_chunk",
    "finalize_assistant_message",
    "record_tool_call",
    "record_model_usage",
    "ingest_evidence",
    "set_system_instruction",
    "update_notebook",
    "upsert_tasks",
    "put_context_block",
    "get_session",
    "list_turns",
    "get_report",
    "replay_turn",
)


class SyncEngine:
    """``engine.sync.<method>(...)`` runs ``engine.<method>(...)`` to completion and returns
    its result. The coroutine runs on a private event loop in a daemon thread, so the call
    works from plain threads and from code already inside a running loop alike (no
    ``nest_asyncio``, no "loop already running"). It blocks the calling thread."""

    def __init__(self, engine: ContextEngine) -> None:
        self._engine = engine
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="ce-engine-sync", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run any coroutine of the engine to completion from synchronous code.

        Raises :class:`RuntimeError` when called from the thread that runs these coroutines
        (code the engine itself runs, e.g. a summarizer's model, calling back into
        ``engine.sync``): that call would wait on itself forever."""
        loop = self._ensure_loop()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "engine.sync was called from the engine's own thread (code the engine runs, "
                "such as its summarizer's model call, calling back into the engine), which "
                "would wait on itself forever; await the engine's coroutine there, or run the "
                "model call inside ce.core.integration.suppressed()"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def close(self) -> None:
        """Stop the private loop (the engine's ``close`` does this)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not threading.current_thread():
                thread.join()
            loop.close()

    def __getattr__(self, name: str) -> Any:
        if name not in _METHODS:
            raise AttributeError(name)
        method = getattr(self._engine, name)

        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self.run(method(*args, **kwargs))

        blocking.__name__ = name
        blocking.__doc__ = f"Blocking twin of :meth:`ContextEngine.{name}`."
        return blocking
