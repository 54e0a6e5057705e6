"""Validation and normalisation shared by the AgentState writers."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ce.core.errors import InvariantViolationError
from ce.core.schema import LodSections, Message, Role, Section, sections_to_text

__all__ = [
    "MAX_META_VALUE_BYTES",
    "META_KEY_PATTERN",
    "json_normalized",
    "latest_system_instruction",
    "normalize_content",
    "validate_meta",
]

META_KEY_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
"""A metadata key: snake_case, starting with a lowercase letter (matched in full)."""

MAX_META_VALUE_BYTES = 2048
"""The largest a metadata value may be, as compact UTF-8 JSON; larger data becomes evidence."""


def json_normalized(value: Any, what: str) -> Any:
    """``value`` as it reads back from strict JSON (tuples become lists, keys strings…).

    Raises :class:`InvariantViolationError` when ``value`` is not JSON-serializable or holds
    NaN/Infinity, which would not survive a store round trip unchanged.
    """
    try:
        return json.loads(_compact_json(value))
    except (TypeError, ValueError) as exc:
        raise InvariantViolationError(f"{what} is not JSON-serializable: {exc}") from None


def _compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def validate_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check metadata and return a JSON-normalised deep copy of it.

    Every key must match :data:`META_KEY_PATTERN` in full and every value must serialize to at
    most :data:`MAX_META_VALUE_BYTES` bytes of compact UTF-8 JSON; otherwise
    :class:`InvariantViolationError` is raised.
    """
    if not meta:
        return {}
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if not isinstance(key, str) or META_KEY_PATTERN.fullmatch(key) is None:
            raise InvariantViolationError(f"metadata key {key!r} is not snake_case")
        try:
            encoded = _compact_json(value)
        except (TypeError, ValueError) as exc:
            raise InvariantViolationError(
                f"metadata value of {key!r} is not JSON-serializable: {exc}"
            ) from None
        size = len(encoded.encode("utf-8"))
        if size > MAX_META_VALUE_BYTES:
            raise InvariantViolationError(
                f"metadata value of {key!r} is {size} bytes of JSON; the limit is "
                f"{MAX_META_VALUE_BYTES} (store larger data as evidence)"
            )
        out[key] = json.loads(encoded)
    return out


def normalize_content(
    content: str | Sequence[Section], lod: LodSections | None
) -> tuple[str, LodSections | None]:
    """The message text and Level-of-Detail sections of a write.

    ``content`` is the Live rendering: a string, or sections joined with
    :func:`~ce.core.schema.sections_to_text`. ``lod`` carries the cheaper renderings; its
    ``live`` level defaults to the content's sections, and an empty ``content`` is taken from
    ``lod.live``. Returns copies, never the caller's objects.
    """
    if isinstance(content, str):
        text = content
        live = [Section(body=content)] if content else []
        structured = False
    else:
        live = [section.model_copy() for section in content]
        text = sections_to_text(live)
        structured = True
    if lod is None:
        return text, (LodSections(live=live) if structured else None)
    out = lod.model_copy(deep=True)
    if not out.live:
        out.live = live
    elif not text:
        text = sections_to_text(out.live)
    return text, out


def latest_system_instruction(messages: Sequence[Message]) -> Message | None:
    """The newest system message of a history (THE system instruction), or None."""
    for message in reversed(messages):
        if message.role is Role.SYSTEM:
            return message
    return None
