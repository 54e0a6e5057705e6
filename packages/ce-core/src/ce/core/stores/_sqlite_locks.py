"""Per-session write locks of a SQLite store, shared by every process on the machine.

SQLite has one write lock per file, and a writer that finds it taken sleeps and tries again
(1, 2, 5, 10 ... 100 ms): under many writers, time goes to sleeping while the lock is free.
Holding a session from a read to its commit with that lock would also keep the writers of
every other session waiting. So a :class:`LockFile` locks byte ranges of a file beside the
database (``<database>-ce-lock``), with Linux's open file description locks: byte 0 stands
for the database's write lock (taken just before ``BEGIN IMMEDIATE``, released after the
commit: writers queue in the kernel and the next one wakes the moment the lock is free), and
one byte per session (a hash of its id) stands for the session (taken from a writer's read to
its commit, and around every commit of the session): writers of one session queue on it,
writers of other sessions go on. The locks are released when their holder's file is closed,
so a process that dies holds nothing. The order is always the session's byte first, then
byte 0, never the other way round.

Each :class:`LockFile` is its own open file description: two of them exclude each other even
in one process, and each belongs to one connection of the store at a time. Where these locks
do not exist (not Linux, a 32-bit build), :func:`supported` is False and the store holds a
session with SQLite's write lock instead.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import threading
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["WRITE_LOCK", "LockFile", "LockTimeout", "lock_path", "session_offset", "supported"]

WRITE_LOCK = 0
"""The byte that stands for the database's write lock."""

_SESSION_BYTES = 1 << 20
"""Sessions hash onto this many bytes (two sessions on one byte just queue together)."""


class LockTimeout(Exception):
    """A lock was not granted within the wait allowed."""


def supported() -> bool:
    """Whether this platform has open file description locks (Linux, 64-bit)."""
    return (
        fcntl is not None
        and sys.platform.startswith("linux")
        and hasattr(fcntl, "F_OFD_SETLKW")
        and sys.maxsize > 2**32
    )


def lock_path(database: Path) -> Path:
    """The lock file of the database at ``database``."""
    return database.with_name(database.name + "-ce-lock")


def session_offset(session_id: str) -> int:
    """The byte that stands for the session."""
    digest = hashlib.blake2b(session_id.encode("utf-8"), digest_size=8).digest()
    return 1 + int.from_bytes(digest, "little") % _SESSION_BYTES


def _flock(kind: int, offset: int) -> bytes:
    # struct flock of 64-bit Linux: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks)
    return struct.pack("hhqqixxxx", kind, os.SEEK_SET, offset, 1, 0)


class LockFile:
    """One open file description of the lock file at ``path``: exclusive one-byte locks
    (see the module docstring). Not for concurrent use by several threads."""

    def __init__(self, path: Path) -> None:
        assert fcntl is not None
        self._path = path
        self._fd = self._open()
        self._pid = os.getpid()

    def _open(self) -> int:
        return os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)

    def _descriptor(self) -> int:
        if self._pid != os.getpid():  # a forked child shares the parent's description
            self._fd = self._open()
            self._pid = os.getpid()
        return self._fd

    def try_lock(self, offset: int) -> bool:
        """Take the byte at ``offset`` if it is free; whether it was."""
        try:
            fcntl.fcntl(self._descriptor(), fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK, offset))
        except BlockingIOError:
            return False
        except PermissionError:  # EACCES: some systems' word for "held by another"
            return False
        return True

    def lock(self, offset: int, timeout: float) -> None:
        """Take the byte at ``offset``, waiting up to ``timeout`` seconds for its holder;
        the waiter wakes when the holder lets go. Raises :class:`LockTimeout` when the wait
        runs out (the wait goes on in the background and lets go of the byte once granted,
        on a file description of its own: this one takes a new one)."""
        if self.try_lock(offset):
            return
        fd = self._descriptor()
        done = threading.Event()
        guard = threading.Lock()
        failed: list[OSError] = []
        abandoned = False

        def wait() -> None:
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, _flock(fcntl.F_WRLCK, offset))
            except OSError as exc:
                failed.append(exc)
            with guard:
                if not abandoned:
                    done.set()
                    return
            os.close(fd)  # lets go of every byte this description held

        threading.Thread(target=wait, name="ce-sqlite-lock", daemon=True).start()
        if not done.wait(timeout):
            with guard:
                abandoned = not done.is_set()
        if not abandoned:
            if failed:
                raise failed[0]
            return
        self._fd = self._open()
        raise LockTimeout(f"waited {timeout:g} s for a lock of {self._path}")

    def unlock(self, offset: int) -> None:
        """Let go of the byte at ``offset`` (nothing happens when it is not held)."""
        fcntl.fcntl(self._descriptor(), fcntl.F_OFD_SETLK, _flock(fcntl.F_UNLCK, offset))

    def close(self) -> None:
        """Let go of every byte and close the description."""
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = -1
