"""How the engine's coroutines run: awaited on the caller's event loop, or driven inline on
the caller's thread by the blocking engine (``engine.sync``).

The engine's work is written once, as coroutines. Awaited normally, store I/O runs in a worker
thread (so an event loop never waits on a database). Driven by :func:`drive`, the same
coroutine runs to completion on the calling thread in one go: store calls run inline, the
session lock is waited for by blocking, and the few awaits that really need an event loop (the
summarizer's model call, an async event handler) run on a short-lived loop of their own. No
private loop thread, no hand-off per call.

On an event loop the engine's calls take turns: one call at a time does its work (the CPU part
of it: matching what is new, selecting, assembling) while holding its loop's *turn*
(:func:`engine_turn`), and it gives the loop back between phases (:func:`checkpoint`). A call
waiting for the turn is not runnable, so the loop's other work (a heartbeat, the app's own
tasks, a model's streamed chunks) waits for at most one phase of one call, not for one phase
of every session in flight. A call gives the turn up while it waits for anything else (a
worker thread, another session's lock, a model call of the engine's own), so holding it never
blocks another call for longer than its own CPU work. The turn is handed on by priority: a
call coming back from such a wait first, then calls in the order they came, then records
written in the background (:func:`idle_turn`). A call holds it for the records of its session
it writes first, too: the calls of many sessions end one after another, each session's next
model call starting as soon as its own input is ready, rather than all together once every
session's work is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

__all__ = [
    "blocked_threads",
    "checkpoint",
    "drive",
    "engine_turn",
    "idle_turn",
    "in_worker_thread",
    "inline",
    "run_blocking",
    "settle",
    "turn_released",
]

_T = TypeVar("_T")

_inline: contextvars.ContextVar[bool] = contextvars.ContextVar("ce_drive_inline", default=False)
# Threads blocked until the current flow of work ends (an inline call waiting for what it
# runs on a loop of its own): a session lock they hold can never be released meanwhile.
_waiting_threads: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "ce_drive_waiting_threads", default=frozenset()
)


_RESUMING, _STARTING, _BACKGROUND = range(3)


class _Turn:
    """One event loop's turn: held by one flow at a time, handed straight to the next waiter
    when released, by priority. A flow coming back to it after giving it up for a wait (a
    commit's I/O) goes first: it finishes what it began rather than wait behind every call
    that arrived meanwhile. Then calls in order of arrival; last, records written in the
    background (see :func:`idle_turn`), so a call that the app awaits (the input of its next
    model call) does not wait behind other sessions' records."""

    __slots__ = ("_held", "_queues")

    def __init__(self) -> None:
        self._held = False
        self._queues: tuple[deque[asyncio.Future[None]], ...] = (deque(), deque(), deque())

    async def acquire(self, priority: int = _STARTING) -> None:
        if not self._held:
            self._held = True
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues[priority].append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed the turn while being cancelled: pass it on
            raise

    def release(self) -> None:
        for queue in self._queues:
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # the turn passes to it: still held
                    return
        self._held = False


# Each event loop's turn (see the module docstring), and the holding of the current flow.
_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turn] = weakref.WeakKeyDictionary()
_turns_guard = threading.Lock()


def _turn(loop: asyncio.AbstractEventLoop) -> _Turn:
    with _turns_guard:
        turn = _turns.get(loop)
        if turn is None:
            turn = _turns[loop] = _Turn()
        return turn


class _Holding:
    """A flow's hold on its loop's turn; ``held`` is False while it gave the turn up."""

    __slots__ = ("held", "turn")

    def __init__(self, turn: _Turn) -> None:
        self.turn = turn
        self.held = False


_holding: contextvars.ContextVar[_Holding | None] = contextvars.ContextVar(
    "ce_drive_turn", default=None
)


