"""``SQLiteStore``: the embedded default store — one SQLite file, a row per record.

Layout (``PRAGMA user_version`` = :data:`USER_VERSION`): ``sessions`` holds one row per session
(version, schema version, the ``summary`` / ``run`` / ``meta`` JSON and ``user_id`` from
``meta.actor.user_id`` for compliance queries); ``messages``, ``tool_calls``, ``model_usage``,
``evidences``, ``context_blocks``, ``tasks`` and ``turns`` (the turn records kept beside the
document) hold one row per record (``session_id``, an ordering ``seq``, the record id — unique
per session — the version of the commit that wrote it, and the record's JSON ``body``);
``audit`` holds the compliance log. A commit reads only the session row and inserts the new
rows, so appending a message costs the same at 10 and at 10,000 stored messages.

The ``sessions`` row also holds the session's ``epoch`` (see
:class:`~ce.core.stores.base.SessionUpdate`), renewed when the session is created or its
records are replaced or removed; each record table has an index on ``(session_id, version)``,
so :meth:`SQLiteStore.read_since` reads only the rows written after a version.

Layout versions: 1 had no ``turns`` table; 2 had no ``epoch`` column and no version indexes.
Opening an older file upgrades it to the current version (3).
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Concatenate, Literal, NamedTuple, ParamSpec, TypeVar

from pydantic import BaseModel

from ce.core._drive import inline, run_blocking
from ce.core.errors import StoreError
from ce.core.primitives import Clock, IdGenerator
from ce.core.schema import (
    ContextBlock,
    Evidence,
    Message,
    PutResult,
    SessionDocument,
    TurnRecord,
)
from ce.core.stores import _sqlite_sql as sql
from ce.core.stores import _sqlite_write as write
from ce.core.stores._sqlite_checkpoint import Checkpointer
from ce.core.stores._sqlite_locks import (
    WRITE_LOCK,
    LockFile,
    LockTimeout,
    lock_path,
    session_offset,
)
from ce.core.stores._sqlite_locks import supported as locks_supported
from ce.core.stores._writers import SessionWriter
from ce.core.stores.base import (
    AuditRecord,
    BaseStore,
    BlockFilter,
    EvidenceFilter,
    SessionChanges,
    SessionSlice,
    SessionUpdate,
    check_slice_size,
    filter_blocks,
    filter_evidences,
)

__all__ = ["USER_VERSION", "SQLiteStore"]

logger = logging.getLogger("ce.core.stores")

USER_VERSION = sql.USER_VERSION
"""The layout version this module writes into ``PRAGMA user_version``."""


_P = ParamSpec("_P")
_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)


class SQLiteStore(BaseStore):
    """Sessions in one SQLite file (WAL mode), one row per record.

    One connection, guarded by a lock; awaited, its work runs in a worker thread, and driven
    inline by ``engine.sync`` it runs on the calling thread, so a store can be shared by
    threads and event loops; any number of stores (in any number of
    processes) may open the same file. Writes are ``BEGIN IMMEDIATE`` transactions that wait
    up to ``busy_timeout`` seconds for another writer. With ``lock_files`` (the default; on
    Linux) writers also lock the session they write and then the file in a lock file beside
    the database (``<file>-ce-lock``, see :mod:`~ce.core.stores._sqlite_locks`): a writer
    waiting for another wakes the moment it is done, and the engine holds each session it
    writes from its read to its commit (:attr:`prefers_holding`), so no commit is ever
    refused, while writers of other sessions go on. Turn it off where the file lives on a
    filesystem without such locks (some network filesystems); every process that writes the
    file should use the same setting. ``synchronous="NORMAL"`` (the default)
    keeps the file consistent on power loss but may lose the last commits; ``"FULL"`` makes
    each commit durable at the cost of an fsync. The write-ahead log is copied back into the
    file by a thread of the store's own every few dozen commits, so that commits do little of
    it (SQLite checkpoints inside the commit that grows the log past 1,000 pages, stalling that
    caller; under commits without a pause it still does, copying what the thread left).
    Deleted content is overwritten in the file
    and its write-ahead log (``secure_delete``, then a truncating checkpoint).

    Opening creates missing parent directories and the schema. Raises :class:`StoreError`
    naming the path when the file is not a database, has a newer layout, or cannot be opened.
    """

    keeps_json = True
    keeps_token_counts = True

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = 10.0,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        lock_files: bool = True,
        id_generator: IdGenerator | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(id_generator=id_generator, clock=clock)
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}")
        self.path = Path(path)
        self._lock = threading.Lock()
        self._busy_ms = int(busy_timeout * 1000)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{self.path}: cannot open SQLite store: {exc}") from exc
        try:
            sql.prepare(conn, synchronous, busy_timeout)
        except (sqlite3.Error, StoreError) as exc:
            conn.close()
            raise StoreError(f"{self.path}: cannot open SQLite store: {exc}") from exc
        self._conn: sqlite3.Connection | None = conn
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        # per-session locks beside the file, one lock file per connection (see _sqlite_locks)
        locked = lock_files and locks_supported()
        # the real path: stores that name the file through a link share its locks
        self._lock_path = lock_path(self.path.resolve()) if locked else None
        try:
            self._locks = self._lock_file()
        except StoreError as exc:
            # e.g. a lock file made by another user: still correct without it (its holders'
            # commits check their versions), only slower under contention
            logger.warning("%s; holding sessions with SQLite's write lock instead", exc)
            self._lock_path = self._locks = None
        self._no_wait = False  # set while the connection is tried without waiting
        self._idle_writers: list[_Lane] = []  # connections of `writer` blocks
        # the write-ahead log goes back into the file mostly in a thread of its own, not
        # inside a commit (see _sqlite_checkpoint)
        self._checkpointer = Checkpointer(self.path)

    @property
    def prefers_holding(self) -> bool:
        """Whether holding a session (:meth:`writer`) costs no more than an optimistic commit:
        True where the platform has the per-session locks (see
        :class:`~ce.core.stores.WriterStore`)."""
        return self._locks is not None

    # -- plumbing ---------------------------------------------------------------------------

    async def _run(
        self,
        fn: Callable[Concatenate[sqlite3.Connection, _P], _T],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        return await run_blocking(functools.partial(self._locked, fn, *args, **kwargs))

    async def _run_quick(
        self,
        fn: Callable[Concatenate[sqlite3.Connection, _P], _T],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        """Like :meth:`_run` for short work (a commit, a catch-up read): on an event loop it
        runs right here when it need not wait (the connection is free and, for a write, no
        other writer holds the session or the file), which costs less than a hop to a worker
        thread;
        work that would wait goes to a worker thread (rolled back first, so it runs once)."""
        if inline() or not self._lock.acquire(blocking=False):
            return await self._run(fn, *args, **kwargs)
        try:
            conn = self._conn
            if conn is None:
                raise StoreError(f"{self.path}: store is closed")
            conn.execute("PRAGMA busy_timeout = 0")
            self._no_wait = True
            try:
                return fn(conn, *args, **kwargs)
            except _WouldWait:
                pass
            except sqlite3.OperationalError as exc:
                if not sql.busy(exc):
                    raise StoreError(f"{self.path}: {exc}") from exc
            except (sqlite3.Error, StoreError) as exc:
                raise StoreError(f"{self.path}: {exc}") from exc
            finally:
                self._no_wait = False
                conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        finally:
            self._lock.release()
        return await self._run(fn, *args, **kwargs)

    def _lock_file(self) -> LockFile | None:
        """A lock file of the store's own (see :mod:`~ce.core.stores._sqlite_locks`), or None
        where the platform has no such locks."""
        if self._lock_path is None:
            return None
        try:
            return LockFile(self._lock_path)
        except OSError as exc:
            raise StoreError(f"{self._lock_path}: cannot open the lock file: {exc}") from exc

    def _take(self, locks: LockFile, offset: int) -> None:
        """Take the lock byte ``offset`` of ``locks``, waiting for its holder, or raise
        :class:`_WouldWait` when the store's connection is tried without waiting."""
        if locks.try_lock(offset):
            return
        if self._no_wait and locks is self._locks:
            raise _WouldWait
        try:
            locks.lock(offset, self._busy_timeout)
        except (LockTimeout, OSError) as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    async def _take_async(self, locks: LockFile, offset: int) -> None:
        """Take the lock byte ``offset``: right here when it is free, else waited for in a
        worker thread (inline, when the engine call is driven inline)."""
        if not locks.try_lock(offset):
            await run_blocking(
                functools.partial(self._take, locks, offset), undo=lambda _: locks.unlock(offset)
            )

    def _session_write(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        fn: Callable[Concatenate[sqlite3.Connection, _P], _T],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        """``fn(conn, ...)``, a write of the session on the store's connection, holding the
        session's lock and then the file's write lock (where the platform has them): it waits
        for a writer holding the session, and other writers wait for it in the kernel, not in
        SQLite's sleeps."""
        locks = self._locks
        if locks is None:
            return fn(conn, *args, **kwargs)
        offset = session_offset(session_id)
        self._take(locks, offset)
        try:
            self._take(locks, WRITE_LOCK)
            try:
                return fn(conn, *args, **kwargs)
            finally:
                locks.unlock(WRITE_LOCK)
        finally:
            locks.unlock(offset)

    def _locked(
        self,
        fn: Callable[Concatenate[sqlite3.Connection, _P], _T],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        with self._lock:
            if self._conn is None:
                raise StoreError(f"{self.path}: store is closed")
            try:
                return fn(self._conn, *args, **kwargs)
            except (sqlite3.Error, StoreError) as exc:
                raise StoreError(f"{self.path}: {exc}") from exc

    # -- a session held for one writer -------------------------------------------------------

    @asynccontextmanager
    async def writer(self, session_id: str) -> AsyncIterator[SessionWriter]:
        """Hold the session for one writer (see :class:`~ce.core.stores.WriterStore`), on a
        connection of the block's own, from the read to the commit: with the session's lock
        (see :mod:`~ce.core.stores._sqlite_locks`), which keeps only the writers of this
        session waiting; where the platform has no such locks, with a ``BEGIN IMMEDIATE``
        transaction, which keeps every writer of the file waiting. Waiting happens in a
        worker thread, never on the event loop."""
        with self._lock:
            if self._conn is None:
                raise StoreError(f"{self.path}: store is closed")
            lane = self._idle_writers.pop() if self._idle_writers else None
        if lane is None:
            try:
                conn = sqlite3.connect(
                    self.path,
                    timeout=self._busy_timeout,
                    isolation_level=None,
                    check_same_thread=False,
                )
                conn.execute(f"PRAGMA synchronous = {self._synchronous}")
                conn.execute("PRAGMA secure_delete = ON")
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: {exc}") from exc
            lane = _Lane(conn, self._lock_file())
        held = _Writer(self, lane, session_id)
        try:
            await held.hold()
            yield held
        finally:
            try:
                held.release()
            except sqlite3.Error as exc:
                lane.close()
                raise StoreError(f"{self.path}: {exc}") from exc
            with self._lock:
                if self._conn is None:
                    lane.close()
                else:
                    self._idle_writers.append(lane)

    async def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE`` on ``conn``: tried here first, waited for in a worker thread
        when another writer holds the file's write lock."""
        try:
            if inline():
                conn.execute("BEGIN IMMEDIATE")
                return
            conn.execute("PRAGMA busy_timeout = 0")
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not sql.busy(exc):
                    raise
            finally:
                conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            await run_blocking(lambda: conn.execute("BEGIN IMMEDIATE"))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    # -- writes -----------------------------------------------------------------------------

    async def _commit(
        self, session_id: str, changes: SessionChanges, expected_version: int | None
    ) -> PutResult:
        version, epoch = await self._run_quick(
            self._session_write, session_id, write.commit, session_id, changes, expected_version
        )
        self._checkpointer.committed()
        return PutResult(success=True, version=version, epoch=epoch)

    async def _put_session(
        self, session_id: str, doc: SessionDocument, expected_version: int | None
    ) -> PutResult:
        version, epoch = await self._run(
            self._session_write, session_id, write.put, session_id, doc, expected_version
        )
        self._checkpointer.committed()
        return PutResult(success=True, version=version, epoch=epoch)

    async def delete_session(self, session_id: str) -> bool:
        record = self._audit_record("delete_session", session_id)
        return await self._run(self._session_write, session_id, write.delete_session, record)

    async def delete_evidence(self, session_id: str, evidence_id: str) -> bool:
        record = self._audit_record("delete_evidence", session_id, evidence_id)
        return await self._run(self._session_write, session_id, write.delete_evidence, record)

    # -- reads ------------------------------------------------------------------------------

    async def get_session(self, session_id: str) -> SessionDocument | None:
        return await self._run(sql.load, session_id)

    async def get_version(self, session_id: str) -> int:
        return await self._run_quick(sql.version, session_id)

    async def read_since(
        self, session_id: str, version: int = 0, epoch: str = ""
    ) -> SessionUpdate | None:
        """What changed after ``version`` of ``epoch``: only the rows written since, found
        through the version indexes, in one read snapshot."""
        if version:  # a catch-up reads what is new: short
            return await self._run_quick(sql.read_since, session_id, version, epoch)
        return await self._run(sql.read_since, session_id, version, epoch)

    async def read_tail(
        self, session_id: str, *, messages: int, evidences: int
    ) -> SessionSlice | None:
        """The newest records of the session (see :class:`~ce.core.stores.base.SliceStore`),
        in one read snapshot: the rows of the slice, found through the tables' keys and
        partial indexes, never the whole session."""
        check_slice_size(messages, evidences)
        return await self._run(sql.read_tail, session_id, messages, evidences)

    async def read_messages(self, session_id: str, message_ids: Sequence[str]) -> list[Message]:
        """The session's messages with one of ``message_ids`` (see
        :class:`~ce.core.stores.base.SliceStore`), through the messages' key."""
        if not message_ids:
            return []
        return await self._run_quick(sql.messages_by_id, session_id, list(message_ids))

    async def read_evidences(self, session_id: str, dedup_keys: Sequence[str]) -> list[Evidence]:
        """The session's evidences with one of ``dedup_keys`` (see
        :class:`~ce.core.stores.base.SliceStore`), through the ``dedup`` index."""
        if not dedup_keys:
            return []
        return await self._run_quick(sql.evidences_by_dedup, session_id, list(dedup_keys))

    async def get_evidence(self, session_id: str, evidence_id: str) -> Evidence | None:
        return await self._run(sql.evidence, session_id, evidence_id)

    async def list_evidences(
        self, session_id: str, filter: EvidenceFilter | None = None
    ) -> list[Evidence]:
        evidences = await self._run(sql.records, "evidences", Evidence, session_id)
        return filter_evidences(evidences, filter)

    async def list_context_blocks(
        self, session_id: str, filter: BlockFilter | None = None
    ) -> list[ContextBlock]:
        blocks = await self._run(sql.records, "context_blocks", ContextBlock, session_id)
        return filter_blocks(blocks, filter)

    async def _list_turns(self, session_id: str, limit: int | None) -> list[TurnRecord]:
        return await self._run(sql.turns, session_id, limit)

    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord | None:
        return await self._run(sql.turn, session_id, turn_id)

    async def list_sessions(self, user_id: str | None = None) -> list[str]:
        return await self._run(sql.session_ids, user_id)

    async def audit_log(self, session_id: str | None = None) -> list[AuditRecord]:
        return await self._run(sql.audit, session_id)

    async def close(self) -> None:
        def close() -> None:
            self._checkpointer.close()
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                if self._locks is not None:
                    self._locks.close()
                for idle in self._idle_writers:
                    idle.close()
                self._idle_writers.clear()

        await run_blocking(close)


class _WouldWait(Exception):
    """A lock the store's connection was tried for without waiting is held by another."""


class _Lane(NamedTuple):
    """A connection of :meth:`SQLiteStore.writer` blocks and its lock file."""

    conn: sqlite3.Connection
    locks: LockFile | None

    def close(self) -> None:
        self.conn.close()
        if self.locks is not None:
            self.locks.close()


class _Writer:
    """The :class:`SessionWriter` of :meth:`SQLiteStore.writer`: with a lock file, the
    session's lock from :meth:`hold` to the first commit, and a write transaction for each
    commit (checked against the version read, in case a writer that does not take the lock
    wrote: a process of a ce-core from before the lock files); without one, a ``BEGIN
    IMMEDIATE`` transaction from :meth:`hold` to the first commit. A second commit holds the
    session again."""

    def __init__(self, store: SQLiteStore, lane: _Lane, session_id: str) -> None:
        self._store = store
        self._conn = lane.conn
        self._locks = lane.locks
        self._offset = session_offset(session_id)
        self._session_id = session_id
        self._version: int | None = None  # after the block's last read or commit
        self._held = False

    async def hold(self) -> None:
        if self._locks is None:
            await self._store._begin_immediate(self._conn)
            return
        await self._store._take_async(self._locks, self._offset)
        self._held = True

    def release(self) -> None:
        """Roll back what is open, let go of the session."""
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")
        if self._held and self._locks is not None:
            self._held = False
            self._locks.unlock(self._offset)

    async def read_since(self, version: int = 0, epoch: str = "") -> SessionUpdate | None:
        conn, locks = self._conn, self._locks

        def read() -> SessionUpdate | None:
            if locks is None:  # inside the block's write transaction
                return sql.read_since_in(conn, self._session_id, version, epoch)
            # the session is held: a reader at the stored version needs one statement, a
            # catch-up reads one snapshot
            return sql.read_since(conn, self._session_id, version, epoch)

        try:  # a whole session may be long to read: not on the event loop
            update = read() if version else await run_blocking(read)
        except sqlite3.Error as exc:
            raise StoreError(f"{self._store.path}: {exc}") from exc
        if locks is not None:
            self._version = update.version if update is not None else 0
        return update

    async def _begin(self, conn: sqlite3.Connection) -> None:
        """The commit's ``BEGIN IMMEDIATE``. Holding the lock file's write lock, no writer
        of the file holds SQLite's but a process that writes it without lock files (a
        ce-core from before them, during an upgrade): begun right here, at most waiting for
        that one's transaction, rather than tried without waiting first (two statements
        more on every commit)."""
        if self._locks is None:
            await self._store._begin_immediate(conn)
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"{self._store.path}: {exc}") from exc

    async def commit(self, changes: SessionChanges) -> PutResult:
        conn, locks, store = self._conn, self._locks, self._store
        checked = store._checked(self._session_id, changes)
        if locks is not None:
            if not self._held:  # a second commit of the block: hold the session again
                await self.hold()
            await store._take_async(locks, WRITE_LOCK)
        try:
            if not conn.in_transaction:  # a second commit of the block, or a lock file
                await self._begin(conn)
            try:
                version, epoch, _ = write.apply(conn, self._session_id, checked, self._version)
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"{store.path}: {exc}") from exc
                raise
        finally:
            if locks is not None:
                locks.unlock(WRITE_LOCK)
                self.release()  # the commit ends the hold
        self._version = version
        store._checkpointer.committed()
        return PutResult(success=True, version=version, epoch=epoch)
