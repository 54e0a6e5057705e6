"""Holding a session for one writer: what a store offers so that a commit is never refused.

A :class:`~ce.core.stores.base.Store` is optimistic: ``commit(..., expected_version=v)``
raises :class:`~ce.core.errors.VersionConflictError` when another writer stored something
after ``v``. A store that also implements :class:`WriterStore` can hold a session for one
writer from the read to the commit: ``async with store.writer(session_id) as writer`` waits
until no other writer (in any process) holds the session, then ``writer.read_since(...)``
reads what is stored and ``writer.commit(changes)`` appends to exactly that, so no commit of
another writer can land in between. A commit is stored when it returns (what the block does
after it, an exception included, does not undo it) and ends the hold; a second commit in the
same block holds the session again and is refused (``VersionConflictError``) if another
writer stored something in between. A block that commits nothing stores nothing.

The engine uses it on a conflict: a call whose optimistic commit was refused is done again
once, holding the session, and that second commit is not refused. A store whose hold costs no
more than an optimistic commit (SQLite with its per-session lock files) says so with a
``prefers_holding`` attribute that is True: the engine then holds the session for every write,
and no commit is refused unless a writer that does not hold sessions (a process of an older
ce-core) wrote in between; the engine then reads the session again and redoes the call.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

from ce.core.schema import PutResult
from ce.core.stores.base import SessionChanges, SessionUpdate

__all__ = ["SessionWriter", "WriterStore"]


class SessionWriter(Protocol):
    """One session held for one writer (see the module docstring)."""

    async def read_since(self, version: int = 0, epoch: str = "") -> SessionUpdate | None:
        """Like :meth:`Store.read_since`, while the session is held: None when the session
        does not exist."""

    async def commit(self, changes: SessionChanges) -> PutResult:
        """Like :meth:`Store.commit` of the held session; the block's first commit is never
        refused for its version."""


@runtime_checkable
class WriterStore(Protocol):
    """A store that can hold a session for one writer (see the module docstring)."""

    def writer(self, session_id: str) -> AbstractAsyncContextManager[SessionWriter]:
        """Hold ``session_id`` for the block; waits while another writer holds it (or, in a
        store with one write lock, any session of it)."""
