"""Injectable primitives: ids, time and content hashes.

Everything in the SDK that needs a fresh id, the current time or a digest takes one of these,
so tests can make a run fully deterministic.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
from datetime import datetime, timedelta, timezone
from typing import Protocol, runtime_checkable

__all__ = [
    "Clock",
    "FixedClock",
    "Hasher",
    "IdGenerator",
    "SequentialIdGenerator",
    "Sha256Hasher",
    "SteppingClock",
    "SystemClock",
    "UuidV4Generator",
    "parse_iso",
]


@runtime_checkable
class IdGenerator(Protocol):
    """Produces a new unique identifier on every call."""

    def generate(self) -> str: ...


# the version (4) and variant (RFC 4122) bits of a UUID v4
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


class UuidV4Generator:
    """Random UUID v4 identifiers (the default)."""

    def generate(self) -> str:
        # what ``str(uuid.uuid4())`` gives, without building a ``UUID`` (a few ids per call)
        value = int.from_bytes(os.urandom(16), "big") & _UUID4_CLEAR | _UUID4_SET
        text = f"{value:032x}"
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


class SequentialIdGenerator:
    """Deterministic ids ``<prefix>-000001``, ``<prefix>-000002`` … for tests and replays."""

    def __init__(self, prefix: str = "id") -> None:
        self._prefix = prefix
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def generate(self) -> str:
        with self._lock:
            n = next(self._counter)
        return f"{self._prefix}-{n:06d}"


@runtime_checkable
class Clock(Protocol):
    """A source of the current time as an ISO 8601 string with a UTC offset."""

    def now_iso(self) -> str: ...


class SystemClock:
    """The wall clock, in UTC."""

    def now_iso(self) -> str:
        return datetime.now(timezone.utc).isoformat()


class FixedClock:
    """Always returns the same instant."""

    def __init__(self, at: str | datetime = "2026-01-01T00:00:00+00:00") -> None:
        self._at = at if isinstance(at, datetime) else parse_iso(at)

    def now_iso(self) -> str:
        return self._at.isoformat()


class SteppingClock:
    """Starts at ``start`` and advances by ``step`` after every reading."""

    def __init__(
        self,
        start: str | datetime = "2026-01-01T00:00:00+00:00",
        step: timedelta = timedelta(seconds=1),
    ) -> None:
        self._now = start if isinstance(start, datetime) else parse_iso(start)
        self._step = step
        self._lock = threading.Lock()

    def now_iso(self) -> str:
        with self._lock:
            current = self._now
            self._now = current + self._step
        return current.isoformat()


@runtime_checkable
class Hasher(Protocol):
    """A stable content digest used for deduplication."""

    def digest(self, content: str) -> str: ...


class Sha256Hasher:
    """Hex SHA-256 of the UTF-8 bytes."""

    def digest(self, content: str) -> str:
        return hashlib.sha256(content.encode("utf-8")).hexdigest()


def parse_iso(value: str) -> datetime:
    """Parse an ISO 8601 timestamp; a value without offset is taken as UTC."""
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed
