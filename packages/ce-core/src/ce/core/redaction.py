"""Redaction of sensitive text.

:class:`RegexRedactor` replaces every match of its rules with ``[REDACTED:<rule>]``. Built-in
rules (all on by default; where matches overlap, the marker names the leftmost, then the
first rule in this order):

``private_key``
    PEM private-key blocks (``-----BEGIN … PRIVATE KEY-----`` up to the matching END line).
``bearer_token``
    ``Bearer <token>`` credentials (the token must have 8+ characters and contain a digit or
    a symbol, or have 32+, so prose like "Bearer certificates" stays) and JSON Web Tokens
    ``eyJ….….…``.
``api_key``
    ``sk-…`` (OpenAI, Anthropic; with a digit), Stripe ``sk_live_…``/``rk_test_…``, AWS access
    key ids ``AKIA…``/``ASIA…``, GitHub ``ghp_…``/``gho_…``/``github_pat_…``, Slack
    ``xox[abprs]-…``, Google ``AIza…``; and the value of an assignment ``key=value`` /
    ``"key": "value"`` whose key ends in password, passwd, secret, token, api key, access key,
    private key or credential(s) and whose value has 8+ characters, not all letters (only
    the value is replaced).
``email``
    ASCII addresses ``local@domain.tld``.
``payment_card``
    13–19 digits, bare or grouped 4-4-4-4(-3) / 4-6-5 / 4-6-4 with one kind of separator
    (space or dash), starting with 2–6 (the card networks' ranges) and passing the Luhn check.
``ipv6``
    Addresses ``ipaddress`` accepts, with at least three non-empty groups or an embedded
    IPv4 (so ``a[1::2]`` slices and ``::1`` stay).
``ipv4``
    Dotted quads of octets 0–255, not inside a longer dotted number or after a letter
    (``1.2.3.4`` is redacted, ``v1.2.3.4`` and ``1.2.3.4.5`` are not).
``phone``
    International ``+<country code>`` followed by 2–7 groups of digits (8–16 digits in all);
    North American ``(415) 555-0123`` / ``415-555-0123`` / ``415.555.0123`` /
    ``1-800-555-0199``; national numbers with a trunk ``0`` and separators (``020 7946 0958``,
    ``(030) 1234567``, ``010-12345678``, ``06 12 34 56 78``), 9+ digits; Chinese mobile
    numbers ``13812345678`` / ``138-1234-5678``. A bare run of digits is never a phone
    (except a Chinese mobile number), so years, order numbers, ids, decimals and timestamps
    stay; dates with ``-``/``.``/``/`` do not fit these shapes.

Boundaries are ASCII, so values glued to CJK text (``手机13812345678``) are found. Every
built-in pattern uses bounded or possessive quantifiers only, so matching is linear in the
text length. User :class:`~ce.core.config.RedactionRules` add ``patterns`` (run with a
timeout), literal ``dictionaries`` (case-insensitive, as whole words where they begin or
end with a letter or digit) and ``field_paths`` for :meth:`RegexRedactor.redact_value`; user
rules come before the built-ins.

All rules scan the same text and overlapping matches merge into one marker; the result is
scanned again until nothing matches (at most three passes). Existing ``[REDACTED:…]``
markers are never matched again, so redacting twice gives the same text as redacting once.
"""

from __future__ import annotations

import bisect
import functools
import ipaddress
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import regex

from ce.core.config import RedactionRules
from ce.core.errors import RedactionError

__all__ = [
    "BUILTIN_RULES",
    "DEFAULT_PATTERN_TIMEOUT",
    "RedactResult",
    "Redactor",
    "RegexRedactor",
    "marker",
]

DEFAULT_PATTERN_TIMEOUT = 1.0
"""Seconds one user pattern may spend on one text before :class:`RedactionError`."""
_MAX_PASSES = 3


def marker(rule: str) -> str:
    """The text that replaces a match of ``rule``: ``[REDACTED:<rule>]``."""
    return f"[REDACTED:{rule}]"


_MARKER = regex.compile(r"\[REDACTED:[A-Za-z0-9_.-]{1,64}\]")


