"""A session held for one writer (``WriterStore.writer``) on SQLite and PostgreSQL, and the
engine's use of it: a commit refused because another worker wrote first is done again holding
the session, and that one is not refused.

The PostgreSQL cases need the ``postgres_dsn`` fixture (tests/core/conftest.py), which skips
without a server.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from ce.core._drive import run_blocking
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.errors import SchemaValidationError, StoreError, VersionConflictError
from ce.core.events import InMemoryEventBus
from ce.core.primitives import SequentialIdGenerator
from ce.core.schema import Message, Role
from ce.core.stores import (
    MemoryStore,
    PostgresStore,
    SessionChanges,
    SQLiteStore,
    Store,
    WriterStore,
)
from ce.core.stores import _sqlite_sql as sqlite_sql
from ce.core.stores._sqlite_locks import LockFile, lock_path, session_offset
from ce.core.stores._sqlite_locks import supported as locks_supported
from ce.core.stores.base import OwnedChanges

Opener = Callable[[], Any]
"""Opens another store object on the same storage (the ``opener`` fixture of conftest.py)."""


def _message(text: str, message_id: str | None = None) -> Message:
    return Message(role=Role.USER, content=text, message_id=message_id)


@pytest.fixture
async def stores(opener: Opener) -> AsyncIterator[tuple[Any, Any]]:
    """Two workers' store objects on the same storage."""
    first, second = opener(), opener()
    yield first, second
    await first.close()
    await second.close()


