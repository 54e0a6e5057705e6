"""AgentState: the only write path into a session document, and its invariants (DESIGN §4)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from ce.core.errors import InvalidTransitionError, InvariantViolationError
from ce.core.primitives import FixedClock, SequentialIdGenerator, SteppingClock
from ce.core.schema import (
    Author,
    AuthorKind,
    BlockType,
    Evidence,
    EvidenceSource,
    EvidenceType,
    LevelOfDetail,
    LodSections,
    ModelInvocation,
    ModelUsage,
    ModelUsageStage,
    ModelUsageStatus,
    Priority,
    ProviderKind,
    Ref,
    Role,
    RunStatus,
    Section,
    SourceKind,
    Task,
    TaskStatus,
    ToolCall,
    ToolCallRequest,
    ToolCallStatus,
    ToolProvider,
    document_from_json,
    document_to_json,
    dump_document,
    load_document,
)
from ce.core.state import (
    MAX_META_VALUE_BYTES,
    NOTEBOOK_BLOCK_ID,
    RUN_TRANSITIONS,
    AgentState,
    ModelOutput,
    TokenUsage,
    ToolResult,
    can_transition,
    validate_meta,
)

T0 = "2026-01-01T00:00:00+00:00"
INVOCATION = ModelInvocation(provider="openai", model="gpt-4o")


def ts(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}+00:00"


def new_state(session_id: str = "s-1") -> AgentState:
    return AgentState(session_id, clock=SteppingClock(T0), id_generator=SequentialIdGenerator("m"))


def call(call_id: str, name: str = "search", raw: str = '{"q": "x"}') -> ToolCallRequest:
    return ToolCallRequest(tool_call_id=call_id, name=name, raw_arguments=raw)


def output(text: str = "", *calls: ToolCallRequest, **kwargs: Any) -> ModelOutput:
    kwargs.setdefault("invocation", INVOCATION)
    return ModelOutput(text=text, tool_calls=list(calls), **kwargs)


def with_calls(*call_ids: str) -> AgentState:
    state = new_state()
    state.append_model_input("question")
    state.append_model_output(output("", *(call(i) for i in call_ids)))
    return state


# --------------------------------------------------------------------------- construction


def test_new_state_is_empty_and_idle() -> None:
    state = new_state()
    assert state.session_id == "s-1"
    assert state.messages == ()
    assert state.status is RunStatus.IDLE
    assert state.system_instruction is None
    assert state.pending_tool_calls == []
    assert state.notebook == ""
    assert state.tasks == []
    assert state.summary is None
    assert state.take_changes().is_empty()


def test_session_id_must_not_be_empty() -> None:
    with pytest.raises(InvariantViolationError):
        AgentState("")


# --------------------------------------------------------------------------- model input


def test_model_input_is_a_user_message_with_clock_time_and_generated_id() -> None:
    state = new_state()
    message = state.append_model_input(
        "hello",
        author=Author(kind=AuthorKind.USER, id="alice"),
        refs=[Ref(evidence_id="ev-1")],
        meta={"channel": "web"},
    )
    assert message.role is Role.USER
    assert message.content == "hello"
    assert message.at == T0
    assert message.message_id == "m-000001"
    assert message.author == Author(kind=AuthorKind.USER, id="alice")
    assert message.refs == [Ref(evidence_id="ev-1")]
    assert message.meta == {"channel": "web"}
    assert state.messages == (message,)


def test_model_input_keeps_a_given_message_id() -> None:
    state = new_state()
    assert state.append_model_input("hi", message_id="given").message_id == "given"
    with pytest.raises(InvariantViolationError, match="already used"):
        state.append_model_input("again", message_id="given")
    with pytest.raises(InvariantViolationError):
        state.append_model_input("empty id", message_id="")


@pytest.mark.parametrize("content", ["", " ", "\n\t  ", [], [Section(body="  ")]])
def test_blank_model_input_is_rejected(content: Any) -> None:
    state = new_state()
    with pytest.raises(InvariantViolationError):
        state.append_model_input(content)
    assert state.messages == ()
    assert state.take_changes().is_empty()


def test_model_input_sections_become_content_and_live_level() -> None:
    state = new_state()
    sections = [Section(title="Question", body="weather?"), Section(body="in Paris")]
    message = state.append_model_input(sections)
    assert message.content == "Question\nweather?\n\nin Paris"
    assert message.lod == LodSections(live=sections)


def test_model_input_lod_keeps_cheaper_levels_and_defaults_live() -> None:
    state = new_state()
    lod = LodSections(summary=[Section(body="short")], gist=[Section(body="g")])
    message = state.append_model_input("the full text", lod=lod)
    assert message.lod is not None
    assert message.lod.live == [Section(body="the full text")]
    assert message.text_at(LevelOfDetail.LIVE) == "the full text"
    assert message.text_at(LevelOfDetail.SUMMARY) == "short"
    assert message.text_at(LevelOfDetail.GIST) == "g"


def test_caller_objects_are_copied_on_write() -> None:
    state = new_state()
    meta: dict[str, Any] = {"tags": ["a"]}
    sections = [Section(body="text")]
    state.append_model_input(sections, meta=meta)
    meta["tags"].append("b")
    sections[0].body = "changed"
    stored = state.messages[0]
    assert stored.meta == {"tags": ["a"]}
    assert stored.content == "text"
    assert stored.lod is not None and stored.lod.live == [Section(body="text")]


# --------------------------------------------------------------------------- timestamps


def test_timestamps_come_from_the_injected_clock() -> None:
    state = new_state()
    state.set_system_instruction("Be brief.")
    state.append_model_input("q")
    state.append_model_output(output("calling", call("c1"), call("c2")))
    state.append_tool_results([ToolResult(tool_call_id="c2", content="r2")])
    state.append_tool_results([ToolResult(tool_call_id="c1", content="r1")])
    assert [m.at for m in state.messages] == [ts(i) for i in range(5)]
    records = state.document.session.tool_state.tool_calls
    assert [(r.tool_call_id, r.called_at) for r in records] == [("c2", ts(3)), ("c1", ts(4))]


def test_fixed_clock_stamps_every_write_with_its_instant() -> None:
    instant = "2030-05-06T07:08:09+00:00"
    state = AgentState("s", clock=FixedClock(instant))
    state.append_model_input("a")
    state.append_model_input("b")
    assert {m.at for m in state.messages} == {instant}


def test_a_rejected_write_reads_neither_clock_nor_id_generator() -> None:
    state = new_state()
    with pytest.raises(InvariantViolationError):
        state.append_model_input("   ")
    with pytest.raises(InvariantViolationError):
        state.append_model_output(output(""))
    message = state.append_model_input("ok")
    assert (message.at, message.message_id) == (T0, "m-000001")


# --------------------------------------------------------------------------- model output


def test_model_output_is_an_assistant_message_with_invocation() -> None:
    state = new_state()
    message = state.append_model_output(
        output("answer", invocation=ModelInvocation(provider="anthropic", model="claude"))
    )
    assert message.role is Role.ASSISTANT
    assert message.content == "answer"
    assert message.tool_calls is None
    assert message.invocation == ModelInvocation(provider="anthropic", model="claude")


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_model_output_without_text_or_tool_calls_is_rejected(text: str) -> None:
    state = new_state()
    with pytest.raises(InvariantViolationError, match="text or tool calls"):
        state.append_model_output(output(text))
    assert state.messages == ()


@pytest.mark.parametrize(
    "invocation",
    [
        None,
        ModelInvocation(provider="", model="gpt-4o"),
        ModelInvocation(provider="openai", model=""),
        ModelInvocation(provider=" ", model=" "),
    ],
)
def test_model_output_without_invocation_is_rejected(invocation: ModelInvocation | None) -> None:
    state = new_state()
    with pytest.raises(InvariantViolationError, match="invocation"):
        state.append_model_output(ModelOutput(text="hi", invocation=invocation))
    assert state.messages == ()


def test_tool_call_ids_must_be_unique_in_the_output() -> None:
    state = new_state()
    with pytest.raises(InvariantViolationError, match="already used"):
        state.append_model_output(output("", call("c1"), call("c1")))
    assert state.messages == ()


def test_tool_call_ids_must_not_be_reused_in_the_session() -> None:
    state = with_calls("c1")
    state.append_tool_results([ToolResult(tool_call_id="c1", content="done")])
    with pytest.raises(InvariantViolationError, match="already used"):
        state.append_model_output(output("", call("c1")))


@pytest.mark.parametrize(
    "bad",
    [
        ToolCallRequest(tool_call_id="", name="search"),
        ToolCallRequest(tool_call_id="c1", name=" "),
        ToolCallRequest(tool_call_id="c1", name="s", arguments={}, parse_error="both"),
        ToolCallRequest(tool_call_id="c1", name="s", arguments={"x": float("nan")}),
    ],
)
def test_malformed_tool_calls_are_rejected(bad: ToolCallRequest) -> None:
    state = new_state()
    with pytest.raises(InvariantViolationError):
        state.append_model_output(output("", bad))
    assert state.messages == ()


def test_tool_call_arguments_are_parsed_or_serialized_when_missing() -> None:
    state = new_state()
    message = state.append_model_output(
        output(
            "",
            ToolCallRequest(tool_call_id="a", name="f", raw_arguments='{"x": 1}'),
            ToolCallRequest(tool_call_id="b", name="f", arguments={"y": (1, 2)}),
            ToolCallRequest(tool_call_id="c", name="f", raw_arguments="[1]"),
            ToolCallRequest(tool_call_id="d", name="f"),
        )
    )
    a, b, c, d = message.tool_calls or []
    assert (a.arguments, a.parse_error) == ({"x": 1}, None)
    assert (b.raw_arguments, b.arguments) == ('{"y":[1,2]}', {"y": [1, 2]})
    assert c.arguments is None and c.parse_error == "arguments must be a JSON object, got array"
    assert (d.raw_arguments, d.arguments) == ("", {})


def test_finish_reason_goes_into_message_metadata_and_thinking_is_not_persisted() -> None:
    state = new_state()
    message = state.append_model_output(
        output("hi", finish_reason="stop", thinking="secret reasoning", meta={"k": 1})
    )
    assert message.meta == {"k": 1, "finish_reason": "stop"}
    assert "secret reasoning" not in document_to_json(state.document)


def test_usage_is_recorded_as_a_model_usage_record() -> None:
    state = new_state()
    state.append_model_output(
        output(
            "",
            call("c1"),
            usage=TokenUsage(prompt_tokens=12, completion_tokens=3),
            latency_ms=250,
            first_token_latency_ms=40,
        )
    )
    state.append_model_output(output("partial", usage=TokenUsage(prompt_tokens=5), error="boom"))
    first, second = state.document.session.model_usage
    assert (first.provider, first.model) == ("openai", "gpt-4o")
    assert (first.prompt_tokens, first.completion_tokens, first.total_tokens) == (12, 3, 15)
    assert (first.latency_ms, first.first_token_latency_ms) == (250, 40)
    assert (first.stage, first.status) == (ModelUsageStage.TOOL_CALL, ModelUsageStatus.SUCCESS)
    assert (second.stage, second.status, second.error) == (
        ModelUsageStage.ANSWER,
        ModelUsageStatus.ERROR,
        "boom",
    )
    state.append_model_output(output("no usage"))
    assert len(state.document.session.model_usage) == 2


# --------------------------------------------------------------------------- tool results


def test_tool_results_append_messages_and_tool_call_records() -> None:
    state = new_state()
    state.append_model_input("q")
    state.append_model_output(
        output("", call("c1", "search", '{"q": "paris"}'), call("c2", "fetch", "{bad"))
    )
    messages = state.append_tool_results(
        [
            ToolResult(
                tool_call_id="c1",
                content="18C",
                duration_ms=37,
                provider=ToolProvider(kind=ProviderKind.MCP, name="weather"),
                result_evidence_ids=["ev-1"],
                task_id="t1",
            ),
            ToolResult(tool_call_id="c2", status=ToolCallStatus.TIMEOUT, error="timed out"),
        ]
    )
    assert [(m.role, m.tool_call_id, m.name, m.content) for m in messages] == [
        (Role.TOOL, "c1", "search", "18C"),
        (Role.TOOL, "c2", "fetch", "timed out"),
    ]
    first, second = state.document.session.tool_state.tool_calls
    assert first.tool == "search"
    assert first.provider == ToolProvider(kind=ProviderKind.MCP, name="weather")
    assert (first.status, first.duration_ms, first.args_digest) == (
        ToolCallStatus.SUCCESS,
        37,
        {"q": "paris"},
    )
    assert (first.result_evidence_ids, first.task_id) == (["ev-1"], "t1")
    assert second.provider.kind is ProviderKind.OTHER
    assert second.status is ToolCallStatus.TIMEOUT
    assert second.args_digest["raw_bytes"] == 4
    assert second.args_digest["parse_error"].startswith("invalid JSON")
    assert state.pending_tool_calls == []


def test_large_argument_values_are_hashed_in_the_digest() -> None:
    state = new_state()
    big = "x" * 1000
    state.append_model_output(output("", call("c1", raw=json.dumps({"small": 1, "big": big}))))
    state.append_tool_results([ToolResult(tool_call_id="c1", content="ok")])
    digest = state.document.session.tool_state.tool_calls[0].args_digest
    assert digest["small"] == 1
    assert digest["big"].startswith("<1002 bytes, sha256:")


def test_pending_tool_calls_are_declared_calls_without_result_in_order() -> None:
    state = with_calls("c1", "c2")
    state.append_model_output(output("more", call("c3")))
    assert [c.tool_call_id for c in state.pending_tool_calls] == ["c1", "c2", "c3"]
    state.append_tool_results([ToolResult(tool_call_id="c2", content="r")])
    assert [c.tool_call_id for c in state.pending_tool_calls] == ["c1", "c3"]


def test_tool_result_for_an_unknown_call_is_rejected() -> None:
    state = with_calls("c1")
    with pytest.raises(InvariantViolationError, match="no tool call 'nope'"):
        state.append_tool_results([ToolResult(tool_call_id="nope", content="x")])


def test_tool_result_for_an_answered_call_is_rejected() -> None:
    state = with_calls("c1")
    state.append_tool_results([ToolResult(tool_call_id="c1", content="first")])
    for status in ToolCallStatus:
        with pytest.raises(InvariantViolationError, match="already has its result"):
            state.append_tool_results([ToolResult(tool_call_id="c1", status=status)])
    assert len(state.document.session.tool_state.tool_calls) == 1


def test_two_results_for_one_call_in_a_batch_are_rejected() -> None:
    state = with_calls("c1")
    with pytest.raises(InvariantViolationError, match="already has its result"):
        state.append_tool_results(
            [ToolResult(tool_call_id="c1", content="a"), ToolResult(tool_call_id="c1")]
        )
    assert [c.tool_call_id for c in state.pending_tool_calls] == ["c1"]


def test_tool_result_name_must_match_the_declared_call() -> None:
    state = with_calls("c1")
    with pytest.raises(InvariantViolationError, match="declared as 'search'"):
        state.append_tool_results([ToolResult(tool_call_id="c1", name="other", content="x")])
    [message] = state.append_tool_results([ToolResult(tool_call_id="c1", name="search")])
    assert message.name == "search"


def test_an_empty_batch_of_tool_results_is_rejected() -> None:
    with pytest.raises(InvariantViolationError):
        with_calls("c1").append_tool_results([])


def test_a_batch_with_one_bad_result_writes_nothing() -> None:
    state = with_calls("c1", "c2")
    before = state.document
    state.take_changes()
    with pytest.raises(InvariantViolationError):
        state.append_tool_results(
            [
                ToolResult(tool_call_id="c1", content="ok"),
                ToolResult(tool_call_id="c2", content="bad meta", meta={"BadKey": 1}),
            ]
        )
    assert state.document == before
    assert state.take_changes().is_empty()
    assert [c.tool_call_id for c in state.pending_tool_calls] == ["c1", "c2"]


def test_tool_result_sections_and_lod_are_kept() -> None:
    state = with_calls("c1")
    [message] = state.append_tool_results(
        [
            ToolResult(
                tool_call_id="c1",
                content=[Section(title="Result", body="long text")],
                lod=LodSections(gist=[Section(body="ok")]),
            )
        ]
    )
    assert message.content == "Result\nlong text"
    assert message.text_at(LevelOfDetail.GIST) == "ok"
    assert message.text_at(LevelOfDetail.SUMMARY) == "Result\nlong text"


# --------------------------------------------------------------------------- metadata


@pytest.mark.parametrize(
    "key", ["Bad", "camelCase", "1abc", "_private", "with-dash", "a b", "key\n", "", "ключ"]
)
def test_metadata_keys_must_be_snake_case(key: str) -> None:
    with pytest.raises(InvariantViolationError, match="snake_case"):
        validate_meta({key: 1})


@pytest.mark.parametrize("key", ["a", "snake_case", "k2", "x_1_y"])
def test_snake_case_metadata_keys_are_accepted(key: str) -> None:
    assert validate_meta({key: 1}) == {key: 1}


def test_metadata_values_are_limited_to_2048_bytes_of_json() -> None:
    fits = "x" * (MAX_META_VALUE_BYTES - 2)  # the quotes make it 2048 bytes
    assert validate_meta({"v": fits}) == {"v": fits}
    with pytest.raises(InvariantViolationError, match="2049 bytes"):
        validate_meta({"v": fits + "x"})
    with pytest.raises(InvariantViolationError):
        validate_meta({"v": "é" * 1024})  # 2048 UTF-8 bytes plus the quotes


@pytest.mark.parametrize("value", [object(), {1, 2}, float("nan"), float("inf")])
def test_metadata_values_must_be_json(value: Any) -> None:
    with pytest.raises(InvariantViolationError):
        validate_meta({"v": value})


def test_metadata_is_normalized_to_json_values() -> None:
    assert validate_meta({"t": (1, 2), "d": {"k": None}}) == {"t": [1, 2], "d": {"k": None}}


def _write_input(state: AgentState, meta: dict[str, Any]) -> None:
    state.append_model_input("q", meta=meta)


def _write_output(state: AgentState, meta: dict[str, Any]) -> None:
    state.append_model_output(output("a", meta=meta))


def _write_tool_result(state: AgentState, meta: dict[str, Any]) -> None:
    state.append_tool_results([ToolResult(tool_call_id="c1", content="r", meta=meta)])


@pytest.mark.parametrize("write", [_write_input, _write_output, _write_tool_result])
@pytest.mark.parametrize("meta", [{"BadKey": 1}, {"big": "x" * 3000}])
def test_every_writer_rejects_bad_metadata(write: Any, meta: dict[str, Any]) -> None:
    state = with_calls("c1")
    before = state.document
    with pytest.raises(InvariantViolationError):
        write(state, meta)
    assert state.document == before


# --------------------------------------------------------------------------- system instruction


def test_latest_system_instruction_wins() -> None:
    state = new_state()
    state.set_system_instruction("first")
    state.append_model_input("q")
    message = state.set_system_instruction("second")
    assert message.role is Role.SYSTEM
    assert state.system_instruction == "second"
    assert [m.content for m in state.messages if m.role is Role.SYSTEM] == ["first", "second"]


@pytest.mark.parametrize("text", ["", "  \n"])
def test_blank_system_instruction_is_rejected(text: str) -> None:
    with pytest.raises(InvariantViolationError):
        new_state().set_system_instruction(text)


def test_setting_the_current_instruction_again_writes_nothing() -> None:
    state = new_state()
    first = state.set_system_instruction("same")
    state.take_changes()
    assert state.set_system_instruction("same") == first
    assert len(state.messages) == 1
    assert state.take_changes().is_empty()


# --------------------------------------------------------------------------- widgets state


def test_notebook_is_a_high_priority_memory_block() -> None:
    state = new_state()
    block = state.update_notebook("likes tea")
    assert (block.block_id, block.block_type, block.priority) == (
        NOTEBOOK_BLOCK_ID,
        BlockType.MEMORY,
        Priority.HIGH,
    )
    state.update_notebook("likes coffee")
    assert state.notebook == "likes coffee"
    assert [b.content for b in state.document.context_blocks] == ["likes coffee"]
    rebuilt = AgentState.from_document(load_document(dump_document(state.document)))
    assert rebuilt.notebook == "likes coffee"


def test_tasks_are_upserted_by_id() -> None:
    state = new_state()
    state.upsert_tasks([Task(task_id="t1", name="plan"), Task(task_id="t2", name="do")])
    state.upsert_tasks([Task(task_id="t1", name="plan v2"), Task(task_id="t3", name="check")])
    assert [(t.task_id, t.name) for t in state.tasks] == [
        ("t1", "plan v2"),
        ("t2", "do"),
        ("t3", "check"),
    ]
    task = state.set_task_status("t2", TaskStatus.FAILED, error="no access")
    assert (task.status, task.error) == (TaskStatus.FAILED, "no access")
    assert state.tasks[1] == task


@pytest.mark.parametrize(
    "tasks",
    [[Task(task_id="", name="x")], [Task(task_id="a", name="x"), Task(task_id="a", name="y")]],
)
def test_task_ids_must_be_non_empty_and_unique(tasks: list[Task]) -> None:
    state = new_state()
    with pytest.raises(InvariantViolationError):
        state.upsert_tasks(tasks)
    assert state.tasks == []


def test_status_of_an_unknown_task_is_rejected() -> None:
    with pytest.raises(InvariantViolationError):
        new_state().set_task_status("missing", TaskStatus.COMPLETED)


# --------------------------------------------------------------------------- run status

S = RunStatus
EXPECTED_TRANSITIONS = {
    (S.IDLE, S.PREPARING),
    (S.PREPARING, S.MODEL_RUNNING),
    (S.MODEL_RUNNING, S.TOOL_RUNNING),
    (S.MODEL_RUNNING, S.AWAITING_HUMAN),
    (S.MODEL_RUNNING, S.COMPLETED),
    (S.TOOL_RUNNING, S.MODEL_RUNNING),
    (S.TOOL_RUNNING, S.AWAITING_HUMAN),
    (S.AWAITING_HUMAN, S.MODEL_RUNNING),
    (S.AWAITING_HUMAN, S.TOOL_RUNNING),
    *((active, end) for active in (S.PREPARING, S.MODEL_RUNNING, S.TOOL_RUNNING,
                                   S.AWAITING_HUMAN) for end in (S.FAILED, S.ABORTED)),
    (S.COMPLETED, S.PREPARING),
    (S.FAILED, S.PREPARING),
    (S.ABORTED, S.PREPARING),
}  # fmt: skip

PATH_TO = {
    S.IDLE: [],
    S.PREPARING: [S.PREPARING],
    S.MODEL_RUNNING: [S.PREPARING, S.MODEL_RUNNING],
    S.TOOL_RUNNING: [S.PREPARING, S.MODEL_RUNNING, S.TOOL_RUNNING],
    S.AWAITING_HUMAN: [S.PREPARING, S.MODEL_RUNNING, S.AWAITING_HUMAN],
    S.COMPLETED: [S.PREPARING, S.MODEL_RUNNING, S.COMPLETED],
    S.FAILED: [S.PREPARING, S.FAILED],
    S.ABORTED: [S.PREPARING, S.ABORTED],
}


def state_in(status: RunStatus) -> AgentState:
    state = new_state()
    for step in PATH_TO[status]:
        state.transition(step)
    assert state.status is status
    return state


def test_transition_table_is_the_seed_002_machine() -> None:
    table = {(a, b) for a, targets in RUN_TRANSITIONS.items() for b in targets}
    assert table == EXPECTED_TRANSITIONS
    assert set(RUN_TRANSITIONS) == set(RunStatus)


@pytest.mark.parametrize(
    ("current", "target"),
    sorted(itertools.product(RunStatus, RunStatus), key=lambda p: (p[0].value, p[1].value)),
    ids=lambda s: s.value,
)
def test_every_transition_is_legal_or_raises(current: RunStatus, target: RunStatus) -> None:
    state = state_in(current)
    state.take_changes()
    before = state.run
    if (current, target) in EXPECTED_TRANSITIONS:
        assert can_transition(current, target)
        run = state.transition(target)
        assert run.status is target is state.status
        assert state.take_changes().run == run
    else:
        assert not can_transition(current, target)
        with pytest.raises(InvalidTransitionError) as info:
            state.transition(target)
        assert (info.value.current, info.value.target) == (current.value, target.value)
        assert state.run == before
        assert state.take_changes().is_empty()


def test_start_run_sets_a_run_id_and_clears_the_last_error() -> None:
    state = new_state()
    assert state.start_run("run-1").run_id == "run-1"
    state.transition(S.FAILED, error="model unreachable")
    assert state.run.last_error == "model unreachable"
    run = state.start_run()
    assert (run.run_id, run.status, run.last_error) == ("m-000001", S.PREPARING, "")
    assert state.transition(S.MODEL_RUNNING).run_id == "m-000001"


def test_start_run_while_a_run_is_active_raises() -> None:
    state = state_in(S.MODEL_RUNNING)
    with pytest.raises(InvalidTransitionError):
        state.start_run()


def test_transition_accepts_status_strings() -> None:
    state = new_state()
    state.transition("preparing")  # type: ignore[arg-type]
    assert state.status is S.PREPARING


# --------------------------------------------------------------------------- take_changes


def test_take_changes_returns_everything_written_since_the_last_call() -> None:
    state = new_state()
    state.set_system_instruction("sys")
    state.start_run("r1")
    state.append_model_input("q")
    state.append_model_output(output("", call("c1"), usage=TokenUsage(prompt_tokens=1)))
    state.append_tool_results([ToolResult(tool_call_id="c1", content="r")])
    state.update_notebook("v1")
    state.update_notebook("v2")
    state.upsert_tasks([Task(task_id="t1", name="a")])
    state.set_task_status("t1", TaskStatus.COMPLETED)
    state.set_summary("sum", from_index=0, to_index=1)

    changes = state.take_changes()
    assert [m.role for m in changes.messages] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL]
    assert changes.messages == list(state.messages)
    assert [t.tool_call_id for t in changes.tool_calls] == ["c1"]
    assert [u.prompt_tokens for u in changes.model_usage] == [1]
    assert [b.content for b in changes.context_blocks] == ["v2"]
    assert [(t.task_id, t.status) for t in changes.tasks] == [("t1", TaskStatus.COMPLETED)]
    assert changes.run == state.run
    assert changes.summary == state.summary
    assert changes.evidences == [] and changes.meta is None

    assert state.take_changes().is_empty()
    state.append_model_input("next")
    assert [m.content for m in state.take_changes().messages] == ["next"]


def test_take_changes_hands_out_copies() -> None:
    state = new_state()
    state.append_model_input("q")
    changes = state.take_changes()
    changes.messages[0].content = "tampered"
    assert state.messages[0].content == "q"


# --------------------------------------------------------------------------- summary


def test_summary_range_must_lie_within_the_history() -> None:
    state = new_state()
    state.append_model_input("a")
    state.append_model_input("b")
    summary = state.set_summary("a and b", from_index=0, to_index=1, evidence_ids=["ev"])
    assert summary.updated_at == ts(2)
    assert state.summary == summary
    for lo, hi in [(0, 2), (1, 0), (-1, 0)]:
        with pytest.raises(InvariantViolationError):
            state.set_summary("x", from_index=lo, to_index=hi)
    with pytest.raises(InvariantViolationError):
        state.set_summary(" ", from_index=0, to_index=0)
    assert state.summary == summary


# --------------------------------------------------------------------------- append-only views


def test_read_views_cannot_change_the_state() -> None:
    state = with_calls("c1")
    state.update_notebook("note")
    state.upsert_tasks([Task(task_id="t", name="task")])
    snapshot = state.document

    doc = state.document
    doc.session.messages.clear()
    doc.context_blocks[0].content = "x"
    state.messages[0].content = "changed"
    state.pending_tool_calls[0].name = "changed"
    state.tasks[0].name = "changed"
    state.run.status = S.FAILED
    appended = state.append_model_input("new")
    appended.content = "changed"

    assert state.messages[-1].content == "new"
    state_doc = state.document
    state_doc.session.messages.pop()
    assert state_doc == snapshot


def test_the_api_has_no_way_to_edit_or_delete_history() -> None:
    public = {name for name in dir(AgentState) if not name.startswith("_")}
    forbidden = ("delete", "remove", "edit", "pop", "clear", "truncate", "insert", "rewrite")
    assert not [name for name in public if any(word in name for word in forbidden)]
    with pytest.raises(AttributeError):
        new_state().messages = ()  # type: ignore[misc]


def test_generated_ids_never_repeat_ids_of_a_rebuilt_document() -> None:
    state = new_state()
    state.append_model_input("a")
    state.append_model_output(output("b", usage=TokenUsage(prompt_tokens=1)))
    rebuilt = AgentState.from_document(
        state.document, clock=SteppingClock(T0), id_generator=SequentialIdGenerator("m")
    )
    message = rebuilt.append_model_input("c")
    assert message.message_id == "m-000004"
    used = [m.message_id for m in rebuilt.messages]
    used += [u.model_usage_id for u in rebuilt.document.session.model_usage]
    assert len(used) == len(set(used))


# --------------------------------------------------------------------------- rebuild


def populated_state() -> AgentState:
    state = new_state()
    state.set_system_instruction("You are helpful.")
    state.start_run("run-1")
    state.append_model_input(
        [Section(title="Q", body="weather?")],
        author=Author(kind=AuthorKind.USER, id="u"),
        lod=LodSections(gist=[Section(body="asked weather")]),
        meta={"channel": "web", "tags": ("a", "b")},
    )
    state.transition(S.MODEL_RUNNING)
    state.append_model_output(
        output(
            "checking",
            call("c1", raw='{"city": "Paris"}'),
            call("c2", raw="{oops"),
            call("c3"),
            usage=TokenUsage(prompt_tokens=3, completion_tokens=4),
            finish_reason="tool_calls",
        )
    )
    state.transition(S.TOOL_RUNNING)
    state.append_tool_results(
        [
            ToolResult(tool_call_id="c2", status=ToolCallStatus.ERROR, error="bad args"),
            ToolResult(
                tool_call_id="c1", content="18C", lod=LodSections(gist=[Section(body="ok")])
            ),
        ]
    )
    state.update_notebook("prefers Celsius")
    state.upsert_tasks([Task(task_id="t1", name="answer", depends_on=["t0"])])
    state.set_summary("asked about weather", from_index=0, to_index=1)
    return state


def test_rebuilt_state_equals_the_original() -> None:
    state = populated_state()
    rebuilt = AgentState.from_document(state.document)
    assert rebuilt == state
    assert rebuilt.document == state.document
    assert [c.tool_call_id for c in rebuilt.pending_tool_calls] == ["c3"]
    assert rebuilt.status is S.TOOL_RUNNING
    assert rebuilt.take_changes().is_empty()


def test_rebuilt_state_equals_the_original_after_a_json_round_trip() -> None:
    state = populated_state()
    via_dict = AgentState.from_document(json.loads(json.dumps(dump_document(state.document))))
    via_text = AgentState.from_document(document_from_json(document_to_json(state.document)))
    assert via_dict == state
    assert via_text == state


def test_rebuilt_state_enforces_the_same_invariants() -> None:
    rebuilt = AgentState.from_document(populated_state().document)
    with pytest.raises(InvariantViolationError):
        rebuilt.append_tool_results([ToolResult(tool_call_id="c1", content="again")])
    with pytest.raises(InvariantViolationError):
        rebuilt.append_model_output(output("", call("c2")))
    with pytest.raises(InvalidTransitionError):
        rebuilt.transition(S.COMPLETED)
    rebuilt.append_tool_results([ToolResult(tool_call_id="c3", content="done")])
    assert rebuilt.pending_tool_calls == []


def test_states_with_different_documents_differ() -> None:
    a, b = new_state(), new_state()
    assert a == b
    a.append_model_input("x")
    assert a != b
    assert a != a.document


# -- records beside the history: evidence, tool runs, usage ----------------------------------


def test_evidence_tool_call_and_usage_records_are_idempotent_by_id() -> None:
    state = AgentState("s-records", clock=FixedClock())
    evidence = Evidence(
        evidence_id="e1",
        type=EvidenceType.RAG_DOC,
        source=EvidenceSource(kind=SourceKind.RAG, uri="kb://1"),
        content="doc",
    )
    state.add_evidence(evidence)
    state.add_evidence(evidence.model_copy(update={"content": "changed"}))
    usage = ModelUsage(model_usage_id="u1", provider="openai", model="gpt-4o")
    state.record_model_usage(usage)
    state.record_model_usage(usage)
    call = ToolCall(tool_call_id="c1", tool="f", provider=ToolProvider(kind="builtin"))
    state.record_tool_call(
        call.model_copy(update={"status": ToolCallStatus.ERROR, "duration_ms": 7})
    )
    state.record_tool_call(call)
    changes = state.take_changes()
    assert [e.content for e in changes.evidences] == ["doc"]
    assert [u.model_usage_id for u in changes.model_usage] == ["u1"]
    assert [(c.status.value, c.duration_ms) for c in changes.tool_calls] == [("error", 7)]
    assert state.document.evidences["e1"].content == "doc"


def test_a_recorded_tool_run_wins_over_the_record_its_result_would_make() -> None:
    state = AgentState("s-run-first", clock=FixedClock())
    state.append_model_input("go")
    state.append_model_output(
        ModelOutput(
            tool_calls=[ToolCallRequest(tool_call_id="c1", name="f", raw_arguments="{}")],
            invocation=ModelInvocation(provider="p", model="m"),
        )
    )
    state.record_tool_call(
        ToolCall(
            tool_call_id="c1",
            tool="f",
            provider=ToolProvider(kind="mcp", name="srv"),
            status="timeout",
            duration_ms=3000,
        )
    )
    state.append_tool_results([ToolResult(tool_call_id="c1", name="f", content="timed out")])
    records = state.document.session.tool_state.tool_calls
    assert [(r.tool_call_id, r.status.value, r.provider.kind.value) for r in records] == [
        ("c1", "timeout", "mcp")
    ]
    assert AgentState.from_document(state.document) == state
