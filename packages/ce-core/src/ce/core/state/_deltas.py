"""Streaming deltas of one model call and their aggregation into a ModelOutput."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ce.core.errors import DeltaSequenceError
from ce.core.primitives import parse_iso
from ce.core.schema import ModelInvocation, ToolCallRequest
from ce.core.state._records import ModelOutput, TokenUsage
from ce.core.state._tool_calls import parse_tool_arguments

__all__ = ["DeltaAccumulator", "DeltaKind", "MessageDelta"]


class DeltaKind(str, Enum):
    """The kinds of streaming delta."""

    START = "start"
    TEXT = "text"
    THINKING = "thinking"
    TOOL_CALL_START = "tool_call_start"
    TOOL_CALL_ARGS = "tool_call_args"
    TOOL_CALL_END = "tool_call_end"
    USAGE = "usage"
    DONE = "done"
    ERROR = "error"


class MessageDelta(BaseModel):
    """One increment of a model stream.

    ``seq`` increases strictly within a stream; ``timestamp`` is ISO 8601 when given. The
    payload keys per kind:

    ===================  =====================================================================
    ``start``            ``provider``, ``model`` (non-empty), optional ``specification``
    ``text``             ``text``
    ``thinking``         ``text``
    ``tool_call_start``  ``tool_call_id``, ``name`` (non-empty)
    ``tool_call_args``   ``tool_call_id``, ``args`` (a fragment of the raw argument text)
    ``tool_call_end``    ``tool_call_id``
    ``usage``            ``prompt_tokens`` and/or ``completion_tokens`` (latest value wins)
    ``done``             optional ``finish_reason``
    ``error``            ``message`` (non-empty)
    ===================  =====================================================================
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    seq: int
    kind: DeltaKind
    payload: dict[str, Any] = Field(default_factory=dict)
    timestamp: str | None = None


