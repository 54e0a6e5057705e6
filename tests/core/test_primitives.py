"""Ids, clocks, hashes and the error hierarchy."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from ce.core import errors
from ce.core.primitives import (
    Clock,
    FixedClock,
    Hasher,
    IdGenerator,
    SequentialIdGenerator,
    Sha256Hasher,
    SteppingClock,
    SystemClock,
    UuidV4Generator,
    parse_iso,
)


def test_uuid_generator_gives_distinct_v4_ids() -> None:
    gen = UuidV4Generator()
    ids = {gen.generate() for _ in range(100)}
    assert len(ids) == 100
    assert all(uuid.UUID(i).version == 4 for i in ids)
    assert all(uuid.UUID(i).variant == uuid.RFC_4122 for i in ids)
    assert all(str(uuid.UUID(i)) == i for i in ids)  # the canonical lower-case form
    assert isinstance(gen, IdGenerator)


def test_sequential_generator_is_deterministic() -> None:
    gen = SequentialIdGenerator("msg")
    assert [gen.generate() for _ in range(3)] == ["msg-000001", "msg-000002", "msg-000003"]


def test_clocks() -> None:
    assert isinstance(SystemClock(), Clock)
    assert parse_iso(SystemClock().now_iso()).utcoffset() == timedelta(0)
    fixed = FixedClock("2026-03-01T12:00:00Z")
    assert fixed.now_iso() == fixed.now_iso() == "2026-03-01T12:00:00+00:00"
    step = SteppingClock("2026-03-01T12:00:00+00:00", step=timedelta(milliseconds=5))
    first, second = step.now_iso(), step.now_iso()
    assert parse_iso(second) - parse_iso(first) == timedelta(milliseconds=5)


def test_parse_iso_treats_naive_as_utc() -> None:
    assert parse_iso("2026-01-01T00:00:00").utcoffset() == timedelta(0)


def test_sha256_hasher() -> None:
    hasher = Sha256Hasher()
    assert isinstance(hasher, Hasher)
    assert hasher.digest("abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    assert hasher.digest("日本") != hasher.digest("日本 ")


@pytest.mark.parametrize(
    "name",
    [
        "SessionNotFoundError",
        "VersionConflictError",
        "BudgetExceededError",
        "SelectorResolveError",
        "EvidenceNotFoundError",
        "SchemaValidationError",
        "MigrationError",
        "RedactionError",
        "SummarizerError",
        "StoreError",
        "TurnNotFoundError",
        "InvariantViolationError",
        "InvalidTransitionError",
        "DeltaSequenceError",
    ],
)
def test_every_error_is_a_context_engine_error(name: str) -> None:
    assert issubclass(getattr(errors, name), errors.ContextEngineError)
    assert name in errors.__all__


def test_error_messages_carry_their_facts() -> None:
    exc = errors.VersionConflictError("s1", 3, 5)
    assert (exc.expected, exc.actual) == (3, 5) and "s1" in str(exc)
    assert "s1" in str(errors.SessionNotFoundError("s1"))
    transition = errors.InvalidTransitionError("idle", "completed")
    assert "idle -> completed" in str(transition)
    assert isinstance(transition, ValueError)
