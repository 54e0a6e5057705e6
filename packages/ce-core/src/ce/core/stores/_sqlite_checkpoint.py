"""Write-ahead-log checkpoints of a SQLite store, mostly off the writers' path.

SQLite copies the write-ahead log back into the database file inside the commit that grows
the log past 1,000 pages: a few milliseconds every few dozen commits, on whichever thread or
event loop made that commit. A :class:`Checkpointer` does that work earlier, in a thread of its
own: every ``every`` commits it runs a ``PASSIVE`` checkpoint (it never waits for readers or
writers) on a connection of its own, and the log starts over at the first commit after a
checkpoint that caught up with it: with pauses between commits it never reaches SQLite's
threshold. SQLite's own checkpoint stays in place: under commits without a pause the thread
does not catch up (commits go on while it copies), the log still reaches the threshold and the
commit that does copies what the thread left (measured on a model-call benchmark: a stall of
~3.5 ms instead of ~5-6 ms every ~45 calls); it still bounds the log.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

__all__ = ["CHECKPOINT_EVERY", "IDLE_SECONDS", "Checkpointer"]

logger = logging.getLogger("ce.core.stores")

CHECKPOINT_EVERY = 32
"""Commits between two checkpoints (a model call commits once or twice)."""

IDLE_SECONDS = 30.0
"""How long the thread waits for work before it ends (the next checkpoint starts another)."""


class Checkpointer:
    """Checkpoints the write-ahead log of the file at ``path`` in a background thread (see the
    module docstring); started when a checkpoint is asked for, ended after
    :data:`IDLE_SECONDS` without one (and on :meth:`close`), started again after a fork."""

    def __init__(self, path: Path, every: int = CHECKPOINT_EVERY) -> None:
        self._path = path
        self._every = every
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._commits = 0
        self._pending = False
        self._running = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self.runs = 0
        """How many checkpoints ran."""

    def committed(self) -> None:
        """Note one commit to the file; every ``every`` commits the thread checkpoints."""
        if self._pid != os.getpid():  # a forked child: the parent's thread is not here
            self._reset()
        with self._lock:
            if self._closed:
                return
            self._commits += 1
            if self._commits < self._every:
                return
            self._commits = 0
            self._pending = True
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="ce-sqlite-checkpoint", daemon=True
                )
                self._thread.start()
            self._wake.notify_all()

    def _loop(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                with self._lock:
                    self._wake.wait_for(lambda: self._pending or self._closed, IDLE_SECONDS)
                    if self._closed or not self._pending:  # closed, or idle: end
                        self._thread = None
                        return
                    self._pending, self._running = False, True
                try:
                    if conn is None:
                        conn = sqlite3.connect(self._path, isolation_level=None)
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # the next round tries again
                    logger.warning("checkpoint of %s failed: %s", self._path, exc)
                with self._lock:
                    self._running = False
                    self.runs += 1
                    self._wake.notify_all()
        finally:
            if conn is not None:
                conn.close()

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until no checkpoint is asked for or running; False after ``timeout``."""
        with self._lock:
            return self._wake.wait_for(lambda: not (self._pending or self._running), timeout)

    def close(self) -> None:
        """Stop the thread (after the checkpoint it is running)."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10.0)
