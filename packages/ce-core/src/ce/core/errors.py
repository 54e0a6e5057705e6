"""The typed errors of Context Engine.

Every error the SDK raises on purpose derives from :class:`ContextEngineError`, so an
application can catch the whole family with one ``except``. Errors that mean "the caller
passed something invalid" also derive from :class:`ValueError`.
"""

from __future__ import annotations

__all__ = [
    "BudgetExceededError",
    "ContextEngineError",
    "DeltaSequenceError",
    "EvidenceNotFoundError",
    "InvalidTransitionError",
    "InvariantViolationError",
    "MigrationError",
    "RedactionError",
    "SchemaValidationError",
    "SelectorResolveError",
    "SessionNotFoundError",
    "StoreError",
    "SummarizerError",
    "TurnNotFoundError",
    "VersionConflictError",
]


class ContextEngineError(Exception):
    """Base class of every error raised by the SDK."""


class SessionNotFoundError(ContextEngineError, LookupError):
    """The session does not exist in the store."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found")
        self.session_id = session_id


class TurnNotFoundError(ContextEngineError, LookupError):
    """The session has no turn record with that id."""

    def __init__(self, session_id: str, turn_id: str) -> None:
        super().__init__(f"session {session_id!r} has no turn {turn_id!r}")
        self.session_id = session_id
        self.turn_id = turn_id


class VersionConflictError(ContextEngineError):
    """An optimistic write saw another version than the one it expected."""

    def __init__(self, session_id: str, expected: int | None, actual: int) -> None:
        super().__init__(f"session {session_id!r}: expected version {expected}, store has {actual}")
        self.session_id = session_id
        self.expected = expected
        self.actual = actual


class BudgetExceededError(ContextEngineError):
    """The ``must`` blocks alone do not fit into the token budget."""


class SelectorResolveError(ContextEngineError, ValueError):
    """A ref selector is malformed or does not match its target content."""


class EvidenceNotFoundError(ContextEngineError, LookupError):
    """A referenced evidence id does not exist in the session."""


class SchemaValidationError(ContextEngineError, ValueError):
    """Data does not satisfy the session schema.

    ``errors`` lists ``(field_path, message)`` pairs; the path is dotted with list indices,
    for example ``session.messages.3.role``.
    """

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        lines = "; ".join(f"{path or '<root>'}: {msg}" for path, msg in errors)
        super().__init__(f"invalid document: {lines}")


class MigrationError(ContextEngineError):
    """A document cannot be migrated to the current schema version."""


class RedactionError(ContextEngineError):
    """Redaction failed."""


class SummarizerError(ContextEngineError):
    """Summary generation failed (adapter error or timeout)."""


class StoreError(ContextEngineError):
    """A store could not complete an operation (unreachable, corrupt, misconfigured)."""


class InvariantViolationError(ContextEngineError, ValueError):
    """A write would break an invariant of the session history (DESIGN.md §4)."""


class InvalidTransitionError(InvariantViolationError):
    """A run-status transition that the run state machine does not allow."""

    def __init__(self, current: str, target: str) -> None:
        super().__init__(f"illegal run status transition {current} -> {target}")
        self.current = current
        self.target = target


class DeltaSequenceError(InvariantViolationError):
    """A streaming delta arrived out of order, after termination, or malformed."""
