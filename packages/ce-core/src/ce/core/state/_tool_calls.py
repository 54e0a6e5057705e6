"""Tool-call arguments: tolerant parsing, normalisation of requests, and argument digests."""

from __future__ import annotations

import copy
import json
from typing import Any

from ce.core.errors import InvariantViolationError
from ce.core.primitives import Sha256Hasher
from ce.core.schema import ToolCallRequest
from ce.core.state._checks import json_normalized

__all__ = ["args_digest", "normalize_tool_call", "parse_tool_arguments"]

_JSON_TYPE_NAMES = {
    dict: "object",
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}

_DIGEST_VALUE_LIMIT = 256
"""Argument values whose JSON exceeds this many bytes are replaced by a hash in digests."""

_HASHER = Sha256Hasher()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_tool_arguments(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    """Parse the raw argument text of a tool call; never raises.

    Returns ``(arguments, None)`` for a JSON object and ``(None, reason)`` otherwise (invalid
    JSON, NaN/Infinity, or JSON that is not an object). Empty or whitespace-only text means
    "no arguments" and parses to ``{}``.
    """
    if not raw.strip():
        return {}, None
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    except (ValueError, RecursionError) as exc:
        return None, f"invalid JSON: {exc}"
    if not isinstance(value, dict):
        kind = _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
        return None, f"arguments must be a JSON object, got {kind}"
    return value, None


def normalize_tool_call(request: ToolCallRequest) -> ToolCallRequest:
    """A validated copy of ``request`` with ``arguments``/``parse_error`` filled in.

    The id and name must be non-empty. When neither ``arguments`` nor ``parse_error`` is set,
    ``raw_arguments`` is parsed; when only ``arguments`` is set, ``raw_arguments`` becomes its
    JSON text. Raises :class:`InvariantViolationError` for an invalid request.
    """
    if not request.tool_call_id.strip():
        raise InvariantViolationError("a tool call needs a non-empty tool_call_id")
    if not request.name.strip():
        raise InvariantViolationError(f"tool call {request.tool_call_id!r} needs a name")
    if request.arguments is not None and request.parse_error is not None:
        raise InvariantViolationError(
            f"tool call {request.tool_call_id!r} has both arguments and a parse_error"
        )
    raw = request.raw_arguments
    arguments: dict[str, Any] | None
    parse_error = request.parse_error
    if request.arguments is not None:
        arguments = json_normalized(request.arguments, f"arguments of {request.tool_call_id!r}")
        if not raw:
            raw = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    elif parse_error is None:
        arguments, parse_error = parse_tool_arguments(raw)
    else:
        arguments = None
    return ToolCallRequest(
        tool_call_id=request.tool_call_id,
        name=request.name,
        raw_arguments=raw,
        arguments=arguments,
        parse_error=parse_error,
    )


def args_digest(request: ToolCallRequest) -> dict[str, Any]:
    """A bounded digest of a call's arguments for its ``ToolCall`` record.

    Small argument values are kept as they are; a value whose JSON is larger than 256 bytes is
    replaced by ``"<N bytes, sha256:…>"``. Arguments that did not parse are described by the
    hash and size of the raw text and the parse error.
    """
    if request.arguments is None:
        raw = request.raw_arguments
        return {
            "raw_sha256": _HASHER.digest(raw),
            "raw_bytes": len(raw.encode("utf-8")),
            "parse_error": request.parse_error or "",
        }
    digest: dict[str, Any] = {}
    for key, value in request.arguments.items():
        encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        size = len(encoded.encode("utf-8"))
        if size <= _DIGEST_VALUE_LIMIT:
            digest[key] = copy.deepcopy(value)
        else:
            digest[key] = f"<{size} bytes, sha256:{_HASHER.digest(encoded)}>"
    return digest
