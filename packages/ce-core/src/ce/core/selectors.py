"""Ref selectors: narrow an evidence's content to the part a block cites.

Grammar (one selector, or several joined by commas)::

    lines:12-18        lines 12 to 18, 1-based and inclusive; lines:5 is line 5 alone,
                       lines:5- runs to the last line. Lines end at "\\n"; a final newline
                       does not start another line.
    chars:120-260      characters 120 to 259 (0-based, end excluded); chars:120- runs to the
                       end; chars:7 is the single character at 7.
    json:$.a.b[0].c    a JSONPath subset on content that is JSON: $ (the root), .key,
                       ['key'] / ["key"], [n] (negative n counts from the end), [*] and .*
                       (every element or value; the result is then a list). A string result
                       is returned as it is, anything else as JSON text.
    regex:pattern      every non-empty match, joined by newlines; group 1 instead of the
                       whole match when the pattern has exactly one group.

Selectors joined by commas apply in order, each to the result of the one before, so
``lines:12-18,chars:0-80`` is the first 80 characters of lines 12-18 (their
intersection). A comma splits only where the next selector's ``type:`` follows it, so
patterns and JSON keys may contain commas; write ``\\,`` inside a regex to keep a comma that
is followed by such a prefix.

Every failure (malformed selector, out of range, no match, content that is not JSON, a
pattern that runs out of time, content or selector over the size limits) raises
:class:`~ce.core.errors.SelectorResolveError`, which the renderer degrades to the block's own
content.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import regex

from ce.core.errors import SelectorResolveError

__all__ = [
    "DEFAULT_MAX_CONTENT_CHARS",
    "DEFAULT_MAX_SELECTOR_CHARS",
    "DEFAULT_REGEX_TIMEOUT",
    "SELECTOR_TYPES",
    "ParsedSelector",
    "RefSelector",
]

SELECTOR_TYPES = ("lines", "chars", "json", "regex")
DEFAULT_MAX_CONTENT_CHARS = 8 * 1024 * 1024
DEFAULT_MAX_SELECTOR_CHARS = 4096
DEFAULT_REGEX_TIMEOUT = 0.1
_MAX_PARTS = 16
_MAX_JSON_STEPS = 64

_SPLIT = regex.compile(r"(?<!\\),[ \t]*(?=(?:lines|chars|json|regex):)")
_PREFIX = regex.compile(r"[ \t]*([a-z]+):")
_RANGE = regex.compile(r"[ \t]*([0-9]{1,18})(?:[ \t]*(-)[ \t]*([0-9]{1,18})?)?[ \t]*")
_JSON_STEP = regex.compile(
    r"\.(?P<dotstar>\*)(?![^.\[])"
    r"|\.(?P<name>[^.\[\]'\"]+)"
    r"|\[(?P<index>-?[0-9]{1,18})\]"
    r"|\[(?P<star>\*)\]"
    r"|\['(?P<sq>(?:[^'\\]|\\.)*)'\]"
    r'|\["(?P<dq>(?:[^"\\]|\\.)*)"\]'
)
_ESCAPE = regex.compile(r"\\(.)")


@dataclass(frozen=True)
class ParsedSelector:
    """One parsed selector.

    ``type`` is one of :data:`SELECTOR_TYPES`; ``params`` holds ``{"from": int, "to": int |
    None}`` for lines/chars (1-based with an inclusive end for lines, 0-based with an
    exclusive end for chars; ``None`` = to the end), ``{"path": str, "steps": list}`` for
    json (steps are ``("key", str)``, ``("index", int)`` or ``("all", None)``) and
    ``{"pattern": str}`` for regex.
    """

    type: str
    params: dict[str, Any] = field(default_factory=dict)


class RefSelector:
    """Parses selectors and extracts what they select. Pure computation, synchronous.

    Work is bounded: content longer than ``max_content_chars`` and selectors longer than
    ``max_selector_chars`` are refused, a regex gets ``regex_timeout`` seconds in all, JSON
    paths have at most 64 steps and JSON nested deeper than the interpreter's recursion limit
    is refused.
    """

    def __init__(
        self,
        *,
        max_content_chars: int = DEFAULT_MAX_CONTENT_CHARS,
        max_selector_chars: int = DEFAULT_MAX_SELECTOR_CHARS,
        regex_timeout: float = DEFAULT_REGEX_TIMEOUT,
    ) -> None:
        self._max_content = max_content_chars
        self._max_selector = max_selector_chars
        self._regex_timeout = regex_timeout

    def parse(self, selector: str) -> list[ParsedSelector]:
        """Parse ``selector`` into its parts; raises :class:`SelectorResolveError` when it is
        malformed (unknown type, bad range, bad JSON path, invalid regex, too long)."""
        if len(selector) > self._max_selector:
            raise SelectorResolveError(
                f"selector is {len(selector)} characters long; the limit is {self._max_selector}"
            )
        parts = _SPLIT.split(selector)
        if len(parts) > _MAX_PARTS:
            raise SelectorResolveError(
                f"selector has {len(parts)} parts; the limit is {_MAX_PARTS}"
            )
        return [self._parse_one(part) for part in parts]

    def extract(self, content: str, selector: str) -> str:
        """What ``selector`` selects from ``content``; raises :class:`SelectorResolveError`
        when the selector is malformed or does not resolve against the content."""
        if len(content) > self._max_content:
            raise SelectorResolveError(
                f"content is {len(content)} characters long; selectors apply to at most "
                f"{self._max_content}"
            )
        result = content
        for parsed in self.parse(selector):
            if parsed.type == "lines":
                result = _lines(result, parsed.params["from"], parsed.params["to"])
            elif parsed.type == "chars":
                result = _chars(result, parsed.params["from"], parsed.params["to"])
            elif parsed.type == "json":
                result = _json(result, parsed.params["path"], parsed.params["steps"])
            else:
                result = self._regex(result, parsed.params["pattern"])
        return result

    # parsing

    def _parse_one(self, part: str) -> ParsedSelector:
        prefix = _PREFIX.match(part)
        if prefix is None or prefix.group(1) not in SELECTOR_TYPES:
            raise SelectorResolveError(
                f"malformed selector {part!r}: expected one of "
                f"{', '.join(t + ':' for t in SELECTOR_TYPES)}"
            )
        kind, body = prefix.group(1), part[prefix.end() :]
        if kind in ("lines", "chars"):
            return ParsedSelector(kind, _parse_range(kind, body))
        if kind == "json":
            path = body.strip()
            return ParsedSelector(kind, {"path": path, "steps": _parse_json_path(path)})
        if not body:
            raise SelectorResolveError("malformed selector 'regex:': empty pattern")
        try:
            regex.compile(body)
        except (regex.error, ValueError, OverflowError) as exc:
            raise SelectorResolveError(f"invalid regex in selector {part!r}: {exc}") from exc
        return ParsedSelector(kind, {"pattern": body})

    def _regex(self, content: str, pattern: str) -> str:
        compiled = regex.compile(pattern)
        deadline = time.monotonic() + self._regex_timeout
        found: list[str] = []
        try:
            for m in compiled.finditer(content, timeout=self._regex_timeout):
                if time.monotonic() > deadline:
                    raise TimeoutError
                text = m.group(1) if compiled.groups == 1 else m.group()
                if text:
                    found.append(text)
        except TimeoutError:
            raise SelectorResolveError(
                f"regex {pattern!r} did not finish within {self._regex_timeout:g}s"
            ) from None
        if not found:
            raise SelectorResolveError(f"regex {pattern!r} does not match the content")
        return "\n".join(found)


def _parse_range(kind: str, body: str) -> dict[str, Any]:
    m = _RANGE.fullmatch(body)
    if m is None:
        raise SelectorResolveError(
            f"malformed selector '{kind}:{body}': expected {kind}:FROM-TO, {kind}:FROM- or {kind}:N"
        )
    start = int(m.group(1))
    end = None if m.group(3) is None else int(m.group(3))
    if m.group(2) is None:  # a single line / character
        end = start if kind == "lines" else start + 1
    if kind == "lines" and start < 1:
        raise SelectorResolveError(f"malformed selector 'lines:{body}': lines are numbered from 1")
    if end is not None and (end < start if kind == "lines" else end <= start):
        raise SelectorResolveError(f"malformed selector '{kind}:{body}': the range is empty")
    return {"from": start, "to": end}


def _parse_json_path(path: str) -> list[tuple[str, Any]]:
    if not path.startswith("$"):
        raise SelectorResolveError(f"malformed JSON path {path!r}: it must start with '$'")
    steps: list[tuple[str, Any]] = []
    pos = 1
    while pos < len(path):
        m = _JSON_STEP.match(path, pos)
        if m is None:
            raise SelectorResolveError(f"malformed JSON path {path!r} at position {pos}")
        if m.group("name") is not None:
            steps.append(("key", m.group("name")))
        elif m.group("index") is not None:
            steps.append(("index", int(m.group("index"))))
        elif m.group("star") is not None or m.group("dotstar") is not None:
            steps.append(("all", None))
        else:
            quoted = m.group("sq") if m.group("sq") is not None else m.group("dq")
            steps.append(("key", _ESCAPE.sub(r"\1", quoted)))
        pos = m.end()
    if len(steps) > _MAX_JSON_STEPS:
        raise SelectorResolveError(f"JSON path {path!r} has more than {_MAX_JSON_STEPS} steps")
    return steps


# extraction


def _lines(content: str, start: int, end: int | None) -> str:
    lines = content.split("\n")
    count = len(lines) - 1 if content.endswith("\n") else len(lines)
    if not content:
        count = 0
    last = count if end is None else end
    if start > count or last > count:
        shown = str(start) if end == start else f"{start}-{'' if end is None else end}"
        raise SelectorResolveError(f"lines:{shown} is out of range: the content has {count} lines")
    return "\n".join(lines[start - 1 : last])


def _chars(content: str, start: int, end: int | None) -> str:
    stop = len(content) if end is None else end
    if start >= len(content) or stop > len(content):
        shown = f"{start}-{'' if end is None else end}"
        raise SelectorResolveError(
            f"chars:{shown} is out of range: the content has {len(content)} characters"
        )
    return content[start:stop]


def _json(content: str, path: str, steps: list[tuple[str, Any]]) -> str:
    try:
        document = json.loads(content)
    except RecursionError:
        raise SelectorResolveError(f"json:{path}: the content is nested too deeply") from None
    except ValueError as exc:
        raise SelectorResolveError(f"json:{path}: the content is not JSON ({exc})") from None
    nodes = [document]
    many = False
    for i, (kind, arg) in enumerate(steps):
        where = _path_prefix(steps[:i])
        nodes = [
            child for node in nodes for child in _step(node, kind, arg, where, strict=not many)
        ]
        many = many or kind == "all"
        if not nodes:
            raise SelectorResolveError(f"json:{path} does not match the content")
    value = nodes if many else nodes[0]
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except RecursionError:
        raise SelectorResolveError(f"json:{path}: the result is nested too deeply") from None


def _step(node: Any, kind: str, arg: Any, where: str, *, strict: bool) -> list[Any]:
    """The children of ``node`` one step selects; in strict mode (no wildcard before) a
    missing key or index is an error, else it just selects nothing."""
    if kind == "all":
        if isinstance(node, dict):
            return list(node.values())
        if isinstance(node, list):
            return list(node)
    elif kind == "key" and isinstance(node, dict):
        if arg in node:
            return [node[arg]]
    elif kind == "index" and isinstance(node, list):
        if -len(node) <= arg < len(node):
            return [node[arg]]
        if strict:
            raise SelectorResolveError(
                f"json: index {arg} is out of range at {where} (length {len(node)})"
            )
        return []
    if strict:
        wanted = {"all": "a list or object", "key": f"an object with key {arg!r}"}
        raise SelectorResolveError(f"json: expected {wanted.get(kind, 'a list')} at {where}")
    return []


def _path_prefix(steps: list[tuple[str, Any]]) -> str:
    out = "$"
    for kind, arg in steps:
        out += ".*" if kind == "all" else f"[{arg}]" if kind == "index" else f"[{arg!r}]"
    return out