@dataclass(frozen=True)
class RedactResult:
    """``redacted_text`` with every match replaced; ``applied_rules`` names the rules whose
    markers it gained (each once, in rule order); ``has_sensitive`` is true when any did."""

    redacted_text: str
    applied_rules: list[str] = field(default_factory=list)
    has_sensitive: bool = False


@runtime_checkable
class Redactor(Protocol):
    """Removes sensitive content from text. Async because an implementation may call an
    external service (a PII-detection API); ``rules``, when given, replace the
    implementation's own user rules for this call. Raises :class:`RedactionError` when it
    cannot redact (the caller then degrades)."""

    async def redact(self, text: str, rules: RedactionRules | None = None) -> RedactResult: ...


# --- rules --------------------------------------------------------------------------------------

Validator = Callable[["regex.Match[str]"], bool]
Span = Callable[["regex.Match[str]"], tuple[int, int]]


@dataclass(frozen=True)
class _Rule:
    """One pattern of a rule (a rule may have several: they share the name).

    ``hints``: substrings one of which every match contains (no hint in a text: no scan).
    ``digits``: every match contains an ASCII digit (a text without one: no scan).
    ``locator``: a cheap pattern whose matches contain every match of ``pattern`` but for
    its first character (a phone number's ``+`` or ``(``); the precise pattern then only
    runs inside them, from one character before (alternations are slow to scan for; a
    pattern starting with a digit class is fast to scan for).
    ``validate``: a rejected match is searched again from its start + 1.
    ``span``: the part of a match that is replaced (default: all of it).
    ``timeout``: seconds per text (user patterns only).
    """

    name: str
    pattern: regex.Pattern[str]
    hints: tuple[str, ...] = ()
    digits: bool = False
    locator: regex.Pattern[str] | None = None
    validate: Validator | None = None
    span: Span | None = None
    timeout: float | None = None


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _valid_card(m: regex.Match[str]) -> bool:
    digits = "".join(ch for ch in m.group() if ch.isdigit())
    return 13 <= len(digits) <= 19 and digits[0] in "23456" and _luhn(digits)


def _valid_phone(m: regex.Match[str]) -> bool:
    digits = sum(ch.isdigit() for ch in m.group())
    if m.group().startswith("+"):
        return 8 <= digits <= 16
    return 9 <= digits <= 13


def _valid_ipv6(m: regex.Match[str]) -> bool:
    text = m.group()
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return "." in text or sum(1 for g in text.split(":") if g) >= 3


def _valid_email(m: regex.Match[str]) -> bool:
    labels = m.group("domain").split(".")
    tld = labels[-1]
    return (
        len(labels) >= 2
        and 2 <= len(tld) <= 24
        and tld.isascii()
        and tld.isalpha()
        and not any(label.startswith("-") or label.endswith("-") for label in labels)
    )


def _without_final_dots(m: regex.Match[str], group: str) -> tuple[int, int]:
    """The span of ``group`` minus the full stops that end a sentence after it."""
    start, end = m.span(group)
    return start, end - (len(m.group(group)) - len(m.group(group).rstrip(".")))


def _valid_bearer(m: regex.Match[str]) -> bool:
    token = m.group("token").rstrip(".")
    return len(token) >= 8 and (len(token) >= 32 or not token.isalpha())


def _bearer_span(m: regex.Match[str]) -> tuple[int, int]:
    return m.start(), _without_final_dots(m, "token")[1]


def _valid_sk(m: regex.Match[str]) -> bool:
    return any(ch.isdigit() for ch in m.group())


def _valid_assignment(m: regex.Match[str]) -> bool:
    value = m.group("value").rstrip(".")
    return len(value) >= 8 and not value.isalpha()


def _value_span(m: regex.Match[str]) -> tuple[int, int]:
    return _without_final_dots(m, "value")


def _vendor_key(prefix: str, body: str, *hints: str) -> _Rule:
    pattern = regex.compile(rf"(?<![A-Za-z0-9_-])(?:{prefix}){body}(?![A-Za-z0-9_-])")
    return _Rule("api_key", pattern, hints=hints)


_DIGITS = "0123456789"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
# The lookaround margin the precise patterns need past a locator region: (?![.,-]?[0-9]).
_LOOKAHEAD_CHARS = 2

