"""The store contract for MemoryStore, SQLiteStore and FileStore, plus what is specific to each:
several OS processes writing one session, crashes mid-write, content really gone after a
compliance delete, corrupt files, and the URLs of ``open_store``."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import re
import shutil
import signal
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import pytest

import ce.core._drive as drive_module
import ce.core.stores._docops as docops
import ce.core.stores._sqlite_write as sqlite_write
import ce.core.stores.sqlite as sqlite_module
from ce.core.errors import SchemaValidationError, StoreError
from ce.core.schema import (
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    Message,
    Role,
    SourceKind,
    load_document,
)
from ce.core.stores import (
    FileStore,
    MemoryStore,
    SessionChanges,
    SQLiteStore,
    Store,
    open_store,
)
from ce.core.stores._rows import DOCUMENT_TABLES
from ce.core.stores.file import encode_session_id
from ce.core.testing import InjectedFailure, StoreContract, records


def _fail_once(
    monkeypatch: pytest.MonkeyPatch, owner: object, name: str, when: Callable[..., bool]
) -> None:
    """Make ``owner.name`` raise InjectedFailure on its first call for which ``when`` holds."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if when(*args, **kwargs):
            monkeypatch.setattr(owner, name, original)
            raise InjectedFailure(f"{name} failed on purpose")
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


class TestMemoryStore(StoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        store = MemoryStore()
        yield store
        await store.close()

    @pytest.fixture
    def fail_midway(self, monkeypatch: pytest.MonkeyPatch) -> Callable[[Store], None]:
        # apply_changes appends messages, tool calls, usage and evidences before upserting
        return lambda store: _fail_once(monkeypatch, docops, "upsert", lambda *a: True)


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        store = SQLiteStore(tmp_path / "ce.db")
        yield store
        await store.close()

    @pytest.fixture
    def fail_midway(self, monkeypatch: pytest.MonkeyPatch) -> Callable[[Store], None]:
        # messages, tool calls and usage rows are inserted before the evidences
        return lambda store: _fail_once(
            monkeypatch,
            sqlite_write,
            "_write_records",
            lambda conn, table, *a: table == "evidences",
        )


class TestFileStore(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        store = FileStore(tmp_path / "sessions")
        yield store
        await store.close()

    @pytest.fixture
    def fail_midway(self, monkeypatch: pytest.MonkeyPatch) -> Callable[[Store], None]:
        # the new document is in the temp file, not yet moved over the old one
        return lambda store: _fail_once(monkeypatch, os, "fsync", lambda fd: True)


def _message(key: str) -> Message:
    return Message(role=Role.USER, content=f"content of {key}", message_id=key)


def _open(kind: str, location: Path) -> SQLiteStore | FileStore:
    return SQLiteStore(location / "ce.db") if kind == "sqlite" else FileStore(location)


# -- several processes ------------------------------------------------------------------------


def _append_in_process(kind: str, location: Path, writer: str, count: int, start: Barrier) -> None:
    async def run() -> None:
        store = _open(kind, location)
        start.wait(timeout=120)
        for i in range(count):
            await store.append_messages("shared", [_message(f"{writer}-{i:03d}")])
        await store.close()

    asyncio.run(run())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "file"])
async def test_two_processes_appending_to_one_session_lose_nothing(
    kind: str, tmp_path: Path
) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    writers = ["p1", "p2"]
    processes = [
        ctx.Process(target=_append_in_process, args=(kind, tmp_path, w, 200, start))
        for w in writers
    ]
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=300)
            assert process.exitcode == 0
    finally:
        for process in processes:
            process.kill()
    store = _open(kind, tmp_path)
    doc = await store.get_session("shared")
    assert doc is not None
    ids = [m.message_id for m in doc.session.messages]
    assert len(ids) == len(set(ids)) == 400
    for writer in writers:
        assert [i for i in ids if i and i.startswith(writer)] == [
            f"{writer}-{i:03d}" for i in range(200)
        ]
    assert await store.get_version("shared") == 400
    await store.close()


def _open_when_released(location: Path, start: Barrier) -> None:
    start.wait(timeout=120)
    SQLiteStore(location / "ce.db")