def _held_elsewhere(store: Any, session_id: str) -> bool:
    """Whether a writer that does not wait finds the session held (another connection)."""
    if isinstance(store, SQLiteStore) and store.prefers_holding:
        other = LockFile(lock_path(store.path))
        try:
            free = other.try_lock(session_offset(session_id))
            other.unlock(session_offset(session_id))
            return not free
        finally:
            other.close()
    if isinstance(store, SQLiteStore):
        conn = sqlite3.connect(store.path, timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError as exc:
            assert "locked" in str(exc)
            return True
        finally:
            conn.close()
    import psycopg
    from psycopg import errors

    assert isinstance(store, PostgresStore)
    with psycopg.connect(store._pool.conninfo, autocommit=True) as conn:  # type: ignore[union-attr]
        try:
            with conn.transaction():
                conn.execute(
                    f'SELECT 1 FROM "{store.schema}".sessions WHERE session_id = %s'
                    " FOR UPDATE NOWAIT",
                    (session_id,),
                )
            return False
        except errors.LockNotAvailable:
            return True


async def test_stores_that_hold_sessions_say_so(stores: tuple[Any, Any]) -> None:
    assert isinstance(stores[0], WriterStore)


async def test_a_writer_reads_and_commits_while_others_wait(stores: tuple[Any, Any]) -> None:
    first, second = stores
    await first.commit("s", SessionChanges(messages=[_message("one", "m1")]))
    assert not _held_elsewhere(first, "s")
    async with first.writer("s") as writer:
        assert _held_elsewhere(first, "s")
        update = await writer.read_since()
        assert update is not None and update.complete
        assert [m.content for m in update.changes.messages] == ["one"]
        caught_up = await writer.read_since(update.version, update.epoch)
        assert caught_up is not None and not caught_up.changes.messages
        assert await second.get_version("s") == update.version
        result = await writer.commit(SessionChanges(messages=[_message("two", "m2")]))
        assert result.version == update.version + 1
        # stored when the commit returns, and the hold ends with it
        assert await second.get_version("s") == update.version + 1
        assert not _held_elsewhere(first, "s")
    doc = await second.get_session("s")
    assert doc is not None
    assert [m.content for m in doc.session.messages] == ["one", "two"]
    assert await second.get_version("s") == update.version + 1


async def test_a_writer_creates_a_session_and_an_empty_block_creates_none(
    stores: tuple[Any, Any],
) -> None:
    first, second = stores
    async with first.writer("new") as writer:
        assert await writer.read_since() is None
    assert await second.get_version("new") == 0
    assert await second.list_sessions() == []
    async with first.writer("new") as writer:
        assert await writer.read_since() is None
        result = await writer.commit(SessionChanges(messages=[_message("hi", "m1")]))
        assert result.version == 1
        again = await writer.commit(SessionChanges(messages=[_message("hi", "m1")]))
        assert again.version == 1  # nothing new: no new version
    assert await second.get_version("new") == 1
    assert await second.list_sessions() == ["new"]


async def test_what_was_committed_stays_when_the_block_raises_after_it(
    stores: tuple[Any, Any],
) -> None:
    first, second = stores
    with pytest.raises(RuntimeError, match="after the commit"):
        async with first.writer("s") as writer:
            await writer.commit(SessionChanges(messages=[_message("kept", "m1")]))
            raise RuntimeError("after the commit")
    doc = await second.get_session("s")
    assert doc is not None and [m.content for m in doc.session.messages] == ["kept"]


async def test_a_failed_commit_stores_nothing_and_the_store_goes_on(
    stores: tuple[Any, Any],
) -> None:
    first, second = stores
    await first.commit("s", SessionChanges(messages=[_message("one", "m1")]))
    bad = _message("bad", "m3")
    bad.role = "not a role"  # type: ignore[assignment]
    with pytest.raises(SchemaValidationError):
        async with first.writer("s") as writer:
            await writer.commit(SessionChanges(messages=[_message("two", "m2"), bad]))
    doc = await second.get_session("s")
    assert doc is not None and [m.content for m in doc.session.messages] == ["one"]
    assert not _held_elsewhere(first, "s")
    async with first.writer("s") as writer:
        await writer.commit(SessionChanges(messages=[_message("two", "m2")]))
    assert await second.get_version("s") == 2


@pytest.mark.parametrize("held", [True, False], ids=["writer", "commit"])
async def test_the_engines_records_are_serialized_strictly_not_validated_again(
    stores: tuple[Any, Any], held: bool
) -> None:
    """A store that keeps only JSON does not validate the engine's records again
    (``OwnedChanges``), but a value of another type than its field's still refuses the
    whole commit: nothing of it is stored, and the store goes on."""
    first, second = stores
    assert first.keeps_json

    async def commit(changes: SessionChanges) -> None:
        if held:
            async with first.writer("s") as writer:
                await writer.commit(changes)
        else:
            await first.commit("s", changes)

    await commit(OwnedChanges(messages=[_message("one", "m1")]))
    bad_role = _message("bad", "m3")
    bad_role.role = "not a role"  # type: ignore[assignment]
    bad_text = _message("", "m4").model_copy(update={"content": 5})
    for bad in (bad_role, bad_text):
        with pytest.raises(SchemaValidationError, match="not JSON-serializable"):
            await commit(OwnedChanges(messages=[_message("two", "m2"), bad]))
    doc = await second.get_session("s")
    assert doc is not None and [m.content for m in doc.session.messages] == ["one"]
    assert not _held_elsewhere(first, "s")
    await commit(OwnedChanges(messages=[_message("two", "m2")]))
    doc = await second.get_session("s")
    assert doc is not None and [m.content for m in doc.session.messages] == ["one", "two"]


async def test_a_store_that_keeps_records_copies_the_engines_own() -> None:
    """A store that keeps the record objects (the in-memory one) validates ``OwnedChanges``
    again into records of its own: what the caller changes afterwards is not stored."""
    store = MemoryStore()
    assert not store.keeps_json
    message = _message("as committed", "m1")
    await store.commit("s", OwnedChanges(messages=[message]))
    message.content = "changed afterwards"
    doc = await store.get_session("s")
    assert doc is not None and [m.content for m in doc.session.messages] == ["as committed"]


async def test_a_second_commit_holds_again_and_is_refused_after_another_writer(
    stores: tuple[Any, Any],
) -> None:
    first, second = stores
    async with first.writer("s") as writer:
        one = await writer.commit(SessionChanges(messages=[_message("one", "m1")]))
        two = await writer.commit(SessionChanges(messages=[_message("two", "m2")]))
        assert two.version == one.version + 1
        await second.commit("s", SessionChanges(messages=[_message("other", "o1")]))
        with pytest.raises(VersionConflictError):
            await writer.commit(SessionChanges(messages=[_message("three", "m3")]))
    doc = await second.get_session("s")
    assert doc is not None
    assert [m.content for m in doc.session.messages] == ["one", "two", "other"]


async def test_a_closed_store_holds_nothing(opener: Opener) -> None:
    store = opener()
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        async with store.writer("s"):
            pass


class _Interleaved:
    """Wraps a store's ``commit`` so that another worker writes the session just before this
    worker's first commit: that commit is refused for its version."""

    def __init__(self, store: Any, other: ContextEngine, session_id: str) -> None:
        self.store = store
        self.other = other
        self.session_id = session_id
        self.real_commit = store.commit
        self.commits = 0
        store.commit = self.commit

    async def commit(self, session_id: str, changes: Any, expected_version: Any = None) -> Any:
        self.commits += 1
        if self.commits == 1:
            await self.other.prepare_turn(self.session_id, "from the other worker")
        return await self.real_commit(session_id, changes, expected_version)


@pytest.mark.parametrize("new_session", [False, True])
async def test_a_refused_commit_is_done_again_holding_the_session(
    opener: Opener, new_session: bool
) -> None:
    config = RuntimeConfig(model_hint="gpt-4o")
    events: list[Any] = []
    bus = InMemoryEventBus()
    bus.on_all(events.append)
    mine: Store = opener()
    if getattr(mine, "prefers_holding", False):
        pytest.skip("the engine holds every write of this store: none is refused")
    # no optimistic retries at all: only holding the session can save the call
    engine = ContextEngine(
        mine,
        config=config,
        conflict_retries=0,
        event_bus=bus,
        id_generator=SequentialIdGenerator("a"),
    )
    other = ContextEngine(opener(), config=config, id_generator=SequentialIdGenerator("b"))
    before = [] if new_session else ["first"]
    if not new_session:
        await engine.prepare_turn("s", "first")
    interleaved = _Interleaved(mine, other, "s")
    result = await engine.prepare_turn("s", "mine")
    assert interleaved.commits == 1  # the redo committed through the held session
    assert any("version_conflict" in error for error in result.report.errors)
    assert [e.payload.get("reason") for e in events if e.event_type == "Error"] == [
        "version_conflict"
    ]
    users = [p.content for p in result.assembled_input.parts if p.role is Role.USER]
    assert users == [*before, "from the other worker", "mine"]
    doc = await other.store.get_session("s")
    assert doc is not None
    assert [m.content for m in doc.session.messages] == [*before, "from the other worker", "mine"]
    # its turn record counts the messages the redo saw
    assert (await other.store.list_turns("s"))[-1].message_count == len(before) + 2
    # for a while the session counts as contended: the next write holds it from the start
    follow = await engine.prepare_turn("s", "next")
    assert [p.content for p in follow.assembled_input.parts if p.role is Role.USER][-1] == "next"
    assert interleaved.commits == 1 and not follow.report.errors
    # then the engine goes back to optimistic commits, from the held commits' version
    engine._contention.clear()
    last = await engine.prepare_turn("s", "last")
    assert interleaved.commits == 2 and not last.report.errors
    assert [p.content for p in last.assembled_input.parts if p.role is Role.USER][-2:] == [
        "next",
        "last",
    ]
    await engine.close()
    await other.close()


def test_the_blocking_engine_holds_the_session_on_its_own_thread(opener: Opener) -> None:
    config = RuntimeConfig(model_hint="gpt-4o")
    mine: Store = opener()
    if getattr(mine, "prefers_holding", False):
        pytest.skip("the engine holds every write of this store: none is refused")
    engine = ContextEngine(mine, config=config, conflict_retries=0)
    other = ContextEngine(opener(), config=config, id_generator=SequentialIdGenerator("b"))
    engine.sync.prepare_turn("s", "first")
    interleaved = _Interleaved(mine, other, "s")
    result = engine.sync.prepare_turn("s", "mine")
    assert interleaved.commits == 1
    users = [p.content for p in result.assembled_input.parts if p.role is Role.USER]
    assert users == ["first", "from the other worker", "mine"]
    engine.sync.close()
    other.sync.close()


async def test_writers_that_keep_meeting_keep_holding_the_session(opener: Opener) -> None:
    config = RuntimeConfig(model_hint="gpt-4o")
    store = opener()
    if getattr(store, "prefers_holding", False):
        pytest.skip("the engine holds every write of this store")
    engine = ContextEngine(store, config=config, id_generator=SequentialIdGenerator("a"))
    other = ContextEngine(opener(), config=config, id_generator=SequentialIdGenerator("b"))
    await engine.prepare_turn("s", "first")
    # the session is contended (a refused commit a moment ago) until `until`
    until = time.monotonic() + 60
    engine._contention["s"] = until
    await other.prepare_turn("s", "from the other worker")
    await engine.prepare_turn("s", "mine")  # held: its catch-up finds the other's records
    extended = engine._contention["s"]
    assert extended != until  # contended from now on for CONTENDED_SECONDS more
    await engine.prepare_turn("s", "mine again")  # held: nobody else wrote in between
    assert engine._contention["s"] == extended
    doc = await other.store.get_session("s")
    assert doc is not None
    assert [m.content for m in doc.session.messages] == [
        "first",
        "from the other worker",
        "mine",
        "mine again",
    ]
    await engine.close()
    await other.close()


lock_files = pytest.mark.skipif(not locks_supported(), reason="no per-session lock files here")


@lock_files
async def test_a_held_session_keeps_only_its_own_writers_waiting(tmp_path: Path) -> None:
    first = SQLiteStore(tmp_path / "s.db")
    second = SQLiteStore(tmp_path / "s.db", busy_timeout=0.5)
    assert first.prefers_holding
    await first.commit("s", SessionChanges(messages=[_message("one", "m1")]))
    async with first.writer("s") as writer:
        update = await writer.read_since()
        assert update is not None
        # another session's commit goes on while "s" is held...
        await second.commit("t", SessionChanges(messages=[_message("other", "t1")]))
        assert _held_elsewhere(first, "s") and not _held_elsewhere(first, "t")
        # ...and a writer of "s" waits for the block, then gives up (its busy timeout)
        with pytest.raises(StoreError, match="waited"):
            await second.commit("s", SessionChanges(messages=[_message("late", "m9")]))
        await writer.commit(SessionChanges(messages=[_message("two", "m2")]))
    await second.commit("s", SessionChanges(messages=[_message("three", "m3")]))
    doc = await second.get_session("s")
    assert doc is not None
    assert [m.content for m in doc.session.messages] == ["one", "two", "three"]
    await first.close()
    await second.close()


@lock_files
async def test_the_engine_holds_every_write_where_the_store_prefers_it(tmp_path: Path) -> None:
    config = RuntimeConfig(model_hint="gpt-4o")
    events: list[Any] = []
    bus = InMemoryEventBus()
    bus.on_all(events.append)
    mine = SQLiteStore(tmp_path / "s.db")
    engine = ContextEngine(mine, config=config, conflict_retries=0, event_bus=bus)
    other = ContextEngine(
        SQLiteStore(tmp_path / "s.db"), config=config, id_generator=SequentialIdGenerator("b")
    )
    await engine.prepare_turn("s", "first")
    # would write the session just before an optimistic commit: there is none
    interleaved = _Interleaved(mine, other, "s")
    await engine.prepare_turn("s", "second")
    assert interleaved.commits == 0
    await other.prepare_turn("s", "from the other worker")  # between two of this engine's
    result = await engine.prepare_turn("s", "third")
    users = [p.content for p in result.assembled_input.parts if p.role is Role.USER]
    assert users == ["first", "second", "from the other worker", "third"]
    assert not result.report.errors
    assert engine._contention == {}  # nothing to track when every write holds
    assert [e for e in events if e.event_type == "Error"] == []
    await engine.close()
    await other.close()


async def test_a_sqlite_store_without_lock_files_holds_the_whole_file(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db", lock_files=False)
    other = SQLiteStore(tmp_path / "s.db", lock_files=False)
    assert not store.prefers_holding
    assert not (tmp_path / "s.db-ce-lock").exists()
    async with store.writer("s") as writer:
        assert await writer.read_since() is None
        assert _held_elsewhere(other, "t")  # any session: the file's write lock
    await store.close()
    await other.close()


@lock_files
def test_blocking_engines_on_threads_wait_for_each_other_on_one_session(tmp_path: Path) -> None:
    config = RuntimeConfig(model_hint="gpt-4o")
    engines = [
        ContextEngine(
            SQLiteStore(tmp_path / "s.db"), config=config, id_generator=SequentialIdGenerator(n)
        )
        for n in ("a", "b")
    ]
    errors: list[list[str]] = []

    def work(engine: ContextEngine, name: str) -> None:
        for i in range(15):
            result = engine.sync.prepare_turn("s", f"{name}{i}")
            errors.append(result.report.errors)

    threads = [
        threading.Thread(target=work, args=(e, n)) for e, n in zip(engines, "ab", strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [[]] * 30
    doc = engines[0].sync.get_session("s")
    texts = [m.content for m in doc.session.messages]
    assert sorted(texts) == sorted(f"{n}{i}" for n in "ab" for i in range(15))
    for engine in engines:
        engine.sync.close()


_HOLDER = """
import asyncio, sys
from ce.core.stores import SQLiteStore

async def main():
    store = SQLiteStore(sys.argv[1])
    async with store.writer("s") as writer:
        await writer.read_since()
        print("held", flush=True)
        sys.stdin.read()  # until the parent kills this process

asyncio.run(main())
"""


@lock_files
async def test_a_writer_killed_while_holding_a_session_holds_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path, busy_timeout=30)
    await store.commit("s", SessionChanges(messages=[_message("one", "m1")]))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        assert _held_elsewhere(store, "s")
    finally:
        holder.kill()
        holder.wait()
    # the kernel let go of the dead process's lock: no wait for the busy timeout
    assert not _held_elsewhere(store, "s")
    await store.commit("s", SessionChanges(messages=[_message("two", "m2")]))
    doc = await store.get_session("s")
    assert doc is not None and [m.content for m in doc.session.messages] == ["one", "two"]
    await store.close()


@lock_files
async def test_a_lock_file_that_cannot_be_opened_leaves_the_store_working(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "s.db-ce-lock").mkdir()  # not a file: opening it fails
    store = SQLiteStore(tmp_path / "s.db")
    assert not store.prefers_holding
    assert "holding sessions with SQLite's write lock instead" in caplog.text
    engine = ContextEngine(store, config=RuntimeConfig(model_hint="gpt-4o"))
    result = await engine.prepare_turn("s", "hello")
    assert [p.content for p in result.assembled_input.parts if p.role is Role.USER] == ["hello"]
    await engine.close()


@lock_files
async def test_stores_that_name_the_file_through_a_link_share_its_locks(tmp_path: Path) -> None:
    first = SQLiteStore(tmp_path / "s.db")
    (tmp_path / "alias.db").symlink_to(tmp_path / "s.db")
    second = SQLiteStore(tmp_path / "alias.db", busy_timeout=0.2)
    async with first.writer("s") as writer:
        await writer.read_since()
        with pytest.raises(StoreError, match="waited"):
            await second.commit("s", SessionChanges(messages=[_message("late", "m1")]))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith("-ce-lock")) == [
        "s.db-ce-lock"
    ]
    await first.close()
    await second.close()


@lock_files
async def test_a_writer_that_takes_no_lock_makes_a_held_commit_refused_and_redone(
    tmp_path: Path,
) -> None:
    """A process of a ce-core from before the lock files writes between a held read and its
    commit: that commit is refused for its version, reported, and the call is done again."""
    config = RuntimeConfig(model_hint="gpt-4o")
    events: list[Any] = []
    bus = InMemoryEventBus()
    bus.on_all(events.append)
    mine = SQLiteStore(tmp_path / "s.db")
    engine = ContextEngine(mine, config=config, event_bus=bus)
    older = ContextEngine(
        SQLiteStore(tmp_path / "s.db", lock_files=False),
        config=config,
        id_generator=SequentialIdGenerator("b"),
    )
    await engine.prepare_turn("s", "first")
    real_writer = mine.writer
    interleaved: list[str] = []

    @asynccontextmanager
    async def writer(session_id: str) -> AsyncIterator[Any]:
        async with real_writer(session_id) as held:
            real_commit = held.commit

            async def commit(changes: SessionChanges) -> Any:
                if not interleaved:
                    interleaved.append("older")
                    await older.prepare_turn(session_id, "from the older process")
                return await real_commit(changes)

            held.commit = commit
            yield held

    mine.writer = writer  # type: ignore[method-assign]
    result = await engine.prepare_turn("s", "mine")
    assert interleaved == ["older"]
    assert any("version_conflict" in error for error in result.report.errors)
    assert [e.payload.get("reason") for e in events if e.event_type == "Error"] == [
        "version_conflict"
    ]
    users = [p.content for p in result.assembled_input.parts if p.role is Role.USER]
    assert users == ["first", "from the older process", "mine"]
    doc = await older.store.get_session("s")
    assert doc is not None
    assert [m.content for m in doc.session.messages] == [
        "first",
        "from the older process",
        "mine",
    ]
    await engine.close()
    await older.close()


async def test_a_caller_cancelled_during_blocking_work_waits_for_it_then_undoes_it() -> None:
    inside, go = threading.Event(), threading.Event()
    undone: list[str] = []

    def take() -> str:
        inside.set()
        go.wait(10)
        return "the lock"

    task = asyncio.create_task(run_blocking(take, undo=undone.append))
    await asyncio.to_thread(inside.wait, 10)
    task.cancel()
    for _ in range(3):
        await asyncio.sleep(0)  # the cancellation reaches the task, which waits for the thread
    assert not task.done() and undone == []
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert undone == ["the lock"]


@pytest.mark.skipif(not locks_supported(), reason="no lock files on this platform")
async def test_a_writer_cancelled_during_its_read_ends_cancelled_and_frees_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an event loop shutting down cancels a flush whose whole-session read runs in a worker
    # thread: the connection must not be rolled back and pooled while the thread still reads
    store = SQLiteStore(str(tmp_path / "s.db"))
    engine = ContextEngine(store, config=RuntimeConfig(), id_generator=SequentialIdGenerator())
    await engine.prepare_turn("s", "first")
    inside, go = threading.Event(), threading.Event()
    read = sqlite_sql.read_since

    def slow(*args: Any, **kwargs: Any) -> Any:
        inside.set()
        go.wait(10)
        return read(*args, **kwargs)

    monkeypatch.setattr(sqlite_sql, "read_since", slow)

    async def block() -> None:
        async with store.writer("s") as writer:
            await writer.read_since(0)

    task = asyncio.create_task(block())
    await asyncio.to_thread(inside.wait, 10)
    task.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done()
    go.set()
    with pytest.raises(asyncio.CancelledError):  # not a StoreError from a rollback beside it
        await task
    monkeypatch.setattr(sqlite_sql, "read_since", read)
    assert not _held_elsewhere(store, "s")
    await engine.prepare_turn("s", "second")
    doc = await store.get_session("s")
    assert doc is not None and [m.content for m in doc.session.messages] == ["first", "second"]
    await engine.close()


@pytest.mark.skipif(not locks_supported(), reason="no lock files on this platform")
async def test_a_writer_cancelled_while_waiting_for_the_session_leaves_it_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = SQLiteStore(str(tmp_path / "s.db")), SQLiteStore(str(tmp_path / "s.db"))
    waiting, done = threading.Event(), asyncio.Event()
    take = second._take

    def noted(*args: Any) -> None:
        waiting.set()
        take(*args)

    monkeypatch.setattr(second, "_take", noted)

    async def holder() -> None:
        async with first.writer("s"):
            await done.wait()

    held = asyncio.create_task(holder())
    while not _held_elsewhere(second, "s"):
        await asyncio.sleep(0)
    waiter = asyncio.create_task(_enter(second, "s"))
    await asyncio.to_thread(waiting.wait, 10)
    waiter.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    done.set()
    await held
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # the lock its thread took after the cancellation was given back
    assert not _held_elsewhere(first, "s")
    async with second.writer("s") as writer:
        assert await writer.read_since(0) is None
    await first.close()
    await second.close()


async def _enter(store: SQLiteStore, session_id: str) -> None:
    async with store.writer(session_id):
        pass