class _Call:
    __slots__ = ("closed", "fragments", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.fragments: list[str] = []
        self.closed = False


def _text(payload: Mapping[str, Any], key: str, *, required: bool = True) -> str | None:
    value = payload.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise DeltaSequenceError(f"payload field {key!r} must be a string, got {value!r}")
    return value


def _name(payload: Mapping[str, Any], key: str) -> str:
    value = _text(payload, key)
    if not value:
        raise DeltaSequenceError(f"payload field {key!r} must be non-empty")
    return value


def _count(payload: Mapping[str, Any], key: str) -> int | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DeltaSequenceError(f"payload field {key!r} must be a non-negative integer")
    return value


class DeltaAccumulator:
    """Aggregates the deltas of ONE model stream into a :class:`ModelOutput`.

    :meth:`add` enforces the stream protocol and raises :class:`DeltaSequenceError` (leaving
    the accumulator unchanged) when a delta breaks it: ``seq`` must increase strictly and
    ``run_id`` stay the same; the stream begins with ``start`` (or fails at once with
    ``error``); it ends exactly once, with ``done`` or ``error``, and nothing may follow;
    ``tool_call_args``/``tool_call_end`` name a call that was started and not yet ended; a
    payload must have the fields of its kind (see :class:`MessageDelta`). Calls still open at
    termination are closed with the arguments received so far.
    """

    def __init__(self) -> None:
        self._run_id: str | None = None
        self._last_seq: int | None = None
        self._terminal: DeltaKind | None = None
        self._invocation: ModelInvocation | None = None
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._calls: dict[str, _Call] = {}
        self._prompt_tokens: int | None = None
        self._completion_tokens: int | None = None
        self._finish_reason: str | None = None
        self._error: str | None = None
        self._started_at: datetime | None = None
        self._first_output_at: datetime | None = None
        self._ended_at: datetime | None = None
        self._handlers: dict[DeltaKind, Callable[[Mapping[str, Any]], None]] = {
            DeltaKind.START: self._on_start,
            DeltaKind.TEXT: self._on_text,
            DeltaKind.THINKING: self._on_thinking,
            DeltaKind.TOOL_CALL_START: self._on_call_start,
            DeltaKind.TOOL_CALL_ARGS: self._on_call_args,
            DeltaKind.TOOL_CALL_END: self._on_call_end,
            DeltaKind.USAGE: self._on_usage,
            DeltaKind.DONE: self._on_done,
            DeltaKind.ERROR: self._on_error,
        }

    @property
    def terminated(self) -> bool:
        """Whether the stream has ended (with ``done`` or ``error``)."""
        return self._terminal is not None

    def add(self, delta: MessageDelta) -> None:
        """Apply one delta; raise :class:`DeltaSequenceError` if it breaks the protocol."""
        where = f"delta seq={delta.seq} kind={delta.kind.value}"
        if self._terminal is not None:
            raise DeltaSequenceError(
                f"{where}: the stream already ended with {self._terminal.value}"
            )
        if self._last_seq is not None and delta.seq <= self._last_seq:
            raise DeltaSequenceError(f"{where}: seq must exceed the previous {self._last_seq}")
        if self._run_id is not None and delta.run_id != self._run_id:
            raise DeltaSequenceError(f"{where}: run_id {delta.run_id!r} != {self._run_id!r}")
        started = self._last_seq is not None
        if not started and delta.kind not in (DeltaKind.START, DeltaKind.ERROR):
            raise DeltaSequenceError(f"{where}: a stream must begin with start")
        if started and delta.kind is DeltaKind.START:
            raise DeltaSequenceError(f"{where}: the stream has already started")
        at = self._parse_timestamp(where, delta.timestamp)
        try:
            self._handlers[delta.kind](delta.payload)
        except DeltaSequenceError as exc:
            raise DeltaSequenceError(f"{where}: {exc}") from None
        self._last_seq = delta.seq
        self._run_id = delta.run_id
        self._record_time(delta.kind, at)

    def result(self) -> ModelOutput:
        """The aggregated output; raises :class:`DeltaSequenceError` before termination.

        Tool calls come in the order they were started, ``raw_arguments`` is the verbatim
        concatenation of their fragments and ``arguments`` its parsed JSON object, or
        ``parse_error`` when it is not one.
        """
        if self._terminal is None:
            raise DeltaSequenceError("the stream has not ended yet (no done or error delta)")
        calls: list[ToolCallRequest] = []
        for call_id, call in self._calls.items():
            raw = "".join(call.fragments)
            arguments, parse_error = parse_tool_arguments(raw)
            calls.append(
                ToolCallRequest(
                    tool_call_id=call_id,
                    name=call.name,
                    raw_arguments=raw,
                    arguments=arguments,
                    parse_error=parse_error,
                )
            )
        usage = None
        if self._prompt_tokens is not None or self._completion_tokens is not None:
            usage = TokenUsage(
                prompt_tokens=self._prompt_tokens or 0,
                completion_tokens=self._completion_tokens or 0,
            )
        return ModelOutput(
            text="".join(self._text),
            thinking="".join(self._thinking),
            tool_calls=calls,
            invocation=self._invocation.model_copy() if self._invocation else None,
            usage=usage,
            finish_reason=self._finish_reason,
            error=self._error,
            latency_ms=self._millis(self._started_at, self._ended_at),
            first_token_latency_ms=self._millis(self._started_at, self._first_output_at),
        )

    @staticmethod
    def _parse_timestamp(where: str, value: str | None) -> datetime | None:
        if value is None:
            return None
        try:
            return parse_iso(value)
        except ValueError:
            raise DeltaSequenceError(f"{where}: timestamp {value!r} is not ISO 8601") from None

    def _record_time(self, kind: DeltaKind, at: datetime | None) -> None:
        if at is None:
            return
        if kind is DeltaKind.START:
            self._started_at = at
        elif kind in (DeltaKind.DONE, DeltaKind.ERROR):
            self._ended_at = at
        elif self._first_output_at is None and kind in (
            DeltaKind.TEXT,
            DeltaKind.THINKING,
            DeltaKind.TOOL_CALL_START,
        ):
            self._first_output_at = at

    @staticmethod
    def _millis(start: datetime | None, end: datetime | None) -> int | None:
        if start is None or end is None or end < start:
            return None
        return int((end - start).total_seconds() * 1000)

    def _open_call(self, payload: Mapping[str, Any]) -> _Call:
        call_id = _name(payload, "tool_call_id")
        call = self._calls.get(call_id)
        if call is None:
            raise DeltaSequenceError(f"tool call {call_id!r} was never started")
        if call.closed:
            raise DeltaSequenceError(f"tool call {call_id!r} has already ended")
        return call

    def _on_start(self, payload: Mapping[str, Any]) -> None:
        self._invocation = ModelInvocation(
            provider=_name(payload, "provider"),
            model=_name(payload, "model"),
            specification=_text(payload, "specification", required=False) or "",
        )

    def _on_text(self, payload: Mapping[str, Any]) -> None:
        self._text.append(_text(payload, "text") or "")

    def _on_thinking(self, payload: Mapping[str, Any]) -> None:
        self._thinking.append(_text(payload, "text") or "")

    def _on_call_start(self, payload: Mapping[str, Any]) -> None:
        call_id = _name(payload, "tool_call_id")
        name = _name(payload, "name")
        if call_id in self._calls:
            raise DeltaSequenceError(f"tool call {call_id!r} was already started")
        self._calls[call_id] = _Call(name)

    def _on_call_args(self, payload: Mapping[str, Any]) -> None:
        call = self._open_call(payload)
        call.fragments.append(_text(payload, "args") or "")

    def _on_call_end(self, payload: Mapping[str, Any]) -> None:
        self._open_call(payload).closed = True

    def _on_usage(self, payload: Mapping[str, Any]) -> None:
        prompt = _count(payload, "prompt_tokens")
        completion = _count(payload, "completion_tokens")
        if prompt is None and completion is None:
            raise DeltaSequenceError("a usage delta needs prompt_tokens or completion_tokens")
        if prompt is not None:
            self._prompt_tokens = prompt
        if completion is not None:
            self._completion_tokens = completion

    def _on_done(self, payload: Mapping[str, Any]) -> None:
        self._finish_reason = _text(payload, "finish_reason", required=False)
        self._terminal = DeltaKind.DONE

    def _on_error(self, payload: Mapping[str, Any]) -> None:
        self._error = _name(payload, "message")
        self._terminal = DeltaKind.ERROR