_BUILTINS: tuple[_Rule, ...] = (
    _Rule(
        "private_key",
        regex.compile(
            r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----"
            r"(?:[^-]|-(?!----)){0,65536}+"
            r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY-----)?"
        ),
        hints=("PRIVATE KEY-----",),
    ),
    _Rule(
        "bearer_token",
        regex.compile(r"(?<![A-Za-z0-9_])[Bb]earer[ \t]{1,8}+(?P<token>[A-Za-z0-9._~+/-]{8,}+=*+)"),
        hints=("earer",),
        validate=_valid_bearer,
        span=_bearer_span,
    ),
    _Rule(
        "bearer_token",
        regex.compile(
            r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{4,}+\.[A-Za-z0-9_-]{4,}+\.[A-Za-z0-9_-]*+"
        ),
        hints=("eyJ",),
    ),
    _Rule(
        "api_key",
        regex.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}+"),
        hints=("sk-",),
        validate=_valid_sk,
    ),
    _vendor_key("sk|rk", r"_(?:live|test)_[A-Za-z0-9]{16,}+", "_live_", "_test_"),
    _vendor_key("AKIA|ASIA|ABIA|ACCA", r"[A-Z0-9]{16}", "AKIA", "ASIA", "ABIA", "ACCA"),
    _vendor_key("gh[pousr]_", r"[A-Za-z0-9]{36,}+", "gh"),
    _vendor_key("github_pat_", r"[A-Za-z0-9_]{22,}+", "github_pat_"),
    _vendor_key("xox[abprs]-", r"[A-Za-z0-9-]{10,}+", "xox"),
    _vendor_key("AIza", r"[A-Za-z0-9_-]{35}", "AIza"),
    _Rule(
        "api_key",
        regex.compile(
            r"(?<=(?i:passw(?:or)?d|secret|token|credentials?|(?:api|access|secret|private)[_.-]?key)"
            r"[\"']?[ \t]{0,8})"
            r"[:=][ \t]{0,8}+[\"']?(?P<value>(?!\[REDACTED:)[^\s\"'`,;&<>(){}\[\]]{8,}+)"
        ),
        hints=(":", "="),
        validate=_valid_assignment,
        span=_value_span,
    ),
    _Rule(
        "email",
        regex.compile(
            r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}+@"
            r"(?P<domain>[A-Za-z0-9-]{1,63}+(?:\.[A-Za-z0-9-]{1,63}+){1,16}+)(?![A-Za-z0-9-])"
        ),
        hints=("@",),
        validate=_valid_email,
    ),
    _Rule(
        "payment_card",
        regex.compile(
            r"(?<![0-9A-Za-z_.,-])(?:"
            r"[0-9]{13,19}+"
            r"|[0-9]{4}(?P<s>[ -])[0-9]{4}(?P=s)[0-9]{4}(?P=s)[0-9]{1,4}+(?:(?P=s)[0-9]{3})?"
            r"|[0-9]{4}(?P<t>[ -])[0-9]{6}(?P=t)[0-9]{4,5}+"
            r")(?![0-9A-Za-z_]|[.,-][0-9])"
        ),
        digits=True,
        locator=regex.compile(r"[0-9][0-9 -]{12,}+"),
        validate=_valid_card,
    ),
    _Rule(
        "ipv6",
        regex.compile(
            r"(?<![0-9A-Za-z_:.])(?:[0-9A-Fa-f]{0,4}+:){2,7}+"
            rf"(?:{_IPV4}|[0-9A-Fa-f]{{1,4}}+)?(?![0-9A-Za-z_:]|\.[0-9])"
        ),
        hints=(":",),
        validate=_valid_ipv6,
    ),
    _Rule(
        "ipv4",
        regex.compile(rf"(?<![0-9A-Za-z_.]){_IPV4}(?![0-9A-Za-z_]|\.[0-9])"),
        hints=(".",),
        digits=True,
        locator=regex.compile(r"[0-9][0-9.]{6,}+"),
    ),
    _Rule(
        "phone",
        regex.compile(
            r"(?<![0-9A-Za-z_+.,/-])(?:"
            r"\+[1-9][0-9]{0,2}+(?:[ .-]?(?:\([0-9]{1,4}+\)|[0-9]{1,5}+)){2,7}+"
            r"|(?:1[ .-])?(?:\([0-9]{3}\)[ .-]?|[0-9]{3}[ .-])[0-9]{3}[ .-][0-9]{4}"
            r"|\(0[0-9]{1,4}+\)[ .-]?[0-9]{3,4}+(?:[ -]?[0-9]{3,5}+)?"
            r"|0[0-9]{1,4}+[ -][0-9]{3,4}+(?:[ -]?[0-9]{3,5}+)?"
            r"|0[1-9](?:[ .][0-9]{2}){4}"
            r"|1[3-9][0-9](?:[0-9]{8}|[ -][0-9]{4}[ -][0-9]{4})"
            r")(?![0-9A-Za-z_]|[.,-]?[0-9])"
        ),
        digits=True,
        locator=regex.compile(r"[0-9][0-9 ().+-]{6,}+"),
        validate=_valid_phone,
    ),
)

