"""``ce export``, ``ce import`` and ``ce schema``: sessions as JSON files (rich not needed).

An export is ``{"document": <session document>, "turns": [<turn record>, ...]}``; ``ce import``
also takes a bare session document (no turn records). Older ``schema_version``s are migrated.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ce.core.cli._common import CliError, session_or_fail
from ce.core.errors import MigrationError, SchemaValidationError
from ce.core.schema import (
    SessionDocument,
    TurnRecord,
    dump_document,
    json_schema_text,
    load_document,
    validate_model,
)
from ce.core.stores import SessionChanges, Store

__all__ = ["export", "export_data", "import_", "parse_export", "schema"]

_EXPORT_KEYS = frozenset({"document", "turns"})


def export_data(doc: SessionDocument, turns: list[TurnRecord]) -> dict[str, Any]:
    """The JSON-ready export of a session: its document and its turn records, oldest first."""
    return {
        "document": dump_document(doc),
        "turns": [t.model_dump(mode="json", exclude_none=True) for t in turns],
    }


async def export(store: Store, session_id: str, output: str | None) -> None:
    """Write the export of ``session_id`` to ``output`` (stdout when None or ``-``)."""
    doc = await session_or_fail(store, session_id)
    turns = await store.list_turns(session_id)
    text = json.dumps(export_data(doc, turns), ensure_ascii=False, indent=2) + "\n"
    if output is None or output == "-":
        sys.stdout.write(text)
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"{output}: cannot write: {exc.strerror or exc}") from None
    print(
        f"exported session {session_id} to {output}: {len(doc.session.messages)} message(s), "
        f"{len(turns)} turn record(s)"
    )


@contextmanager
def _located(prefix: str) -> Iterator[None]:
    """Re-raise :class:`SchemaValidationError` with field paths under ``prefix``."""
    try:
        yield
    except SchemaValidationError as exc:
        raise SchemaValidationError(
            [
                (f"{prefix}.{path}" if prefix and path else prefix or path, msg)
                for path, msg in exc.errors
            ]
        ) from None


def parse_export(text: str) -> tuple[SessionDocument, list[TurnRecord], str]:
    """The document and turn records of an export (or of a bare document) and the field path
    of the document in it (``"document"``, or ``""`` for a bare one).

    Raises :class:`SchemaValidationError` naming the field paths of what is invalid.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaValidationError([("", f"not valid JSON: {exc}")]) from None
    if not isinstance(data, dict):
        raise SchemaValidationError([("", "must be a JSON object")])
    if "document" not in data:
        return load_document(data), [], ""
    unknown = sorted(set(data) - _EXPORT_KEYS)
    if unknown:
        raise SchemaValidationError([(key, "unknown key of an export") for key in unknown])
    with _located("document"):
        doc = load_document(data["document"])
    raw_turns = data.get("turns", [])
    if not isinstance(raw_turns, list):
        raise SchemaValidationError([("turns", "must be a list")])
    turns = []
    for index, raw in enumerate(raw_turns):
        with _located(f"turns.{index}"):
            turns.append(validate_model(TurnRecord, raw))
    return doc, turns, "document"


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise CliError(f"{path}: cannot read: {reason or exc}") from None


async def import_(store: Store, path: str, session_id: str | None, replace: bool) -> None:
    """Store the session exported in ``path`` (``-``: stdin), under ``session_id`` if given.

    Refuses (:class:`CliError`) to overwrite a stored session unless ``replace``; a replaced
    session loses its turn records to the imported ones.
    """
    try:
        doc, turns, where = parse_export(_read(path))
    except (SchemaValidationError, MigrationError) as exc:
        raise CliError(f"{path}: {exc}") from None
    if session_id is not None:
        session = doc.session.model_copy(update={"session_id": session_id})
        doc = doc.model_copy(update={"session": session})
    target = doc.session.session_id
    current = await store.get_version(target)
    if current and not replace:
        raise CliError(
            f"session {target!r} already exists (version {current}); "
            "pass --replace to overwrite it or --session to import it under another id"
        )
    try:
        with _located(where):
            result = await store.put_session(target, doc, expected_version=current)
    except SchemaValidationError as exc:
        raise CliError(f"{path}: {exc}") from None
    if turns:
        result = await store.commit(target, SessionChanges(turns=turns), result.version)
    print(
        f"imported session {target}: {len(doc.session.messages)} message(s), "
        f"{len(doc.evidences)} evidence(s), {len(turns)} turn record(s); "
        f"version {result.version}"
    )


def schema() -> None:
    """Print the JSON Schema of the session document."""
    sys.stdout.write(json_schema_text())