class _EngineTurn:
    """:func:`engine_turn`'s context manager (a class: it opens every engine call)."""

    __slots__ = ("holding", "token")

    def __init__(self) -> None:
        self.holding: _Holding | None = None
        self.token: contextvars.Token[_Holding | None] | None = None

    async def __aenter__(self) -> None:
        if _inline.get() or _holding.get() is not None:
            return
        holding = _Holding(_turn(asyncio.get_running_loop()))
        await asyncio.sleep(0)  # what else is ready runs first: a call starts at a phase boundary
        await holding.turn.acquire()
        holding.held = True
        self.holding = holding
        self.token = _holding.set(holding)

    async def __aexit__(self, *exc_info: object) -> None:
        holding = self.holding
        if holding is None:
            return
        assert self.token is not None
        _holding.reset(self.token)
        if holding.held:
            holding.held = False
            holding.turn.release()


def engine_turn() -> AbstractAsyncContextManager[None]:
    """Hold the running loop's turn for the body (see the module docstring); a flow that
    holds it already, and a call driven inline, go straight in."""
    return _EngineTurn()


class _TurnReleased:
    """:func:`turn_released`'s context manager."""

    __slots__ = ("holding",)

    def __init__(self) -> None:
        self.holding: _Holding | None = None

    async def __aenter__(self) -> None:
        holding = _holding.get()
        if holding is None or not holding.held:
            return
        holding.held = False
        holding.turn.release()
        self.holding = holding

    async def __aexit__(self, *exc_info: object) -> None:
        holding = self.holding
        if holding is not None:
            await holding.turn.acquire(_RESUMING)
            holding.held = True


def turn_released() -> AbstractAsyncContextManager[None]:
    """Give the loop's turn up for the body (a wait for something else), if this flow holds
    it; take it again after (a flow cancelled while taking it again holds it no more)."""
    return _TurnReleased()


async def idle_turn() -> None:
    """Wait until no engine call on the running loop holds its turn or waits for it: what a
    record written in the background (a framework hook's write-behind) waits for before it
    starts, so the calls an app awaits go first. The session's next engine call runs its
    records first anyway (read-your-writes)."""
    turn = _turn(asyncio.get_running_loop())
    await turn.acquire(_BACKGROUND)
    turn.release()


async def checkpoint() -> None:
    """Let the loop run what else is ready (on a loop; nothing when driven inline)."""
    if not _inline.get():
        await asyncio.sleep(0)


def blocked_threads(current: int | None = None) -> frozenset[int]:
    """The threads waiting for the current flow of work to end, with ``current`` (the
    calling thread when it is about to block)."""
    waiting = _waiting_threads.get()
    return waiting if current is None else waiting | {current}


def inline() -> bool:
    """Whether the current engine call is driven inline by the blocking engine."""
    return _inline.get()


WORKER_THREADS = 32
"""The engine's own worker threads (per process): store I/O and waits of calls on event loops."""

_workers: ThreadPoolExecutor | None = None
_workers_lock = threading.Lock()


def _forget_workers() -> None:
    """In a forked child: the parent's worker threads are not there."""
    global _workers, _workers_lock
    _workers, _workers_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)


async def in_worker_thread(fn: Callable[[], _T]) -> _T:
    """``fn()`` in one of the engine's own worker threads (in a copy of the current context),
    not in the loop's default executor: an app's work there (a framework's sync tools and
    result parsing) may be waiting for a session this loop's engine calls hold, and the
    calls must not wait behind it for a thread to let go of the session."""
    global _workers
    with _workers_lock:
        if _workers is None:
            _workers = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="ce-store-io")
        workers = _workers
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(workers, context.run, fn)


async def run_blocking(fn: Callable[[], _T], undo: Callable[[_T], object] | None = None) -> _T:
    """Run the blocking ``fn`` (a store's database work): inline when the engine call is
    driven inline, else in one of the engine's worker threads (:func:`in_worker_thread`) so
    the caller's event loop goes on.

    A worker thread cannot be stopped: a caller cancelled meanwhile (its event loop shutting
    down, a timeout) waits for ``fn`` to end before the cancellation goes on, so that what it
    does next (a rollback on the same connection, the connection back in its pool) never runs
    beside ``fn``; when ``fn`` returned, ``undo`` is called with its result first (to give
    back what it took: a lock, a pooled connection)."""
    if _inline.get():
        return fn()
    async with turn_released():
        running = asyncio.ensure_future(in_worker_thread(fn))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            while not running.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({running})
            if undo is not None and not running.cancelled() and running.exception() is None:
                undo(running.result())
            raise


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
    async with turn_released():
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