BUILTIN_RULES: tuple[str, ...] = tuple(dict.fromkeys(rule.name for rule in _BUILTINS))
"""The names of the built-in rules, in the order they are applied."""

_NAMED_PATTERN = regex.compile(r"([A-Za-z_][A-Za-z0-9_-]{0,63})=(.+)", regex.DOTALL)
_ASCII_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


@dataclass(frozen=True)
class _UserRules:
    rules: tuple[_Rule, ...]
    field_paths: tuple[tuple[str, ...], ...]


@functools.lru_cache(maxsize=64)
def _compile_user_rules(rules: RedactionRules, timeout: float) -> _UserRules:
    compiled: list[_Rule] = []
    for i, spec in enumerate(rules.patterns):
        named = _NAMED_PATTERN.fullmatch(spec)
        name, source = (named.group(1), named.group(2)) if named else (f"custom_{i}", spec)
        try:
            pattern = regex.compile(source)
        except (regex.error, ValueError, OverflowError) as exc:
            raise RedactionError(f"invalid redaction pattern {name!r} ({source!r}): {exc}") from exc
        compiled.append(_Rule(name, pattern, timeout=timeout))
    terms = sorted({t for t in rules.dictionaries if t}, key=len, reverse=True)
    if terms:
        alternatives = "|".join(
            ("(?<![A-Za-z0-9_])" if t[0] in _ASCII_WORD else "")
            + regex.escape(t)
            + ("(?![A-Za-z0-9_])" if t[-1] in _ASCII_WORD else "")
            for t in terms
        )
        compiled.append(_Rule("dictionary", regex.compile(alternatives, regex.IGNORECASE)))
    paths = tuple(_split_field_path(p) for p in rules.field_paths if p.strip("$. "))
    return _UserRules(tuple(compiled), paths)


def _split_field_path(path: str) -> tuple[str, ...]:
    path = path.strip()
    path = path[1:] if path.startswith("$") else path
    return tuple(part.lower() for part in path.strip(".").split(".") if part)


# --- the redactor -------------------------------------------------------------------------------


_MEMO_MAX = 256
"""Texts a :class:`RegexRedactor` remembers the result of (the latest ones)."""
_MEMO_MAX_CHARS = 8192
"""Longer texts are redacted every time, not remembered."""


