"""Upgrading older session documents to the current schema.

Change log
----------
``0.9 -> 1.0``
  The pre-release layout written by the first prototypes:

  * session fields (``session_id``, ``messages``, ``summary``) sat at the top level; they move
    under ``session``;
  * messages used ``ts`` for their timestamp; renamed to ``at``;
  * ``evidences`` was a list whose items carried ``id``; it becomes a mapping keyed by
    ``evidence_id``;
  * ``tool_calls`` sat at the top level with ``id``/``name``/``args``; they move to
    ``session.tool_state.tool_calls`` as ``tool_call_id``/``tool``/``args_digest`` with a
    ``builtin`` provider when none was recorded;
  * ``usage`` sat at the top level with ``id``; it becomes ``session.model_usage`` with
    ``model_usage_id`` and ``total_tokens`` filled from the prompt and completion counts;
  * ``blocks`` is renamed ``context_blocks``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ce.core.errors import MigrationError, SchemaValidationError
from ce.core.schema._document import SessionDocument
from ce.core.schema._version import SCHEMA_VERSION

__all__ = ["MigrateResult", "Migrator"]


@dataclass
class MigrateResult:
    """The migrated document and what was done to it."""

    doc: SessionDocument
    from_version: str
    to_version: str
    changes: list[str] = field(default_factory=list)


_Step = Callable[[dict[str, Any], list[str]], dict[str, Any]]


def _pop_list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.pop(key, None)
    if value is None:
        return []
    if not isinstance(value, list):
        raise MigrationError(f"0.9 document: {key!r} must be a list, got {type(value).__name__}")
    return value


def _item(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MigrationError(f"0.9 document: {where} must be an object")
    return dict(value)


def _migrate_0_9(data: dict[str, Any], log: list[str]) -> dict[str, Any]:
    data = dict(data)
    if "session_id" not in data:
        raise MigrationError("0.9 document: missing top-level 'session_id'")
    messages = []
    for i, raw in enumerate(_pop_list(data, "messages")):
        msg = _item(raw, f"messages[{i}]")
        if "ts" in msg:
            msg["at"] = msg.pop("ts")
        messages.append(msg)
    if messages:
        log.append(f"renamed messages[].ts to messages[].at ({len(messages)} messages)")
    session: dict[str, Any] = {"session_id": data.pop("session_id"), "messages": messages}
    log.append("moved session_id, messages, summary under session")
    if data.get("summary") is not None:
        session["summary"] = data.pop("summary")
    else:
        data.pop("summary", None)

    tool_calls = []
    for i, raw in enumerate(_pop_list(data, "tool_calls")):
        call = _item(raw, f"tool_calls[{i}]")
        try:
            new = {"tool_call_id": call.pop("id"), "tool": call.pop("name")}
        except KeyError as exc:
            raise MigrationError(f"0.9 document: tool_calls[{i}] lacks {exc.args[0]!r}") from None
        new["args_digest"] = call.pop("args", {})
        new["provider"] = call.pop("provider", {"kind": "builtin"})
        new.update(call)
        tool_calls.append(new)
    session["tool_state"] = {"tool_calls": tool_calls}
    log.append(
        f"moved top-level tool_calls to session.tool_state.tool_calls ({len(tool_calls)}), "
        "renamed id/name/args to tool_call_id/tool/args_digest, default provider builtin"
    )

    usages = []
    for i, raw in enumerate(_pop_list(data, "usage")):
        usage = _item(raw, f"usage[{i}]")
        if "id" not in usage:
            raise MigrationError(f"0.9 document: usage[{i}] lacks 'id'")
        usage["model_usage_id"] = usage.pop("id")
        usage.setdefault(
            "total_tokens",
            int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0)),
        )
        usages.append(usage)
    session["model_usage"] = usages
    log.append(
        f"moved top-level usage to session.model_usage ({len(usages)}), id -> model_usage_id"
    )

    evidences: dict[str, Any] = {}
    for i, raw in enumerate(_pop_list(data, "evidences")):
        ev = _item(raw, f"evidences[{i}]")
        if "id" not in ev:
            raise MigrationError(f"0.9 document: evidences[{i}] lacks 'id'")
        ev["evidence_id"] = ev.pop("id")
        evidences[ev["evidence_id"]] = ev
    log.append(f"turned evidences list into a mapping by evidence_id ({len(evidences)})")

    out: dict[str, Any] = {
        "schema_version": "1.0",
        "session": session,
        "evidences": evidences,
        "context_blocks": _pop_list(data, "blocks"),
    }
    log.append("renamed blocks to context_blocks")
    if data.get("meta") is not None:
        out["meta"] = data.pop("meta")
    data.pop("meta", None)
    data.pop("schema_version", None)
    if data:
        raise MigrationError(f"0.9 document: unknown top-level keys {sorted(data)}")
    return out


class Migrator:
    """Upgrades documents step by step to :data:`SCHEMA_VERSION`.

    Versions it knows: ``0.9`` and the current one. Anything else raises
    :class:`MigrationError`.
    """

    _steps: dict[str, tuple[str, _Step]] = {"0.9": ("1.0", _migrate_0_9)}

    def current_version(self) -> str:
        return SCHEMA_VERSION

    def can_migrate(self, from_version: str) -> bool:
        version = from_version
        while version != SCHEMA_VERSION:
            step = self._steps.get(version)
            if step is None:
                return False
            version = step[0]
        return True

    def migrate(self, doc: dict[str, Any], from_version: str) -> MigrateResult:
        """Return ``doc`` upgraded and validated; the input dict is not modified."""
        if not self.can_migrate(from_version):
            known = ", ".join(sorted([*self._steps, SCHEMA_VERSION]))
            raise MigrationError(
                f"cannot migrate schema_version {from_version!r} (known versions: {known})"
            )
        data = copy.deepcopy(doc)
        log: list[str] = []
        version = from_version
        while version != SCHEMA_VERSION:
            target, step = self._steps[version]
            data = step(data, log)
            version = target
        from ce.core.schema._io import validate_model

        try:
            migrated: SessionDocument = validate_model(SessionDocument, data)
        except SchemaValidationError as exc:
            raise MigrationError(f"migrated document is invalid: {exc}") from exc
        return MigrateResult(
            doc=migrated, from_version=from_version, to_version=SCHEMA_VERSION, changes=log
        )
