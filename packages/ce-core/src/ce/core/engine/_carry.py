"""What engine calls leave for their session's next commit: the records of a deferred
``prepare_call`` and of deferred records while they run, turn records, and the token counts a
call computed (stored with its first new record)."""

from __future__ import annotations

import json

from ce.core.engine._session import SessionEntry
from ce.core.engine._writes import WriteLog
from ce.core.schema import Message
from ce.core.stores import SessionChanges
from ce.core.tokens import StoredCounts

__all__ = ["Carry", "attach_counts"]


class Carry:
    """What engine calls of a session wrote and left for the session's next commit: turn
    records, the records of a ``prepare_call(defer_commit=True)``, and those of the
    session's deferred records while they run.

    Records carried are in ``entry``'s state already, after the ones stored up to
    ``version``: while that entry is cached at that version, the commit that takes them
    stores them in the order the entry holds them. Otherwise (the entry was read afresh, or
    absorbed another writer's records after them) the entry is read again after that
    commit."""

    __slots__ = ("announce", "changes", "entry", "turn_id", "version")

    def __init__(self) -> None:
        self.changes = SessionChanges()
        self.announce: list[tuple[str, Message]] = []  # (turn id, message) once stored
        self.entry: SessionEntry | None = None
        self.version = 0
        self.turn_id = ""
        """The turn id of the last call whose changes it took."""

    @property
    def records(self) -> bool:
        """Whether it carries records of the session document (not only turn records)."""
        return self.changes.has_records()

    def add(self, entry: SessionEntry, changes: SessionChanges, call: WriteLog) -> None:
        if changes.has_records():
            if self.records and not self.holds_order(entry):
                self.entry = None  # no entry holds them in the order they will be stored
            else:
                self.entry, self.version = entry, entry.version
            self.announce.extend((call.turn_id, m) for m in call.new_messages)
        self.changes = self.changes.merge(changes)
        self.turn_id = call.turn_id

    def holds_order(self, entry: SessionEntry) -> bool:
        """Whether ``entry`` holds the carried records last, as the next commit stores them."""
        return entry is self.entry and entry.version == self.version

    def taken_in(self, entry: SessionEntry) -> None:
        """``entry`` (just read) took the carried records in after what it read."""
        entry.take_in(self.changes)
        self.entry, self.version = entry, entry.version


def attach_counts(changes: SessionChanges, counts: StoredCounts) -> None:
    """Give ``changes`` the token counts the call computed, with its first new message (else
    its first new evidence) that has none yet (else joined to those of its first); taken
    once (a second commit of the call does not repeat them)."""
    if not counts:
        return
    ids = [
        *(m.message_id for m in changes.messages if m.message_id),
        *(e.evidence_id for e in changes.evidences),
    ]
    if not ids:
        return
    held = changes.token_counts
    free = next((i for i in ids if i not in held), None)
    stored = counts
    if free is None:  # every record carries counts of an earlier call already: join them
        free, stored = ids[0], json.loads(held[ids[0]])
        for tokenizer, by_digest in counts.items():
            stored.setdefault(tokenizer, {}).update(by_digest)
    held[free] = json.dumps(stored, separators=(",", ":"))
    counts.clear()