class RegexRedactor:
    """The default :class:`Redactor`: built-in rules plus user ``rules``.

    ``builtin`` selects built-in rules by name (``None``: all of :data:`BUILTIN_RULES`; an
    empty sequence: none). A user pattern written ``name=regex`` (name: a letter or ``_``,
    then letters, digits, ``_`` or ``-``) reports as ``name``, any other as ``custom_<i>``.
    ``pattern_timeout`` bounds each user pattern per text. An invalid
    user pattern or unknown built-in name raises :class:`RedactionError` here; a user pattern
    that runs out of time raises :class:`RedactionError` from the redacting call.
    Thread-safe and reusable.
    """

    def __init__(
        self,
        rules: RedactionRules | None = None,
        builtin: Sequence[str] | None = None,
        *,
        pattern_timeout: float = DEFAULT_PATTERN_TIMEOUT,
    ) -> None:
        if builtin is None:
            self._builtin: tuple[_Rule, ...] = _BUILTINS
        else:
            unknown = sorted(set(builtin) - set(BUILTIN_RULES))
            if unknown:
                raise RedactionError(
                    f"unknown built-in redaction rules {unknown}; known: {list(BUILTIN_RULES)}"
                )
            self._builtin = tuple(r for r in _BUILTINS if r.name in set(builtin))
        self._timeout = pattern_timeout
        self._rules = rules or RedactionRules()
        user = _compile_user_rules(self._rules, pattern_timeout)
        self._all: tuple[_Rule, ...] = user.rules + self._builtin
        self._field_paths = user.field_paths
        # the latest texts redacted, with their results: a reply is redacted as a message
        # and as its evidence, a usage record's parameter names on every call
        self._memo: dict[str, tuple[str, tuple[str, ...]]] = {}

    @property
    def rule_names(self) -> list[str]:
        """The names of the active rules, in the order they are applied."""
        return list(dict.fromkeys(rule.name for rule in self._all))

    async def redact(self, text: str, rules: RedactionRules | None = None) -> RedactResult:
        """:meth:`redact_text`; ``rules``, when given, replace this redactor's user rules."""
        if rules is None or rules == self._rules:
            return self.redact_text(text)
        builtin = list(dict.fromkeys(rule.name for rule in self._builtin))
        other = RegexRedactor(rules, builtin, pattern_timeout=self._timeout)
        return other.redact_text(text)

    def redact_text(self, text: str) -> RedactResult:
        """Replace every match of the active rules in ``text`` with ``[REDACTED:<rule>]``.

        Every rule scans the same text; overlapping matches merge into one marker named after
        the leftmost match (then the earliest rule). A redacted text is scanned again (at
        most three passes in all) until no rule matches it. Raises :class:`RedactionError`
        when a user pattern exceeds its timeout.
        """
        held = self._memo.get(text)
        if held is not None:
            return RedactResult(held[0], list(held[1]), bool(held[1]))
        applied: dict[str, None] = {}
        current = text
        for _ in range(_MAX_PASSES):
            current, names = self._redact_once(current)
            if not names:
                break
            applied.update(dict.fromkeys(names))
        if len(text) <= _MEMO_MAX_CHARS:
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[text] = (current, tuple(applied))
        if not applied:
            return RedactResult(text, [], False)
        return RedactResult(current, list(applied), True)

    def _redact_once(self, text: str) -> tuple[str, list[str]]:
        scan = _Scan(text)
        found: list[tuple[int, int, int]] = []  # start, end, rule index
        has_digit: bool | None = None
        for index, rule in enumerate(self._all):
            if rule.hints and not any(h in text for h in rule.hints):
                continue
            if rule.digits:
                if has_digit is None:
                    has_digit = any(d in text for d in _DIGITS)
                if not has_digit:
                    continue
            found += [(start, end, index) for start, end in _spans(rule, scan)]
        if not found:
            return text, []
        found.sort(key=lambda f: (f[0], f[2]))
        merged: list[list[int]] = []
        for start, end, index in found:
            if merged and start < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end, index])
        out: list[str] = []
        pos = 0
        for start, end, index in merged:
            out += (text[pos:start], marker(self._all[index].name))
            pos = end
        out.append(text[pos:])
        names = dict.fromkeys(self._all[i].name for i in sorted({m[2] for m in merged}))
        return "".join(out), list(names)

    def redact_value(self, value: Any) -> tuple[Any, list[str]]:
        """A copy of ``value`` with every string redacted, dict keys included, walking dicts,
        lists and tuples; the value under a key matching a ``field_paths`` entry is replaced
        by ``[REDACTED:field_path]`` whatever it is. Integers whose digits a rule matches
        become the redacted string; other values are returned as they are. Returns the copy
        and the rules applied (each once).

        A field path is a dotted key path (``password``, ``auth.token``, ``$.auth.token``);
        it matches a key whose path ends with it, at any depth (list indices do not count),
        case-insensitively.
        """
        applied: list[str] = []
        result = self._walk(value, (), applied)
        return result, applied

    def _walk(self, value: Any, path: tuple[str, ...], applied: list[str]) -> Any:
        if isinstance(value, str):
            return self._text(value, applied)
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, int):
            redacted = self._text(str(value), applied)
            return value if redacted == str(value) else redacted
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                key_path = (*path, str(key).lower())
                new_key = self._text(key, applied) if isinstance(key, str) else key
                if self._is_secret_field(key_path):
                    if "field_path" not in applied:
                        applied.append("field_path")
                    out[new_key] = marker("field_path")
                else:
                    out[new_key] = self._walk(item, key_path, applied)
            return out
        if isinstance(value, list):
            return [self._walk(item, path, applied) for item in value]
        if isinstance(value, tuple):
            return tuple(self._walk(item, path, applied) for item in value)
        return value

    def _text(self, text: str, applied: list[str]) -> str:
        result = self.redact_text(text)
        for rule in result.applied_rules:
            if rule not in applied:
                applied.append(rule)
        return result.redacted_text

    def _is_secret_field(self, key_path: tuple[str, ...]) -> bool:
        return any(
            len(key_path) >= len(fp) and key_path[len(key_path) - len(fp) :] == fp
            for fp in self._field_paths
        )


