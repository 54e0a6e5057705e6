"""Streaming deltas (seed 002): the accumulator's protocol checks and the aggregated output."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ce.core.errors import DeltaSequenceError
from ce.core.primitives import FixedClock
from ce.core.schema import ModelInvocation, Role
from ce.core.state import (
    AgentState,
    DeltaAccumulator,
    DeltaKind,
    MessageDelta,
    TokenUsage,
    parse_tool_arguments,
)

START = {"provider": "openai", "model": "gpt-4o"}


class Stream:
    """Feeds deltas with increasing seq and timestamps one second apart."""

    def __init__(self, run_id: str = "run-1") -> None:
        self.acc = DeltaAccumulator()
        self.run_id = run_id
        self.seq = 0

    def delta(self, kind: str, **payload: Any) -> MessageDelta:
        self.seq += 1
        return MessageDelta(
            run_id=self.run_id,
            seq=self.seq,
            kind=DeltaKind(kind),
            payload=payload,
            timestamp=f"2026-01-01T00:00:{self.seq:02d}+00:00",
        )

    def add(self, kind: str, **payload: Any) -> Stream:
        self.acc.add(self.delta(kind, **payload))
        return self

    def started(self) -> Stream:
        return self.add("start", **START)


def test_a_full_stream_aggregates_text_thinking_calls_and_usage() -> None:
    s = Stream().add("start", provider="anthropic", model="claude", specification="messages")
    s.add("thinking", text="Let me ").add("thinking", text="think.")
    s.add("text", text="Looking ").add("text", text="it up.")
    s.add("tool_call_start", tool_call_id="b", name="search")
    s.add("tool_call_start", tool_call_id="a", name="fetch")
    s.add("tool_call_args", tool_call_id="b", args='{"q": ')
    s.add("tool_call_args", tool_call_id="a", args='{"url": "http://x"}')
    s.add("tool_call_args", tool_call_id="b", args='"paris"}')
    s.add("tool_call_end", tool_call_id="b").add("tool_call_end", tool_call_id="a")
    s.add("usage", prompt_tokens=10).add("usage", prompt_tokens=12, completion_tokens=7)
    s.add("done", finish_reason="tool_use")
    assert s.acc.terminated

    out = s.acc.result()
    assert out.text == "Looking it up."
    assert out.thinking == "Let me think."
    assert out.invocation == ModelInvocation(
        provider="anthropic", model="claude", specification="messages"
    )
    assert [(c.tool_call_id, c.name) for c in out.tool_calls] == [("b", "search"), ("a", "fetch")]
    assert out.tool_calls[0].raw_arguments == '{"q": "paris"}'
    assert out.tool_calls[0].arguments == {"q": "paris"}
    assert out.tool_calls[1].arguments == {"url": "http://x"}
    assert out.usage == TokenUsage(prompt_tokens=12, completion_tokens=7)
    assert (out.finish_reason, out.error) == ("tool_use", None)
    assert (out.latency_ms, out.first_token_latency_ms) == (14_000, 1_000)


def test_the_result_is_accepted_by_append_model_output() -> None:
    s = Stream().started().add("text", text="hi")
    s.add("tool_call_start", tool_call_id="c1", name="f").add("done")
    state = AgentState("s", clock=FixedClock())
    message = state.append_model_output(s.acc.result())
    assert message.role is Role.ASSISTANT
    assert message.invocation == ModelInvocation(**START)
    assert [c.tool_call_id for c in state.pending_tool_calls] == ["c1"]


def test_seq_must_increase_strictly() -> None:
    s = Stream().started()
    for seq in (s.seq, s.seq - 1):
        with pytest.raises(DeltaSequenceError, match="seq"):
            s.acc.add(
                MessageDelta(run_id="run-1", seq=seq, kind=DeltaKind.TEXT, payload={"text": "x"})
            )
    s.acc.add(
        MessageDelta(run_id="run-1", seq=s.seq + 10, kind=DeltaKind.TEXT, payload={"text": "ok"})
    )
    s.acc.add(MessageDelta(run_id="run-1", seq=s.seq + 11, kind=DeltaKind.DONE))
    assert s.acc.result().text == "ok"


def test_run_id_must_not_change_within_a_stream() -> None:
    s = Stream().started()
    s.run_id = "other"
    with pytest.raises(DeltaSequenceError, match="run_id"):
        s.add("text", text="x")


def test_a_stream_must_begin_with_start() -> None:
    with pytest.raises(DeltaSequenceError, match="begin with start"):
        Stream().add("text", text="x")


def test_start_may_come_only_once() -> None:
    with pytest.raises(DeltaSequenceError, match="already started"):
        Stream().started().started()


def test_a_stream_may_fail_before_it_starts() -> None:
    out = Stream().add("error", message="connection refused").acc.result()
    assert (out.error, out.invocation, out.text) == ("connection refused", None, "")


@pytest.mark.parametrize("terminal", [("done", {}), ("error", {"message": "boom"})])
@pytest.mark.parametrize(
    "after",
    [
        ("text", {"text": "late"}),
        ("done", {}),
        ("error", {"message": "again"}),
        ("usage", {"prompt_tokens": 1}),
        ("start", START),
    ],
)
def test_nothing_may_follow_termination(
    terminal: tuple[str, dict[str, Any]], after: tuple[str, dict[str, Any]]
) -> None:
    s = Stream().started().add("text", text="hi").add(terminal[0], **terminal[1])
    with pytest.raises(DeltaSequenceError, match="already ended"):
        s.add(after[0], **after[1])
    assert s.acc.result().text == "hi"


def test_result_requires_termination() -> None:
    s = Stream().started().add("text", text="partial")
    with pytest.raises(DeltaSequenceError, match="not ended"):
        s.acc.result()
    with pytest.raises(DeltaSequenceError):
        DeltaAccumulator().result()


def test_args_only_for_a_started_call() -> None:
    s = Stream().started()
    with pytest.raises(DeltaSequenceError, match="never started"):
        s.add("tool_call_args", tool_call_id="c1", args="{}")
    with pytest.raises(DeltaSequenceError, match="never started"):
        s.add("tool_call_end", tool_call_id="c1")


def test_args_after_the_call_ended_are_rejected() -> None:
    s = Stream().started().add("tool_call_start", tool_call_id="c1", name="f")
    s.add("tool_call_end", tool_call_id="c1")
    with pytest.raises(DeltaSequenceError, match="already ended"):
        s.add("tool_call_args", tool_call_id="c1", args="{}")
    with pytest.raises(DeltaSequenceError, match="already ended"):
        s.add("tool_call_end", tool_call_id="c1")


def test_a_call_id_may_start_only_once() -> None:
    s = Stream().started().add("tool_call_start", tool_call_id="c1", name="f")
    with pytest.raises(DeltaSequenceError, match="already started"):
        s.add("tool_call_start", tool_call_id="c1", name="g")


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        ("start", {"provider": "openai"}),
        ("start", {"provider": "", "model": "m"}),
        ("text", {}),
        ("text", {"text": 3}),
        ("thinking", {"text": None}),
        ("tool_call_start", {"tool_call_id": "c9"}),
        ("tool_call_start", {"tool_call_id": "", "name": "f"}),
        ("tool_call_args", {"tool_call_id": "c1", "args": {"x": 1}}),
        ("usage", {}),
        ("usage", {"prompt_tokens": -1}),
        ("usage", {"completion_tokens": True}),
        ("usage", {"prompt_tokens": "3"}),
        ("done", {"finish_reason": 1}),
        ("error", {}),
        ("error", {"message": ""}),
    ],
)
def test_malformed_payloads_are_rejected_and_change_nothing(
    kind: str, payload: dict[str, Any]
) -> None:
    s = Stream()
    if kind != "start":
        s.started().add("tool_call_start", tool_call_id="c1", name="f")
    bad = s.delta(kind, **payload)
    with pytest.raises(DeltaSequenceError):
        s.acc.add(bad)
    assert not s.acc.terminated
    # The rejected delta left no trace: even its seq is still free.
    retry = ("start", START) if kind == "start" else ("text", {"text": "ok"})
    s.acc.add(bad.model_copy(update={"kind": DeltaKind(retry[0]), "payload": retry[1]}))
    out = s.add("done").acc.result()
    assert out.invocation == ModelInvocation(**START)
    assert out.error is None
    assert all(call.raw_arguments == "" for call in out.tool_calls)


def test_a_bad_timestamp_is_rejected() -> None:
    s = Stream().started()
    with pytest.raises(DeltaSequenceError, match="ISO 8601"):
        s.acc.add(
            MessageDelta(
                run_id="run-1", seq=99, kind=DeltaKind.TEXT, payload={"text": "x"}, timestamp="x"
            )
        )


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ("{bad", "invalid JSON"),
        ("[1, 2]", "got array"),
        ("42", "got number"),
        ('"s"', "got string"),
    ],
)
def test_bad_arguments_give_a_parse_error_not_an_exception(raw: str, kind: str) -> None:
    s = Stream().started().add("tool_call_start", tool_call_id="c1", name="f")
    s.add("tool_call_args", tool_call_id="c1", args=raw).add("done")
    [result] = s.acc.result().tool_calls
    assert result.raw_arguments == raw
    assert result.arguments is None
    assert result.parse_error is not None and kind in result.parse_error


def test_raw_arguments_are_kept_verbatim() -> None:
    raw = '  {"a" :  1 ,\n "b": "ü"}  '
    s = Stream().started().add("tool_call_start", tool_call_id="c1", name="f")
    for char in raw:
        s.add("tool_call_args", tool_call_id="c1", args=char)
    [result] = s.add("done").acc.result().tool_calls
    assert result.raw_arguments == raw
    assert result.arguments == {"a": 1, "b": "ü"}


def test_a_call_without_arguments_parses_to_an_empty_object() -> None:
    s = Stream().started().add("tool_call_start", tool_call_id="c1", name="now").add("done")
    [result] = s.acc.result().tool_calls
    assert (result.raw_arguments, result.arguments, result.parse_error) == ("", {}, None)


def test_error_termination_keeps_what_arrived_and_closes_open_calls() -> None:
    s = Stream().started().add("text", text="Partial ans")
    s.add("tool_call_start", tool_call_id="c1", name="f")
    s.add("tool_call_args", tool_call_id="c1", args='{"x": ')
    s.add("error", message="stream reset")
    out = s.acc.result()
    assert (out.text, out.error, out.finish_reason) == ("Partial ans", "stream reset", None)
    [result] = out.tool_calls
    assert result.raw_arguments == '{"x": '
    assert result.parse_error is not None


def test_calls_still_open_at_done_are_closed() -> None:
    s = Stream().started().add("tool_call_start", tool_call_id="c1", name="f")
    s.add("tool_call_args", tool_call_id="c1", args='{"x": 1}').add("done", finish_reason="stop")
    [result] = s.acc.result().tool_calls
    assert result.arguments == {"x": 1}


def test_result_is_stable_once_terminated() -> None:
    s = Stream().started().add("text", text="a").add("done")
    assert s.acc.result() == s.acc.result()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", ({}, None)),
        (" \n", ({}, None)),
        ('{"a": [1, {"b": null}]}', ({"a": [1, {"b": None}]}, None)),
    ],
)
def test_parse_tool_arguments_accepts_objects(raw: str, expected: Any) -> None:
    assert parse_tool_arguments(raw) == expected


@pytest.mark.parametrize("raw", ["{", "null", "true", "[]", '{"x": NaN}', "Infinity", "{}{}"])
def test_parse_tool_arguments_reports_everything_else(raw: str) -> None:
    arguments, error = parse_tool_arguments(raw)
    assert arguments is None
    assert error


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(
    arguments=st.dictionaries(st.text(max_size=6), json_values, max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_arguments_assemble_across_any_fragmentation(
    arguments: dict[str, Any], cuts: list[int]
) -> None:
    raw = json.dumps(arguments, ensure_ascii=False)
    bounds = sorted({0, len(raw), *(c for c in cuts if c < len(raw))})
    s = Stream().started().add("tool_call_start", tool_call_id="c", name="f")
    for lo, hi in itertools.pairwise(bounds):
        s.add("tool_call_args", tool_call_id="c", args=raw[lo:hi])
    [result] = s.add("tool_call_end", tool_call_id="c").add("done").acc.result().tool_calls
    assert result.raw_arguments == raw
    assert result.arguments == arguments
    assert result.parse_error is None
