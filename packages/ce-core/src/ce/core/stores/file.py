"""``FileStore``: one JSON document per session in a directory (POSIX only).

Each session is ``<name>.json`` holding
``{"version": n, "epoch": "...", "document": {...}, "turns": [...]}`` (the turn records beside
the document; files written before turns or epochs existed have no ``"turns"`` / ``"epoch"``
and read as having none / ``""``), where ``<name>`` encodes the session id safely (see
:func:`encode_session_id`). A write goes to ``<name>.json.tmp`` in the same directory, is
flushed and fsynced, and replaces the document with :func:`os.replace`, so a reader sees either
the old or the new document and a crash mid-write leaves the previous version readable (the
stale temp file is overwritten by the next write). Read-modify-write runs under an exclusive
:func:`fcntl.flock` on ``<name>.lock``, so concurrent processes and threads lose nothing.
Compliance actions are appended to ``audit.jsonl``.

Every commit rewrites the whole document: the cost of an append grows with the session. Use
:class:`~ce.core.stores.sqlite.SQLiteStore` for long sessions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import ParamSpec, TypeVar
from urllib.parse import unquote

from pydantic import BaseModel, Field, ValidationError

from ce.core._drive import run_blocking
from ce.core.errors import ContextEngineError, StoreError
from ce.core.primitives import Clock, IdGenerator
from ce.core.schema import (
    SCHEMA_VERSION,
    ContextBlock,
    Evidence,
    PutResult,
    SessionDocument,
    TurnRecord,
    load_document,
)
from ce.core.stores._docops import (
    append_turns,
    apply_changes,
    new_document,
    newest,
    remove_evidence,
    user_id_of,
)
from ce.core.stores.base import (
    AuditRecord,
    BaseStore,
    BlockFilter,
    EvidenceFilter,
    SessionChanges,
    SessionUpdate,
    filter_blocks,
    filter_evidences,
    new_epoch,
    whole_update,
)

if sys.platform != "win32":
    import fcntl

__all__ = ["FileStore", "encode_session_id"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

_SAFE = "abcdefghijklmnopqrstuvwxyz0123456789-_"
_MAX_NAME = 200
_AUDIT_FILE = "audit.jsonl"


def encode_session_id(session_id: str) -> str:
    """The file-name stem of ``session_id``: reversible and safe on every file system.

    Lower-case letters, digits, ``-`` and ``_`` stay; every other byte of the UTF-8 form
    becomes ``%XX`` (so names differing only in case never collide, and ``.`` or ``/`` cannot
    escape the directory). A stem longer than 200 characters becomes ``~`` plus the SHA-256 of
    the id; the id is then read from the document itself.
    """
    stem = "".join(
        chr(byte) if chr(byte) in _SAFE else f"%{byte:02X}" for byte in session_id.encode("utf-8")
    )
    if len(stem) > _MAX_NAME:
        return "~" + hashlib.sha256(session_id.encode("utf-8")).hexdigest()
    return stem


class _Stored(BaseModel):
    version: int
    document: SessionDocument
    turns: list[TurnRecord] = Field(default_factory=list)
    epoch: str = ""  # files written before epochs existed have none


class FileStore(BaseStore):
    """Sessions as JSON files in ``directory`` (created if missing).

    Safe to share between threads, event loops and processes on one machine (``flock`` is not
    reliable on network file systems). ``list_sessions`` and ``delete_user`` read every
    document. Deleting removes the data from every file of the directory; blocks the file
    system freed on earlier rewrites are beyond its reach. Raises :class:`StoreError` when the
    directory cannot be created or a file is unreadable or corrupt (naming the file).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        id_generator: IdGenerator | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(id_generator=id_generator, clock=clock)
        if sys.platform == "win32":
            raise StoreError("FileStore needs POSIX file locks; use SQLiteStore on Windows")
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.directory}: cannot create FileStore directory: {exc}") from exc
        self._closed = False

    # -- plumbing ---------------------------------------------------------------------------

    async def _run(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        if self._closed:
            raise StoreError(f"{self.directory}: store is closed")
        return await run_blocking(functools.partial(fn, *args, **kwargs))

    def _path(self, session_id: str, suffix: str = ".json") -> Path:
        return self.directory / (encode_session_id(session_id) + suffix)

    @contextmanager
    def _session_lock(self, session_id: str) -> Iterator[Path]:
        """Hold the session's lock file exclusively; yields its path.

        The holder may delete the lock file: a waiter that then acquires the deleted file
        notices that the path no longer names it and locks the new file instead.
        """
        path = self._path(session_id, ".lock")
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise StoreError(f"{path}: cannot open lock file: {exc}") from exc
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd is closed
                    current = _names(path, fd)
                except OSError as exc:
                    raise StoreError(f"{path}: cannot lock session: {exc}") from exc
                if current:
                    yield path
                    return
            finally:
                os.close(fd)

    def _read(self, path: Path) -> _Stored | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"{path}: cannot read session file: {exc}") from exc
        try:
            return _Stored.model_validate_json(data)
        except ValidationError as exc:
            if _schema_version(data) in (None, SCHEMA_VERSION):
                raise StoreError(f"{path}: corrupt session file: {exc}") from exc
        try:  # a document of an older schema version: migrate it
            raw = json.loads(data)
            return _Stored(
                version=raw["version"],
                document=load_document(raw["document"]),
                turns=raw.get("turns", []),
                epoch=raw.get("epoch", ""),
            )
        except (ContextEngineError, ValueError, LookupError, TypeError) as exc:
            raise StoreError(f"{path}: corrupt session file: {exc}") from exc

    def _write(
        self,
        path: Path,
        version: int,
        doc: SessionDocument,
        turns: list[TurnRecord],
        epoch: str,
    ) -> None:
        data = (
            f'{{"version":{version},"epoch":{json.dumps(epoch)},'
            f'"document":{doc.model_dump_json(exclude_none=True)},'
            f'"turns":[{",".join(t.model_dump_json(exclude_none=True) for t in turns)}]}}'
        )
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self._sync_directory()
        except OSError as exc:
            with suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise StoreError(f"{path}: cannot write session file: {exc}") from exc

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _append_audit(self, record: AuditRecord) -> None:
        path = self.directory / _AUDIT_FILE
        line = json.dumps(
            {
                "at": record.at,
                "action": record.action,
                "session_id": record.session_id,
                "target": record.target,
            },
            ensure_ascii=False,
        )
        try:
            with open(path, "a", encoding="utf-8") as f:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise StoreError(f"{path}: cannot append audit record: {exc}") from exc

    # -- writes -----------------------------------------------------------------------------

    def _commit_sync(
        self, session_id: str, changes: SessionChanges, expected_version: int | None
    ) -> PutResult:
        with self._session_lock(session_id):
            path = self._path(session_id)
            stored = self._read(path)
            current = stored.version if stored else 0
            self._check_version(session_id, expected_version, current)
            doc = stored.document if stored else new_document(session_id)
            stored_turns = stored.turns if stored else []
            changed = apply_changes(doc, changes)
            turns = append_turns(stored_turns, changes.turns)
            if changed is None and turns is stored_turns:
                return PutResult(success=True, version=current, epoch=stored and stored.epoch)
            epoch = stored.epoch if stored else new_epoch()
            self._write(path, current + 1, doc if changed is None else changed, turns, epoch)
            return PutResult(success=True, version=current + 1, epoch=epoch)

    async def _commit(
        self, session_id: str, changes: SessionChanges, expected_version: int | None
    ) -> PutResult:
        return await self._run(self._commit_sync, session_id, changes, expected_version)

    def _put_sync(
        self, session_id: str, doc: SessionDocument, expected_version: int | None
    ) -> PutResult:
        with self._session_lock(session_id):
            path = self._path(session_id)
            stored = self._read(path)
            current = stored.version if stored else 0
            self._check_version(session_id, expected_version, current)
            epoch = new_epoch()
            self._write(path, current + 1, doc, [], epoch)
            return PutResult(success=True, version=current + 1, epoch=epoch)

    async def _put_session(
        self, session_id: str, doc: SessionDocument, expected_version: int | None
    ) -> PutResult:
        return await self._run(self._put_sync, session_id, doc, expected_version)

    def _delete_session_sync(self, session_id: str) -> bool:
        with self._session_lock(session_id) as lock_path:
            path = self._path(session_id)
            tmp = path.with_name(path.name + ".tmp")
            try:
                existed = path.exists()
                path.unlink(missing_ok=True)
                tmp.unlink(missing_ok=True)
                lock_path.unlink()
                self._sync_directory()
            except OSError as exc:
                raise StoreError(f"{path}: cannot delete session file: {exc}") from exc
            if existed:
                self._append_audit(self._audit_record("delete_session", session_id))
            return existed

    async def delete_session(self, session_id: str) -> bool:
        return await self._run(self._delete_session_sync, session_id)

    def _delete_evidence_sync(self, session_id: str, evidence_id: str) -> bool:
        with self._session_lock(session_id):
            path = self._path(session_id)
            stored = self._read(path)
            doc = remove_evidence(stored.document, evidence_id) if stored else None
            if stored is None or doc is None:
                return False
            self._write(path, stored.version + 1, doc, stored.turns, new_epoch())
            self._append_audit(self._audit_record("delete_evidence", session_id, evidence_id))
            return True

    async def delete_evidence(self, session_id: str, evidence_id: str) -> bool:
        return await self._run(self._delete_evidence_sync, session_id, evidence_id)

    # -- reads ------------------------------------------------------------------------------

    def _document(self, session_id: str) -> SessionDocument | None:
        stored = self._read(self._path(session_id))
        return stored.document if stored else None

    async def get_session(self, session_id: str) -> SessionDocument | None:
        return await self._run(self._document, session_id)

    async def read_since(
        self, session_id: str, version: int = 0, epoch: str = ""
    ) -> SessionUpdate | None:
        """Nothing for a reader at the stored version and epoch, else the whole session."""
        stored = await self._run(self._read, self._path(session_id))
        if stored is None:
            return None
        return whole_update(stored.document, stored.version, stored.epoch, version, epoch)

    async def get_version(self, session_id: str) -> int:
        stored = await self._run(self._read, self._path(session_id))
        return stored.version if stored else 0

    async def get_evidence(self, session_id: str, evidence_id: str) -> Evidence | None:
        doc = await self._run(self._document, session_id)
        return doc.evidences.get(evidence_id) if doc else None

    async def list_evidences(
        self, session_id: str, filter: EvidenceFilter | None = None
    ) -> list[Evidence]:
        doc = await self._run(self._document, session_id)
        return filter_evidences(list(doc.evidences.values()) if doc else [], filter)

    async def list_context_blocks(
        self, session_id: str, filter: BlockFilter | None = None
    ) -> list[ContextBlock]:
        doc = await self._run(self._document, session_id)
        return filter_blocks(doc.context_blocks if doc else [], filter)

    def _turns(self, session_id: str) -> list[TurnRecord]:
        stored = self._read(self._path(session_id))
        return stored.turns if stored else []

    async def _list_turns(self, session_id: str, limit: int | None) -> list[TurnRecord]:
        return newest(await self._run(self._turns, session_id), limit)

    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord | None:
        turns = await self._run(self._turns, session_id)
        return next((t for t in turns if t.turn_id == turn_id), None)

    def _session_ids(self, user_id: str | None) -> list[str]:
        ids = []
        for path in self.directory.glob("*.json"):
            stem = path.name[: -len(".json")]
            if user_id is None and not stem.startswith("~"):
                ids.append(unquote(stem))
                continue
            stored = self._read(path)
            if stored is not None and (
                user_id is None or user_id_of(stored.document.meta) == user_id
            ):
                ids.append(stored.document.session.session_id)
        return sorted(ids)

    async def list_sessions(self, user_id: str | None = None) -> list[str]:
        return await self._run(self._session_ids, user_id)

    def _audit_records(self, session_id: str | None) -> list[AuditRecord]:
        path = self.directory / _AUDIT_FILE
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"{path}: cannot read audit log: {exc}") from exc
        records = []
        for number, line in enumerate(lines, 1):
            try:
                record = AuditRecord(**json.loads(line))
            except (ValueError, TypeError) as exc:
                raise StoreError(f"{path}:{number}: corrupt audit record: {exc}") from exc
            if session_id is None or record.session_id == session_id:
                records.append(record)
        return records

    async def audit_log(self, session_id: str | None = None) -> list[AuditRecord]:
        return await self._run(self._audit_records, session_id)

    async def close(self) -> None:
        """Mark the store closed (it holds no open files between calls)."""
        self._closed = True


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _schema_version(data: bytes) -> object:
    """The ``document.schema_version`` in ``data``, or None when it has none."""
    try:
        raw = json.loads(data)
        return raw["document"]["schema_version"]
    except (ValueError, LookupError, TypeError):
        return None