class _Scan:
    """The text the rules scan: existing ``[REDACTED:…]`` markers are masked as runs of
    ``x`` (which every built-in boundary treats like the letters and digits a redacted value
    was made of), and no match may overlap them. So a redacted text, scanned again, yields
    no match its original did not have: redacting twice equals redacting once."""

    __slots__ = ("ends", "starts", "text")

    def __init__(self, text: str) -> None:
        spans = [m.span() for m in _MARKER.finditer(text)] if "[REDACTED:" in text else []
        self.starts = [start for start, _ in spans]
        self.ends = [end for _, end in spans]
        masked = text
        if spans:
            parts: list[str] = []
            pos = 0
            for start, end in spans:
                parts += (text[pos:start], "x" * (end - start))
                pos = end
            parts.append(text[pos:])
            masked = "".join(parts)
        self.text = masked

    def protected(self, start: int, end: int) -> bool:
        """Whether ``[start, end)`` overlaps an existing marker."""
        i = bisect.bisect_left(self.starts, end) - 1
        return i >= 0 and self.ends[i] > start


def _spans(rule: _Rule, scan: _Scan) -> list[tuple[int, int]]:
    """The non-empty spans of the text that ``rule`` redacts, left to right."""
    try:
        if rule.validate is None and rule.locator is None:
            return _all_spans(rule, scan)
        if rule.locator is None:
            return _validated_spans(rule, scan, 0, len(scan.text))
        spans: list[tuple[int, int]] = []
        for region in rule.locator.finditer(scan.text):
            spans += _validated_spans(rule, scan, max(region.start() - 1, 0), region.end())
        return spans
    except TimeoutError:
        raise RedactionError(
            f"redaction pattern {rule.name!r} timed out after {rule.timeout:g}s"
        ) from None


def _all_spans(rule: _Rule, scan: _Scan) -> list[tuple[int, int]]:
    deadline = None if rule.timeout is None else time.monotonic() + rule.timeout
    spans: list[tuple[int, int]] = []
    for m in rule.pattern.finditer(scan.text, timeout=rule.timeout):
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError
        start, end = m.span()
        if end > start and not scan.protected(start, end):
            spans.append((start, end))
    return spans


def _validated_spans(rule: _Rule, scan: _Scan, start: int, end: int) -> list[tuple[int, int]]:
    """Matches of a built-in rule inside ``[start, end)`` (its look-arounds see past it).

    A match the validator rejects may hide a real one that starts inside it, so the search
    resumes right after the rejected match's start; the boundary look-behinds of the
    built-in patterns make such restarts fail at once.
    """
    text = scan.text
    endpos = min(len(text), end + _LOOKAHEAD_CHARS)
    spans: list[tuple[int, int]] = []
    pos = start
    while (found := rule.pattern.search(text, pos, endpos)) is not None and found.end() <= end:
        span = rule.span(found) if rule.span is not None else found.span()
        if (
            (rule.validate is None or rule.validate(found))
            and span[1] > span[0]
            and not scan.protected(*span)
        ):
            spans.append(span)
            pos = max(found.end(), found.start() + 1)
        else:
            pos = found.start() + 1
    return spans