@pytest.mark.slow
def test_several_processes_opening_a_new_sqlite_file_at_once_all_succeed(tmp_path: Path) -> None:
    """Workers starting together race to create the schema and switch the file to WAL."""
    ctx = multiprocessing.get_context("spawn")
    for trial in range(5):
        start = ctx.Barrier(4)
        location = tmp_path / f"trial-{trial}"
        location.mkdir()
        processes = [
            ctx.Process(target=_open_when_released, args=(location, start)) for _ in range(4)
        ]
        try:
            for process in processes:
                process.start()
            for process in processes:
                process.join(timeout=120)
            assert [p.exitcode for p in processes] == [0, 0, 0, 0]
        finally:
            for process in processes:
                process.kill()


# -- FileStore --------------------------------------------------------------------------------


def _hang_while_writing(directory: Path, writing: Event) -> None:
    """Start a commit and block for good once the temp file is written, before the rename."""
    real_fsync = os.fsync

    def fsync(fd: Any) -> None:
        real_fsync(fd)
        writing.set()
        threading.Event().wait()

    os.fsync = fsync
    store = FileStore(directory)
    asyncio.run(store.append_messages("s1", [_message("second")]))


@pytest.mark.slow
async def test_file_store_crash_mid_write_keeps_the_previous_version(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.append_messages("s1", [_message("first")])
    before = await store.get_session("s1")

    ctx = multiprocessing.get_context("spawn")
    writing = ctx.Event()
    child = ctx.Process(target=_hang_while_writing, args=(tmp_path, writing))
    child.start()
    try:
        assert writing.wait(timeout=120), "the child never reached its write"
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    finally:
        child.kill()
    assert child.exitcode == -signal.SIGKILL
    temp = tmp_path / f"{encode_session_id('s1')}.json.tmp"
    assert b"second" in temp.read_bytes()  # the crash left a complete, unrenamed temp file

    assert await store.get_session("s1") == before
    assert await store.get_version("s1") == 1
    assert await store.list_sessions() == ["s1"]
    # the dead writer's lock is gone and its temp file does not survive the next write
    assert (await store.append_messages("s1", [_message("third")])).version == 2
    doc = await store.get_session("s1")
    assert doc is not None
    assert [m.message_id for m in doc.session.messages] == ["first", "third"]
    assert not temp.exists()


async def test_file_store_failed_replace_keeps_the_previous_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    await store.append_messages("s1", [_message("first")])
    before = await store.get_session("s1")

    def replace(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(StoreError, match="No space left"):
        await store.append_messages("s1", [_message("second")])
    monkeypatch.undo()
    assert await store.get_session("s1") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s1.json", "s1.lock"]
    assert (await store.append_messages("s1", [_message("second")])).version == 2


async def test_file_store_format_and_names(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    long_id = "x" * 300
    ids = ["Case", "case", "../escape", "a/b", ".hidden", "ü", long_id]
    for session_id in ids:
        await store.append_messages(session_id, [_message(session_id[:20])])
    names = sorted(p.name for p in tmp_path.glob("*.json"))
    assert len(names) == len(ids)
    assert all("/" not in n and not n.startswith(".") and n.count(".") == 1 for n in names)
    assert encode_session_id("Case") != encode_session_id("case")
    assert encode_session_id(long_id).startswith("~")
    assert await store.list_sessions() == sorted(ids)

    raw = json.loads((tmp_path / "case.json").read_text())
    assert (raw["version"], raw["turns"]) == (1, [])
    assert load_document(raw["document"]) == await store.get_session("case")


async def test_file_store_keeps_turns_beside_the_document(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    turn = records.turn("t1")
    await store.commit("s1", SessionChanges(messages=[_message("m1")], turns=[turn]))
    raw = json.loads((tmp_path / "s1.json").read_text())
    assert sorted(raw) == ["document", "epoch", "turns", "version"]
    assert [t["turn_id"] for t in raw["turns"]] == ["t1"]
    assert "turns" not in raw["document"]

    # a file written before turn records existed has none, and takes new ones
    del raw["turns"]
    (tmp_path / "s1.json").write_text(json.dumps(raw))
    assert await store.list_turns("s1") == []
    assert (await store.commit("s1", SessionChanges(turns=[turn]))).version == 2
    assert await store.get_turn("s1", "t1") == turn


async def test_file_store_migrates_older_documents_on_read(tmp_path: Path) -> None:
    old = {
        "schema_version": "0.9",
        "session_id": "s1",
        "messages": [{"role": "user", "content": "hi", "ts": "2025-01-01T00:00:00Z"}],
    }
    (tmp_path / "s1.json").write_text(json.dumps({"version": 3, "document": old}))
    turn = records.turn("t1")
    (tmp_path / "s2.json").write_text(
        json.dumps({"version": 1, "document": old, "turns": [turn.model_dump(mode="json")]})
    )
    store = FileStore(tmp_path)
    doc = await store.get_session("s1")
    assert doc is not None
    assert doc.session.messages[0].at == "2025-01-01T00:00:00Z"
    assert await store.list_turns("s1") == []
    assert (await store.append_messages("s1", [_message("m2")])).version == 4
    assert await store.list_turns("s2") == [turn]


async def test_file_store_corrupt_file_raises_store_error(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    path = tmp_path / "s1.json"
    path.write_text('{"version": 1, "document": {"schema_version": "1.0"')
    with pytest.raises(StoreError, match=re.escape(str(path))):
        await store.get_session("s1")
    with pytest.raises(StoreError, match=re.escape(str(path))):
        await store.append_messages("s1", [_message("m1")])
    assert path.read_text().startswith('{"version": 1')


# -- SQLiteStore ------------------------------------------------------------------------------


def _file_bytes(db: Path) -> bytes:
    wal = db.with_name(db.name + "-wal")
    return db.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


async def test_sqlite_deleted_content_is_gone_from_the_files(tmp_path: Path) -> None:
    db = tmp_path / "ce.db"
    store = SQLiteStore(db)
    secret, private = "SECRET-evidence-7f3a9c", "PRIVATE-message-51be02"
    evidence = Evidence(
        evidence_id="e1",
        type=EvidenceType.TOOL_RESULT,
        source=EvidenceSource(kind=SourceKind.TOOL),
        content=secret * 200,  # spills into overflow pages
    )
    await store.put_evidence("s1", evidence)
    await store.append_messages("s1", [Message(role=Role.USER, content=private, message_id="m")])
    await store.append_messages("s2", [_message("kept")])
    assert secret.encode() in _file_bytes(db) and private.encode() in _file_bytes(db)
    with sqlite3.connect(db) as other:  # move everything from the log into the database file
        other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert secret.encode() in db.read_bytes() and private.encode() in db.read_bytes()

    assert await store.delete_evidence("s1", "e1")
    assert secret.encode() not in _file_bytes(db)
    assert private.encode() in _file_bytes(db)
    assert await store.delete_session("s1")
    assert private.encode() not in _file_bytes(db)
    assert b"content of kept" in _file_bytes(db)
    await store.close()


async def test_sqlite_appends_insert_rows_and_never_rewrite(tmp_path: Path) -> None:
    db = tmp_path / "ce.db"
    store = SQLiteStore(db)
    for key in ("m1", "m2", "m3"):
        await store.append_messages("s1", [_message(key)])
    await store.close()
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT message_id, version FROM messages ORDER BY seq").fetchall()
        (user_version,) = conn.execute("PRAGMA user_version").fetchone()
        (journal_mode,) = conn.execute("PRAGMA journal_mode").fetchone()
    assert rows == [("m1", 1), ("m2", 2), ("m3", 3)]
    assert (user_version, journal_mode) == (sqlite_module.USER_VERSION, "wal")


async def test_sqlite_commit_on_a_loop_runs_inline_unless_it_would_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an event loop a commit that need not wait runs on the loop's thread (no hop to a
    worker thread); while another process holds the write lock it goes to a worker thread,
    the loop goes on meanwhile, and it lands once the lock is released, exactly once."""
    db = tmp_path / "ce.db"
    store = SQLiteStore(db)
    loop_thread = threading.get_ident()
    hops: list[int] = []
    in_worker_thread = drive_module.in_worker_thread

    async def counting_in_worker_thread(fn: Any) -> Any:
        hops.append(1)
        return await in_worker_thread(fn)

    monkeypatch.setattr(drive_module, "in_worker_thread", counting_in_worker_thread)
    committed_on: list[int] = []
    original = sqlite_write.commit

    def recording_commit(*args: Any, **kwargs: Any) -> Any:
        committed_on.append(threading.get_ident())
        return original(*args, **kwargs)

    monkeypatch.setattr(sqlite_write, "commit", recording_commit)
    await store.append_messages("s1", [_message("m1")])
    assert committed_on == [loop_thread] and hops == []

    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    task = asyncio.ensure_future(store.append_messages("s1", [_message("m2")]))
    ticks = 0
    while len(committed_on) < 3 and ticks < 10_000:  # inline try, then the worker's
        await asyncio.sleep(0)
        ticks += 1
    assert not task.done() and hops == [1]  # the loop went on while the commit waits
    other.execute("ROLLBACK")
    other.close()
    await task
    assert committed_on[1] == loop_thread and committed_on[2] != loop_thread
    doc = await store.get_session("s1")
    assert doc is not None
    assert [m.message_id for m in doc.session.messages] == ["m1", "m2"]
    await store.close()


async def test_sqlite_turns_are_rows_of_their_own(tmp_path: Path) -> None:
    db = tmp_path / "ce.db"
    store = SQLiteStore(db)
    await store.commit("s1", SessionChanges(messages=[_message("m1")], turns=[records.turn("t1")]))
    await store.commit("s1", SessionChanges(turns=[records.turn("t2")]))
    await store.close()
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT turn_id, version FROM turns ORDER BY seq").fetchall()
    assert rows == [("t1", 1), ("t2", 2)]


def _layout_1(db: Path) -> None:
    """Turn the current layout at ``db`` into layout 1 (no ``turns`` table, no ``epoch``
    column, no version indexes, no columns for partial reads or token counts)."""
    with sqlite3.connect(db) as conn:
        for trigger in ("messages_role", "evidences_tags"):
            conn.execute(f"DROP TRIGGER {trigger}")
        for index in (
            "messages_system",
            "evidences_facts",
            "evidences_by_link",
            "evidences_by_dedup",
        ):
            conn.execute(f"DROP INDEX {index}")
        conn.execute("ALTER TABLE messages DROP COLUMN role")
        conn.execute("ALTER TABLE evidences DROP COLUMN facts")
        conn.execute("ALTER TABLE evidences DROP COLUMN link")
        conn.execute("ALTER TABLE messages DROP COLUMN tokens")
        conn.execute("ALTER TABLE evidences DROP COLUMN tokens")
        conn.execute("ALTER TABLE evidences DROP COLUMN dedup")
        conn.execute("DROP TABLE turns")
        for table in DOCUMENT_TABLES:
            conn.execute(f"DROP INDEX {table}_by_version")
        conn.execute("ALTER TABLE sessions DROP COLUMN epoch")
        conn.execute("PRAGMA user_version = 1")
    conn.close()


async def test_sqlite_layout_1_file_is_upgraded_on_open(tmp_path: Path) -> None:
    db = tmp_path / "ce.db"
    store = SQLiteStore(db)
    changes = records.rich_changes()
    changes.turns = []
    await store.commit("s1", changes)
    await store.close()
    _layout_1(db)

    upgraded = SQLiteStore(db)
    with sqlite3.connect(db) as conn:
        (user_version,) = conn.execute("PRAGMA user_version").fetchone()
    conn.close()
    assert user_version == sqlite_module.USER_VERSION == 5
    assert await upgraded.get_session("s1") == records.expected_document("s1", changes)
    update = await upgraded.read_since("s1")
    assert update is not None and update.epoch == "" and update.version == 1
    assert await upgraded.list_turns("s1") == []
    assert (await upgraded.commit("s1", SessionChanges(turns=[records.turn("t1")]))).version == 2
    assert await upgraded.get_turn("s1", "t1") == records.turn("t1")
    assert await upgraded.delete_session("s1")
    assert await upgraded.list_turns("s1") == []
    await upgraded.close()
    await SQLiteStore(db).close()  # opening an upgraded file again changes nothing


async def test_sqlite_store_is_shared_by_two_instances(tmp_path: Path) -> None:
    first, second = SQLiteStore(tmp_path / "ce.db"), SQLiteStore(tmp_path / "ce.db")
    await first.append_messages("s1", [_message("m1")])
    await second.append_messages("s1", [_message("m2")])
    assert await first.get_version("s1") == 2
    doc = await first.get_session("s1")
    assert doc is not None and [m.message_id for m in doc.session.messages] == ["m1", "m2"]
    await first.close()
    await second.close()


async def test_sqlite_corrupt_or_newer_file_raises_store_error(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not an SQLite database\n" * 100)
    with pytest.raises(StoreError, match=re.escape(str(garbage))):
        SQLiteStore(garbage)
    with pytest.raises(StoreError, match=re.escape(str(garbage))):
        open_store(f"sqlite:///{garbage}")

    newer = tmp_path / "newer.db"
    store = SQLiteStore(newer)
    await store.close()
    with sqlite3.connect(newer) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="newer"):
        SQLiteStore(newer)


async def test_sqlite_unreadable_session_raises_store_error(tmp_path: Path) -> None:
    db = tmp_path / "ce.db"
    store = SQLiteStore(db)
    await store.append_messages("s1", [_message("m1")])
    await store.append_messages("s2", [_message("m1")])
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE messages SET body = '{\"role\": 5}' WHERE session_id = 's1'")
        conn.execute("UPDATE sessions SET schema_version = '0.9' WHERE session_id = 's2'")
    with pytest.raises(StoreError, match=re.escape(f"{db}: session 's1' is corrupt")):
        await store.get_session("s1")
    with pytest.raises(StoreError, match=re.escape("schema version '0.9'")):
        await store.get_session("s2")
    await store.close()


async def test_closed_sqlite_store_raises_store_error(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ce.db")
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.get_session("s1")


# -- open_store -------------------------------------------------------------------------------


async def test_open_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert isinstance(open_store("memory://"), MemoryStore)

    relative = open_store("sqlite:///data/dir/ce%20test.db")
    assert isinstance(relative, SQLiteStore)
    assert relative.path == Path("data/dir/ce test.db")
    assert (tmp_path / "data" / "dir" / "ce test.db").is_file()

    absolute_path = tmp_path / "abs" / "ce.db"
    absolute = open_store(f"sqlite:///{absolute_path}")
    assert isinstance(absolute, SQLiteStore) and absolute.path == absolute_path
    await absolute.append_messages("s1", [_message("m1")])
    await absolute.close()
    reopened = open_store(f"sqlite:///{absolute_path}")
    assert await reopened.get_version("s1") == 1

    files = open_store(f"file://{tmp_path}/files")
    assert isinstance(files, FileStore) and files.directory == tmp_path / "files"
    assert (tmp_path / "files").is_dir()
    relative_files = open_store("file://rel/files")
    assert isinstance(relative_files, FileStore)
    assert relative_files.directory == Path("rel/files")

    for store in (relative, reopened, files, relative_files):
        await store.close()


@pytest.mark.parametrize(
    "url",
    [
        "mysql://localhost/db",
        "redis://",
        "",
        "ce.db",
        "sqlite://ce.db",
        "sqlite:///",
        "sqlite:///ce.db?mode=ro",
        "memory://elsewhere",
        "file://",
    ],
)
def test_open_store_rejects_bad_urls(url: str) -> None:
    with pytest.raises(StoreError) as info:
        open_store(url)
    if "://" not in url or url.startswith(("mysql", "redis")):
        assert all(
            s in str(info.value) for s in ("memory://", "sqlite://", "file://", "postgresql://")
        )


async def test_sqlite_tag_columns_follow_the_record_a_commit_keeps(tmp_path: Path) -> None:
    """A commit that repeats an id stores the first record: its role, facts and link too."""
    store = SQLiteStore(tmp_path / "ce.db")
    first = Message(role=Role.SYSTEM, content="be brief", message_id="m1")
    again = Message(role=Role.USER, content="hello", message_id="m1")
    doc_a = records.evidence("e1").model_copy(update={"content": '{"order_id": 1, "s": "x"}'})
    doc_b = records.evidence("e1").model_copy(update={"content": "plain"})
    await store.commit("s1", SessionChanges(messages=[first, again], evidences=[doc_a, doc_b]))
    await store.close()
    with sqlite3.connect(tmp_path / "ce.db") as conn:
        assert conn.execute("SELECT role FROM messages").fetchall() == [("system",)]
        assert conn.execute("SELECT facts FROM evidences").fetchall() == [(1,)]
    conn.close()


async def test_sqlite_rows_an_older_ce_core_writes_get_their_tags(tmp_path: Path) -> None:
    """During a rolling deploy a process of the previous ce-core keeps writing rows without
    the tagged columns: the file fills them in, so a partial read still finds them."""
    store = SQLiteStore(tmp_path / "ce.db")
    await store.commit("s1", SessionChanges(messages=[_message("m1")]))
    system = Message(role=Role.SYSTEM, content="be brief", message_id="m0")
    linked = records.evidence("e1").model_copy(
        update={
            "content": '{"order_id": 1, "status": "x"}',
            "links": EvidenceLinks(tool_call_id="c9"),
            "metadata": {"dedup_key": "tool_result|k9"},
        }
    )
    with sqlite3.connect(tmp_path / "ce.db") as conn:  # the previous layout's statements
        for table, rid, body in (
            ("messages", "message_id", system.model_dump_json(exclude_none=True)),
            ("evidences", "evidence_id", linked.model_dump_json(exclude_none=True)),
        ):
            record_id = "m0" if table == "messages" else "e1"
            conn.execute(
                f"INSERT INTO {table} (session_id, seq, {rid}, version, body)"
                f" SELECT 's1', COALESCE(MAX(seq) + 1, 0), ?, 2, ? FROM {table}"
                " WHERE session_id = 's1'",
                (record_id, body),
            )
        conn.execute("UPDATE sessions SET version = 2 WHERE session_id = 's1'")
        assert conn.execute("SELECT role FROM messages ORDER BY seq").fetchall() == [
            ("user",),
            ("system",),
        ]
        tags = conn.execute("SELECT facts, link, dedup FROM evidences").fetchall()
        assert tags == [(1, "c9", "tool_result|k9")]
    conn.close()
    await store.commit("s1", SessionChanges(messages=[_message("m2")]))
    part = await store.read_tail("s1", messages=1, evidences=0)
    assert part is not None and part.instruction == system
    assert [e.evidence_id for e in part.fact_sources] == ["e1"]
    assert await store.read_evidences("s1", ["tool_result|k9"]) == [linked]
    await store.close()


def test_token_counts_ride_with_a_change_set_but_are_no_patch_key() -> None:
    first = SessionChanges(messages=[_message("m1")], token_counts={"m1": "{}"})
    merged = first.merge(SessionChanges(messages=[_message("m2")], token_counts={"m2": "[]"}))
    assert merged.token_counts == {"m1": "{}", "m2": "[]"}
    assert SessionChanges(token_counts={"m1": "{}"}).is_empty()  # counts alone store nothing
    with pytest.raises(SchemaValidationError, match="token_counts"):
        SessionChanges.from_patch({"token_counts": {"m1": "{}"}})


async def test_sqlite_layout_4_file_gets_the_dedup_keys_of_its_evidences(tmp_path: Path) -> None:
    """Evidences stored before layout 5 (``data/layout4.db``, written by the previous
    ce-core) get their deduplication key from their bodies, so a reader of the newest records
    finds them by key."""
    db = tmp_path / "layout4.db"
    shutil.copyfile(Path(__file__).parent / "data" / "layout4.db", db)
    keyed = records.evidence("keyed", content="ingested", metadata={"dedup_key": "rag_doc|k1"})
    with sqlite3.connect(db) as conn:
        (seq,) = conn.execute("SELECT MAX(seq) + 1 FROM evidences").fetchone()
        conn.execute(
            "INSERT INTO evidences (session_id, seq, evidence_id, version, body)"
            " VALUES ('layout4', ?, 'keyed', 1, ?)",
            (seq, keyed.model_dump_json(exclude_none=True)),
        )
    conn.close()
    store = SQLiteStore(db)
    assert await store.read_evidences("layout4", ["rag_doc|k1"]) == [keyed]
    await store.close()
