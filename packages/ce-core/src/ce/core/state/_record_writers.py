"""AgentState writers for the records beside the history: evidence, tool runs, model usage."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

from ce.core.errors import InvariantViolationError
from ce.core.schema import Evidence, ModelUsage, SessionDocument, ToolCall
from ce.core.state._changes import ChangeBuffer

__all__ = ["RecordWriters"]

_R = TypeVar("_R", bound=BaseModel)


class RecordWriters:
    """Append-only, idempotent writers keyed by the framework's ids.

    Writing a record whose id is already there writes nothing and returns the stored one, so a
    hook that fires twice (or a retried call) stores it once.
    """

    _doc: SessionDocument
    _changes: ChangeBuffer
    _recorded_calls: dict[str, ToolCall]
    _used_ids: set[str]
    _live_returns: bool

    def _returned(self, record: _R) -> _R:
        """What a writer returns of a stored record: a copy, or the record itself for an
        owner that asked for live returns."""
        return record if self._live_returns else record.model_copy(deep=True)

    def add_evidence(self, evidence: Evidence) -> Evidence:
        """Append an evidence (already redacted and deduplicated by the caller); an evidence
        whose id exists is not written again and the stored one is returned."""
        stored = self._doc.evidences.get(evidence.evidence_id)
        if stored is not None:
            return self._returned(stored)
        if not evidence.evidence_id:
            raise InvariantViolationError("an evidence needs a non-empty evidence_id")
        copied = evidence.model_copy(deep=True)
        self._doc.evidences[copied.evidence_id] = copied
        self._changes.evidences.append(copied)
        return self._returned(copied)

    def record_tool_call(self, tool_call: ToolCall) -> ToolCall:
        """Append the record of one tool run with its terminal status. The first record of a
        ``tool_call_id`` wins: a later one (or the record :meth:`append_tool_results` would
        make) is not written, because a call has at most one terminal result."""
        stored = self._recorded_calls.get(tool_call.tool_call_id)
        if stored is not None:
            return self._returned(stored)
        if not tool_call.tool_call_id:
            raise InvariantViolationError("a tool call needs a non-empty tool_call_id")
        copied = tool_call.model_copy(deep=True)
        self._doc.session.tool_state.tool_calls.append(copied)
        self._recorded_calls[copied.tool_call_id] = copied
        self._changes.tool_calls.append(copied)
        return self._returned(copied)

    def record_model_usage(self, usage: ModelUsage, *, owned: bool = False) -> ModelUsage:
        """Append one model call's usage; a ``model_usage_id`` already recorded is skipped.
        ``owned``: the caller hands ``usage`` over and keeps no reference to it (stored as it
        is, not copied)."""
        if not usage.model_usage_id:
            raise InvariantViolationError("a model usage needs a non-empty model_usage_id")
        if usage.model_usage_id in self._used_ids:  # a retried record (rare): find it
            for stored in reversed(self._doc.session.model_usage):
                if stored.model_usage_id == usage.model_usage_id:
                    return self._returned(stored)
        copied = usage if owned else usage.model_copy(deep=True)
        self._doc.session.model_usage.append(copied)
        self._used_ids.add(copied.model_usage_id)
        self._changes.model_usage.append(copied)
        return self._returned(copied)
