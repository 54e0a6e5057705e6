"""The SQLite store copies its write-ahead log back into the file in a thread of its own, so
that commits seldom pay for it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ce.core.schema import Message, Role
from ce.core.stores import SessionChanges, SQLiteStore
from ce.core.stores._sqlite_checkpoint import CHECKPOINT_EVERY


def _changes(i: int) -> SessionChanges:
    text = f"message {i} " + "x" * 3000
    return SessionChanges(messages=[Message(role=Role.USER, content=text, message_id=f"m{i}")])


def _log_frames(path: Path) -> int:
    """The pages the log holds (a checkpoint from another connection reports them)."""
    probe = sqlite3.connect(path)
    try:
        _, log, _ = probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(log)
    finally:
        probe.close()


async def test_a_thread_checkpoints_and_the_log_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    try:
        for i in range(CHECKPOINT_EVERY):  # commits with a pause: the thread keeps up
            await store.commit("s", _changes(i))
        assert store._checkpointer.settle()
        assert store._checkpointer.runs == 1
        await store.commit("s", _changes(CHECKPOINT_EVERY))
        # the commit after a checkpoint that caught up started the log over
        assert _log_frames(path) < 20
        doc = await store.get_session("s")
        assert doc is not None and len(doc.session.messages) == CHECKPOINT_EVERY + 1
        thread = store._checkpointer._thread
        assert thread is not None and thread.is_alive()
    finally:
        await store.close()
    assert not thread.is_alive()  # close() ended it


async def test_commits_through_a_held_writer_are_counted(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    try:
        for i in range(CHECKPOINT_EVERY):
            async with store.writer("s") as writer:
                await writer.read_since()
                await writer.commit(_changes(i))
        assert store._checkpointer.settle()
        assert store._checkpointer.runs == 1
    finally:
        await store.close()
