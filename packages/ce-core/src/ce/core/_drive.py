"""How the engine's coroutines run: awaited on the caller's event loop, or driven inline on
the caller's thread by the blocking engine (``engine.sync``).

The engine's work is written once, as coroutines. Awaited normally, store I/O runs in a worker
thread (so an event loop never waits on a database). Driven by :func:`drive`, the same
coroutine runs to completion on the calling thread in one go: store calls run inline, the
session lock is waited for by blocking, and the few awaits that really need an event loop (the
summarizer's model call, an async event handler) run on a short-lived loop of their own. No
private loop thread, no hand-off per call.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["blocked_threads", "drive", "inline", "run_blocking", "settle"]

_T = TypeVar("_T")

_inline: contextvars.ContextVar[bool] = contextvars.ContextVar("ce_drive_inline", default=False)
# Threads blocked until the current flow of work ends (an inline call waiting for what it
# runs on a loop of its own): a session lock they hold can never be released meanwhile.
_waiting_threads: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "ce_drive_waiting_threads", default=frozenset()
)


def blocked_threads(current: int | None = None) -> frozenset[int]:
    """The threads waiting for the current flow of work to end, with ``current`` (the
    calling thread when it is about to block)."""
    waiting = _waiting_threads.get()
    return waiting if current is None else waiting | {current}


def inline() -> bool:
    """Whether the current engine call is driven inline by the blocking engine."""
    return _inline.get()


async def run_blocking(fn: Callable[[], _T]) -> _T:
    """Run the blocking ``fn`` (a store's database work): inline when the engine call is
    driven inline, else in a worker thread so the caller's event loop goes on."""
    if _inline.get():
        return fn()
    return await asyncio.to_thread(fn)


async def _awaited(awaitable: Awaitable[_T]) -> _T:
    return await awaitable


def _on_own_loop(awaitable: Awaitable[_T]) -> _T:
    """``awaitable`` run to completion on a fresh event loop in a helper thread, in a copy of
    the current context (so ``suppressed()`` and ``engine.session()`` still apply)."""
    context = contextvars.copy_context()
    context.run(_inline.set, False)
    context.run(_waiting_threads.set, blocked_threads(threading.get_ident()))
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = context.run(asyncio.run, _awaited(awaitable))
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="ce-engine-await", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


async def settle(awaitable: Awaitable[_T]) -> _T:
    """Await something that may truly need an event loop (a model call, an async event
    handler): on the caller's loop normally; on a loop of its own when the engine call is
    driven inline."""
    if _inline.get():
        return _on_own_loop(awaitable)
    return await awaitable


def drive(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run one of the engine's coroutines to completion on the calling thread, with store
    I/O inline (see the module docstring); works with or without a running event loop in
    this thread. Raises :class:`RuntimeError` if the coroutine waits on an event loop all the
    same (an awaitable the engine does not route through :func:`settle`)."""
    token = _inline.set(True)
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        _inline.reset(token)
    coro.close()
    raise RuntimeError(
        f"an engine coroutine waited on an event loop ({yielded!r}) while driven inline by "
        "engine.sync; await the engine's coroutine method instead"
    )
