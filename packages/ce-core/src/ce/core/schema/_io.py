"""Validation, (de)serialization and the JSON Schema of the session document."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from ce.core.errors import SchemaValidationError
from ce.core.schema._document import SessionDocument
from ce.core.schema._version import SCHEMA_VERSION

__all__ = [
    "document_from_json",
    "document_to_json",
    "dump_document",
    "json_schema",
    "json_schema_text",
    "load_document",
    "validate_model",
]

_SCHEMA_ID = "https://context-engine.dev/schema/session-document.schema.json"


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of :class:`SessionDocument` at ``SCHEMA_VERSION``."""
    schema = SessionDocument.model_json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": _SCHEMA_ID,
        "x-schema-version": SCHEMA_VERSION,
        **schema,
    }


def json_schema_text() -> str:
    """:func:`json_schema` as the canonical text stored in ``docs/schema/``."""
    return json.dumps(json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


def validate_model(model: type[BaseModel], data: Any) -> Any:
    """Validate ``data`` as ``model``; raise :class:`SchemaValidationError` naming field paths."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SchemaValidationError(
            [(_path(err["loc"]), err["msg"]) for err in exc.errors()]
        ) from None


def load_document(data: dict[str, Any]) -> SessionDocument:
    """Validate a document dict, migrating it first when it has an older ``schema_version``.

    Raises :class:`SchemaValidationError` for an invalid document and
    :class:`~ce.core.errors.MigrationError` for a version that cannot be migrated.
    """
    if not isinstance(data, dict):
        raise SchemaValidationError([("", "a session document must be a JSON object")])
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        from ce.core.schema.migrate import Migrator

        data = Migrator().migrate(data, str(version)).doc.model_dump(mode="json")
    doc: SessionDocument = validate_model(SessionDocument, data)
    return doc


def dump_document(doc: SessionDocument) -> dict[str, Any]:
    """The JSON-ready dict of ``doc`` (enums as their values, unset optionals left out)."""
    return doc.model_dump(mode="json", exclude_none=True)


def document_to_json(doc: SessionDocument) -> str:
    return json.dumps(dump_document(doc), ensure_ascii=False, separators=(",", ":"))


def document_from_json(text: str | bytes) -> SessionDocument:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaValidationError([("", f"not valid JSON: {exc}")]) from None
    return load_document(data)
