"""render_live_context (LoD, LiveScreen, tool pairing, summary) and the provider formats."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ce.core.formats import (
    ANTHROPIC_PLACEHOLDER_TEXT,
    AnthropicRequest,
    from_openai_messages,
    to_anthropic_messages,
    to_openai_messages,
)
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.schema import (
    LodSections,
    MessagePart,
    ModelInvocation,
    Role,
    Section,
    SessionDocument,
    Task,
    TaskStatus,
    ToolCallRequest,
    ToolCallStatus,
    document_from_json,
    document_to_json,
    dump_document,
    load_document,
)
from ce.core.state import (
    LIVE_SCREEN_HEADING,
    SUMMARY_SECTION,
    AgentState,
    MemoryNotebookWidget,
    ModelOutput,
    RenderOptions,
    StateView,
    TaskListWidget,
    ToolResult,
    Widget,
    default_widgets,
    render_live_context,
    render_live_screen,
)

INVOCATION = ModelInvocation(provider="openai", model="gpt-4o")
NO_WIDGETS = RenderOptions(widgets=())


def new_state() -> AgentState:
    return AgentState("s", clock=SteppingClock(), id_generator=SequentialIdGenerator("m"))


def call(call_id: str, name: str = "search", raw: str = '{"q": 1}') -> ToolCallRequest:
    return ToolCallRequest(tool_call_id=call_id, name=name, raw_arguments=raw)


def say(state: AgentState, text: str = "", *calls: ToolCallRequest) -> None:
    state.append_model_output(ModelOutput(text=text, tool_calls=list(calls), invocation=INVOCATION))


def answer(
    state: AgentState, *call_ids: str, status: ToolCallStatus = ToolCallStatus.SUCCESS
) -> None:
    state.append_tool_results(
        [ToolResult(tool_call_id=i, content=f"result {i}", status=status) for i in call_ids]
    )


def lod_input(state: AgentState, name: str) -> None:
    state.append_model_input(
        f"{name} live",
        lod=LodSections(
            summary=[Section(body=f"{name} summary")], gist=[Section(body=f"{name} gist")]
        ),
    )


def shape(parts: list[MessagePart]) -> list[tuple[str, str]]:
    return [(p.role.value, p.content) for p in parts]


# --------------------------------------------------------------------------- instruction


def test_latest_system_instruction_renders_first_and_once() -> None:
    state = new_state()
    state.set_system_instruction("old rules")
    state.append_model_input("hi")
    state.set_system_instruction("new rules")
    say(state, "hello")
    assert shape(render_live_context(state, NO_WIDGETS)) == [
        ("system", "new rules"),
        ("user", "hi"),
        ("assistant", "hello"),
    ]


def test_no_system_part_without_an_instruction() -> None:
    state = new_state()
    state.append_model_input("hi")
    assert shape(render_live_context(state, NO_WIDGETS)) == [("user", "hi")]
    assert render_live_context(new_state()) == []


# --------------------------------------------------------------------------- level of detail


def test_level_of_detail_follows_position_from_the_newest() -> None:
    state = new_state()
    for i in range(6):
        lod_input(state, f"u{i}")
        say(state, f"a{i}")
    state.append_model_input("plain old text")  # no lod: same text at every level
    lod_input(state, "u7")
    parts = render_live_context(state, RenderOptions(summary_window=2, widgets=()))
    users = [p.content for p in parts if p.role is Role.USER]
    assert users == [
        "u0 gist",
        "u1 gist",
        "u2 gist",
        "u3 gist",
        "u4 gist",
        "u5 summary",
        "plain old text",
        "u7 live",
    ]
    assert [p.content for p in parts if p.role is Role.ASSISTANT] == [f"a{i}" for i in range(6)]


def test_default_summary_window_is_four() -> None:
    state = new_state()
    for i in range(7):
        lod_input(state, f"u{i}")
    users = [p.content for p in render_live_context(state, NO_WIDGETS)]
    levels = ["gist"] * 2 + ["summary"] * 4 + ["live"]
    assert users == [f"u{i} {level}" for i, level in enumerate(levels)]


def test_results_of_one_turn_share_a_level_and_count_once() -> None:
    state = new_state()
    lod_input(state, "u0")
    say(state, "", call("c1"), call("c2"))
    state.append_tool_results(
        [
            ToolResult(
                tool_call_id=i,
                content=f"{i} live",
                lod=LodSections(
                    summary=[Section(body=f"{i} summary")], gist=[Section(body=f"{i} gist")]
                ),
            )
            for i in ("c1", "c2")
        ]
    )
    lod_input(state, "u1")
    parts = render_live_context(state, RenderOptions(summary_window=1, widgets=()))
    assert shape(parts)[2:] == [
        ("tool", "c1 summary"),
        ("tool", "c2 summary"),
        ("user", "u1 live"),
    ]
    assert parts[0].content == "u0 gist"


# --------------------------------------------------------------------------- live screen


def test_live_screen_is_appended_to_the_newest_user_message() -> None:
    state = new_state()
    state.append_model_input("first")
    state.append_model_input("second")
    state.update_notebook("likes tea")
    state.upsert_tasks(
        [
            Task(task_id="t1", name="plan", status=TaskStatus.COMPLETED),
            Task(task_id="t2", name="act", status=TaskStatus.IN_PROGRESS),
            Task(task_id="t3", name="fix", status=TaskStatus.FAILED, error="no access"),
            Task(task_id="t4", name="check"),
        ]
    )
    parts = render_live_context(state)
    assert parts[0].content == "first"
    assert parts[1].content == (
        "second\n\n# [Live Screen]\n\n"
        "## Memory Notebook\n\nlikes tea\n\n"
        "## Tasks\n\n"
        "- [x] plan (`t1`)\n"
        "- [ ] act (`t2`) — in progress\n"
        "- [ ] fix (`t3`) — failed: no access\n"
        "- [ ] check (`t4`)"
    )


def test_task_list_shows_open_tasks_and_the_newest_finished_ones() -> None:
    state = new_state()
    statuses = [TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.PENDING]
    state.upsert_tasks(
        [Task(task_id=f"t{i}", name=f"run {i}", status=statuses[i % 3]) for i in range(12)]
    )
    state.upsert_tasks([Task(task_id="t0", name="run 0", status=TaskStatus.CANCELLED)])
    lines = (
        TaskListWidget(recent_finished=3).render_live_screen(StateView(state.document)).splitlines()
    )
    # finished: t0 (cancelled), t1, t3, t4, t6, t7, t9, t10; the newest three are listed
    assert lines[:3] == [
        "## Tasks",
        "",
        "- (5 earlier finished tasks not listed: 2 completed, 2 failed, 1 cancelled)",
    ]
    assert [line.split("`")[1] for line in lines[3:]] == [
        "t2",
        "t5",
        "t7",
        "t8",
        "t9",
        "t10",
        "t11",
    ]
    assert TaskListWidget().recent_finished == 5
    everything = TaskListWidget(recent_finished=12).render_live_screen(StateView(state.document))
    assert everything is not None and "not listed" not in everything
    assert everything.count("\n- ") == 12
    with pytest.raises(ValueError, match="recent_finished"):
        TaskListWidget(recent_finished=-1)


def test_live_screen_goes_to_the_last_tool_result_when_that_is_newest() -> None:
    state = new_state()
    state.append_model_input("q")
    say(state, "", call("c1"), call("c2"))
    answer(state, "c1", "c2")
    state.update_notebook("note")
    parts = render_live_context(state)
    assert parts[-1].role is Role.TOOL
    assert parts[-1].content.startswith(f"result c2\n\n{LIVE_SCREEN_HEADING}")
    assert parts[-2].content == "result c1"
    assert parts[0].content == "q"


def test_no_live_screen_when_widgets_are_empty_or_disabled() -> None:
    state = new_state()
    state.append_model_input("q")
    assert render_live_screen(state) is None
    assert render_live_context(state)[-1].content == "q"
    state.update_notebook("   ")
    assert render_live_screen(state) is None
    state.update_notebook("note")
    assert render_live_screen(state) == f"{LIVE_SCREEN_HEADING}\n\n## Memory Notebook\n\nnote"
    assert render_live_context(state, NO_WIDGETS)[-1].content == "q"


def test_widgets_render_in_the_given_order_and_custom_widgets_fit_the_protocol() -> None:
    class Clock:
        name = "clock"

        def render_live_screen(self, view: StateView) -> str | None:
            return f"## Session\n\n{view.session_id}"

    assert isinstance(Clock(), Widget)
    state = new_state()
    state.update_notebook("note")
    screen = render_live_screen(state, [Clock(), *default_widgets()])
    assert screen == f"{LIVE_SCREEN_HEADING}\n\n## Session\n\ns\n\n## Memory Notebook\n\nnote"
    assert [w.name for w in default_widgets()] == ["memory_notebook", "task_list"]
    assert isinstance(MemoryNotebookWidget(), Widget) and isinstance(TaskListWidget(), Widget)


def test_widgets_cannot_change_the_state_through_their_view() -> None:
    class Vandal:
        name = "vandal"

        def render_live_screen(self, view: StateView) -> str | None:
            for message in view.messages:
                message.content = "vandalized"
            for task in (*view.tasks, *view.tasks_at(range(len(view.task_statuses)))):
                task.name = "vandalized"
            block = view.context_block("widget:notebook")
            if block is not None:
                block.content = "vandalized"
            return None

    state = new_state()
    state.append_model_input("q")
    state.update_notebook("note")
    state.upsert_tasks([Task(task_id="t", name="task")])
    before = state.document
    render_live_context(state, RenderOptions(widgets=(Vandal(),)))
    assert state.document == before


# --------------------------------------------------------------------------- tool pairing


def test_unanswered_calls_are_left_out() -> None:
    state = new_state()
    state.append_model_input("q")
    say(state, "let me check", call("c1"), call("c2"))
    answer(state, "c2")
    say(state, "", call("c3"))  # no text, no answered call: dropped entirely
    parts = render_live_context(state, NO_WIDGETS)
    assert shape(parts) == [("user", "q"), ("assistant", "let me check"), ("tool", "result c2")]
    assert [c.tool_call_id for c in parts[1].tool_calls or []] == ["c2"]


def test_late_results_render_right_after_their_call() -> None:
    state = new_state()
    state.append_model_input("q")
    say(state, "", call("c1"), call("c2"))
    answer(state, "c2")
    state.append_model_input("are you there?")
    answer(state, "c1")
    parts = render_live_context(state, NO_WIDGETS)
    assert [(p.role.value, p.tool_call_id) for p in parts] == [
        ("user", None),
        ("assistant", None),
        ("tool", "c1"),
        ("tool", "c2"),
        ("user", None),
    ]


def test_tool_parts_carry_is_error_from_the_recorded_status() -> None:
    state = new_state()
    state.append_model_input("q")
    say(state, "", call("c1"), call("c2"))
    answer(state, "c1")
    answer(state, "c2", status=ToolCallStatus.TIMEOUT)
    tools = [p for p in render_live_context(state) if p.role is Role.TOOL]
    assert [(p.tool_call_id, p.name, p.is_error) for p in tools] == [
        ("c1", "search", False),
        ("c2", "search", True),
    ]


def test_orphan_and_duplicate_tool_messages_in_a_foreign_document_are_dropped() -> None:
    doc = load_document(
        {
            "schema_version": "1.0",
            "session": {
                "session_id": "s",
                "messages": [
                    {"role": "tool", "tool_call_id": "early", "content": "before its call"},
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "tool_calls": [{"tool_call_id": "early", "name": "f"}],
                    },
                    {"role": "tool", "tool_call_id": "ghost", "content": "no call"},
                    {"role": "tool", "tool_call_id": "early", "content": "first"},
                    {"role": "tool", "tool_call_id": "early", "content": "second"},
                ],
            },
        }
    )
    parts = render_live_context(doc, NO_WIDGETS)
    assert shape(parts) == [("user", "q"), ("assistant", ""), ("tool", "first")]


# --------------------------------------------------------------------------- summary


def summarized_state() -> AgentState:
    state = new_state()
    state.set_system_instruction("rules")  # 0
    state.append_model_input("q1")  # 1
    say(state, "", call("c1"))  # 2
    answer(state, "c1")  # 3
    state.append_model_input("q2")  # 4
    say(state, "", call("c2"))  # 5
    state.append_model_input("q3")  # 6
    answer(state, "c2")  # 7
    say(state, "a3")  # 8
    return state


def test_summary_replaces_its_range_with_one_note() -> None:
    state = summarized_state()
    state.set_summary("talked about q1", from_index=1, to_index=4)
    assert shape(render_live_context(state, NO_WIDGETS)) == [
        ("system", "rules"),
        ("user", f"{SUMMARY_SECTION}\ntalked about q1"),
        ("assistant", ""),
        ("tool", "result c2"),
        ("user", "q3"),
        ("assistant", "a3"),
    ]


def test_summary_keeps_a_partly_covered_tool_group_whole() -> None:
    state = summarized_state()
    state.set_summary("up to q3", from_index=1, to_index=6)  # c2's result (7) is outside
    assert shape(render_live_context(state, NO_WIDGETS)) == [
        ("system", "rules"),
        ("user", f"{SUMMARY_SECTION}\nup to q3"),
        ("assistant", ""),
        ("tool", "result c2"),
        ("assistant", "a3"),
    ]
    state.set_summary("first turn", from_index=2, to_index=2)  # c1's result (3) is outside
    assert shape(render_live_context(state, NO_WIDGETS))[1:5] == [
        ("user", "q1"),
        ("user", f"{SUMMARY_SECTION}\nfirst turn"),
        ("assistant", ""),
        ("tool", "result c1"),
    ]


def test_an_apps_cut_leaves_its_messages_out_with_nothing_in_their_place() -> None:
    state = summarized_state()
    assert state.cut_history(4) is not None  # up to q2: c2's call (5) and result (7) stay
    assert shape(render_live_context(state, NO_WIDGETS)) == [
        ("system", "rules"),
        ("assistant", ""),
        ("tool", "result c2"),
        ("user", "q3"),
        ("assistant", "a3"),
    ]
    assert state.cut_history(3) is None  # never backwards
    assert state.cut_history(5) is not None  # splits c2's group: the group renders whole
    assert shape(render_live_context(state, NO_WIDGETS))[1:3] == [
        ("assistant", ""),
        ("tool", "result c2"),
    ]


def test_hidden_messages_do_not_count_for_level_of_detail() -> None:
    state = new_state()
    for i in range(4):
        lod_input(state, f"u{i}")
    state.set_summary("early", from_index=1, to_index=2)
    parts = render_live_context(state, RenderOptions(summary_window=1, widgets=()))
    assert [p.content for p in parts] == ["u0 summary", f"{SUMMARY_SECTION}\nearly", "u3 live"]


# --------------------------------------------------------------------------- purity


class ForbiddenClock:
    def now_iso(self) -> str:
        raise AssertionError("render read the clock")


def test_render_is_pure_and_hands_out_copies() -> None:
    state = summarized_state()
    state.update_notebook("note")
    rebuilt = AgentState.from_document(state.document, clock=ForbiddenClock())
    before = rebuilt.document
    first = render_live_context(rebuilt)
    first[0].content = "tampered"
    for part in first:
        for c in part.tool_calls or ():
            c.name = "tampered"
    second = render_live_context(rebuilt)
    assert second == render_live_context(state)
    assert second == render_live_context(rebuilt.document)
    assert rebuilt.document == before
    assert all(c.name == "search" for p in second for c in p.tool_calls or ())


def test_summary_window_must_not_be_negative() -> None:
    with pytest.raises(ValueError):
        RenderOptions(summary_window=-1)


# --------------------------------------------------------------------------- formats


def test_to_openai_messages_maps_roles_calls_and_results() -> None:
    parts = [
        MessagePart(role=Role.SYSTEM, content="rules"),
        MessagePart(role=Role.USER, content="q", name="alice"),
        MessagePart(
            role=Role.ASSISTANT,
            content="",
            tool_calls=[
                call("c1", "search", '{"q":  "x"}'),
                ToolCallRequest(tool_call_id="c2", name="now"),
            ],
        ),
        MessagePart(role=Role.TOOL, content="r1", tool_call_id="c1", name="search"),
        MessagePart(role=Role.TOOL, content="r2", tool_call_id="c2", name="now", is_error=True),
        MessagePart(role=Role.ASSISTANT, content="done"),
    ]
    assert to_openai_messages(parts) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "q", "name": "alice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q":  "x"}'},
                },
                {"id": "c2", "type": "function", "function": {"name": "now", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        {"role": "assistant", "content": "done"},
    ]


def test_from_openai_messages_is_tolerant_of_content_shapes() -> None:
    parts = from_openai_messages(
        [
            {"role": "developer", "content": [{"type": "text", "text": "rules"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "http://x"}},
                    "at this",
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": {"a": 1}},
                    },
                    {"id": "c2", "function": {"name": "g", "arguments": "[1]"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok"}]},
            {"role": "tool", "tool_call_id": "c2", "content": "bad"},
        ]
    )
    assert shape(parts) == [
        ("system", "rules"),
        ("user", "look\nat this"),
        ("assistant", ""),
        ("tool", "ok"),
        ("tool", "bad"),
    ]
    c1, c2 = parts[2].tool_calls or []
    assert (c1.raw_arguments, c1.arguments) == ('{"a":1}', {"a": 1})
    assert c2.arguments is None and c2.parse_error
    assert [p.name for p in parts[3:]] == ["f", "g"]


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "function", "content": "x"}],
        [{"role": "tool", "content": "x"}],
        [{"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "custom": {}}]}],
        [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}],
        [{"role": "user", "content": 3}],
    ],
)
def test_from_openai_messages_rejects_what_it_cannot_represent(messages: Any) -> None:
    with pytest.raises(ValueError):
        from_openai_messages(messages)


def test_tool_parts_without_an_id_are_rejected_by_both_formats() -> None:
    part = MessagePart(role=Role.TOOL, content="x")
    with pytest.raises(ValueError):
        to_openai_messages([part])
    with pytest.raises(ValueError):
        to_anthropic_messages([part])


def test_to_anthropic_messages_alternates_and_groups_results() -> None:
    parts = [
        MessagePart(role=Role.SYSTEM, content="rules"),
        MessagePart(role=Role.USER, content="q1"),
        MessagePart(role=Role.USER, content="   "),
        MessagePart(role=Role.USER, content="q2"),
        MessagePart(
            role=Role.ASSISTANT,
            content="checking",
            tool_calls=[
                call("c1"),
                ToolCallRequest(tool_call_id="c2", name="g", raw_arguments="{x", parse_error="bad"),
            ],
        ),
        MessagePart(role=Role.TOOL, content="r1", tool_call_id="c1"),
        MessagePart(role=Role.TOOL, content="", tool_call_id="c2", is_error=True),
        MessagePart(role=Role.USER, content="thanks"),
        MessagePart(role=Role.ASSISTANT, content="welcome"),
        MessagePart(role=Role.SYSTEM, content="late note"),
    ]
    request = to_anthropic_messages(parts)
    assert request == AnthropicRequest(
        system="rules\n\nlate note",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "q1"}, {"type": "text", "text": "q2"}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "c1", "name": "search", "input": {"q": 1}},
                    {"type": "tool_use", "id": "c2", "name": "g", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "r1"},
                    {"type": "tool_result", "tool_use_id": "c2", "is_error": True},
                    {"type": "text", "text": "thanks"},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "welcome"}]},
        ],
    )


def test_to_anthropic_messages_starts_with_a_user_placeholder_when_needed() -> None:
    request = to_anthropic_messages([MessagePart(role=Role.ASSISTANT, content="Hi, I am Bot.")])
    assert request.system == ""
    assert request.messages[0] == {
        "role": "user",
        "content": [{"type": "text", "text": ANTHROPIC_PLACEHOLDER_TEXT}],
    }
    assert [m["role"] for m in request.messages] == ["user", "assistant"]
    assert to_anthropic_messages([]) == AnthropicRequest(system="", messages=[])


def test_anthropic_tool_results_come_before_user_text_of_the_same_message() -> None:
    parts = [
        MessagePart(role=Role.USER, content="q"),
        MessagePart(role=Role.ASSISTANT, content="", tool_calls=[call("c1")]),
        MessagePart(role=Role.USER, content="interjection"),
        MessagePart(role=Role.TOOL, content="r", tool_call_id="c1"),
    ]
    [_, _, results] = to_anthropic_messages(parts).messages
    assert [b["type"] for b in results["content"]] == ["tool_result", "text"]


# --------------------------------------------------------------------------- properties

TEXTS = st.text(min_size=1, max_size=10).filter(lambda t: bool(t.strip()))
RAW_ARGS = st.sampled_from(['{"q": 1}', "{}", "", "{bad", "[1, 2]", '{"city": "Zürich"}'])


def build_history(data: st.DataObject) -> AgentState:
    """A random valid history written through AgentState itself: parallel tool calls, results
    in any order and batching, calls left unanswered, interleaved inputs, instruction changes,
    notebook/task updates and rolling summaries. Checks append-only as it goes."""
    state = new_state()
    next_call = 0
    for _ in range(data.draw(st.integers(min_value=1, max_value=25), label="ops")):
        pending = [c.tool_call_id for c in state.pending_tool_calls]
        ops = ["input", "output", "output", "system", "notebook", "task", "summary"]
        ops += ["results"] * 4 if pending else []
        op = data.draw(st.sampled_from(ops))
        before = state.messages
        if op == "input":
            lod = data.draw(
                st.none() | st.builds(lambda s: LodSections(gist=[Section(body=s)]), TEXTS)
            )
            state.append_model_input(data.draw(TEXTS), lod=lod)
        elif op == "output":
            n_calls = data.draw(st.integers(min_value=0, max_value=3))
            calls = []
            for _ in range(n_calls):
                next_call += 1
                name = data.draw(st.sampled_from(["search", "fetch"]))
                calls.append(call(f"call-{next_call}", name, data.draw(RAW_ARGS)))
            text = data.draw(st.just("") | TEXTS) if calls else data.draw(TEXTS)
            say(state, text, *calls)
        elif op == "results":
            chosen = data.draw(st.permutations(pending))[: data.draw(st.integers(1, len(pending)))]
            statuses = st.sampled_from(list(ToolCallStatus))
            state.append_tool_results(
                [
                    ToolResult(
                        tool_call_id=i,
                        content=data.draw(st.just("") | TEXTS),
                        status=data.draw(statuses),
                    )
                    for i in chosen
                ]
            )
        elif op == "system":
            state.set_system_instruction(data.draw(TEXTS))
        elif op == "notebook":
            state.update_notebook(data.draw(st.just("") | TEXTS))
        elif op == "task":
            status = data.draw(st.sampled_from(list(TaskStatus)))
            state.upsert_tasks(
                [Task(task_id=f"t{data.draw(st.integers(0, 3))}", name="task", status=status)]
            )
        elif op == "summary" and before:
            lo = data.draw(st.integers(0, len(before) - 1))
            hi = data.draw(st.integers(lo, len(before) - 1))
            state.set_summary(data.draw(TEXTS), from_index=lo, to_index=hi)
        assert state.messages[: len(before)] == before, "history must be append-only"
    return state


OPTIONS = st.builds(
    RenderOptions,
    summary_window=st.integers(min_value=0, max_value=5),
    widgets=st.sampled_from([(), default_widgets()]),
)


def assert_openai_conventions(messages: list[dict[str, Any]]) -> None:
    """Every tool message answers the nearest preceding assistant message; each declared call
    has exactly one tool message, and they follow the assistant message contiguously."""
    i = 0
    while i < len(messages):
        message = messages[i]
        assert message["role"] != "tool", f"tool message {i} does not follow its assistant message"
        if message["role"] == "assistant" and message.get("tool_calls"):
            ids = [c["id"] for c in message["tool_calls"]]
            assert all(c["type"] == "function" for c in message["tool_calls"])
            assert all(isinstance(c["function"]["arguments"], str) for c in message["tool_calls"])
            following = messages[i + 1 : i + 1 + len(ids)]
            assert [m["role"] for m in following] == ["tool"] * len(ids)
            assert [m["tool_call_id"] for m in following] == ids
            i += 1 + len(ids)
        else:
            i += 1


def assert_anthropic_conventions(request: AnthropicRequest) -> None:
    """Strict alternation starting with user, no empty content, and the results of every
    tool_use turn all in the one user message right after it (before any text)."""
    messages = request.messages
    if not messages:
        return
    assert messages[0]["role"] == "user"
    for a, b in itertools.pairwise(messages):
        assert a["role"] != b["role"]
    for i, message in enumerate(messages):
        blocks = message["content"]
        assert blocks, "no empty content"
        for block in blocks:
            if block["type"] == "text":
                assert block["text"].strip()
        uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        if uses:
            assert message["role"] == "assistant"
            assert i + 1 < len(messages), "a tool_use without its results"
            nxt = messages[i + 1]["content"]
            assert [b["tool_use_id"] for b in nxt if b["type"] == "tool_result"] == uses
        if results:
            assert message["role"] == "user" and i > 0
            previous = messages[i - 1]["content"]
            assert results == [b["id"] for b in previous if b["type"] == "tool_use"]
            kinds = [b["type"] for b in blocks]
            assert kinds == sorted(kinds, key=lambda k: k != "tool_result")


@settings(max_examples=150)
@given(data=st.data(), options=OPTIONS)
def test_render_is_deterministic_and_survives_rebuild(
    data: st.DataObject, options: RenderOptions
) -> None:
    state = build_history(data)
    rendered = render_live_context(state, options)
    assert render_live_context(state, options) == rendered
    doc = state.document
    assert render_live_context(doc, options) == rendered
    assert render_live_context(AgentState.from_document(doc), options) == rendered
    from_json = load_document(json.loads(json.dumps(dump_document(doc))))
    assert render_live_context(from_json, options) == rendered
    rebuilt = AgentState.from_document(document_from_json(document_to_json(doc)))
    assert rebuilt == state
    assert render_live_context(rebuilt, options) == rendered


@settings(max_examples=150)
@given(data=st.data(), options=OPTIONS)
def test_rendered_tool_calls_and_results_always_pair(
    data: st.DataObject, options: RenderOptions
) -> None:
    state = build_history(data)
    parts = render_live_context(state, options)
    if state.system_instruction is not None:
        assert parts[0] == MessagePart(role=Role.SYSTEM, content=state.system_instruction)
    assert sum(p.role is Role.SYSTEM for p in parts) == (state.system_instruction is not None)
    calls = [c.tool_call_id for p in parts for c in p.tool_calls or ()]
    results = [p.tool_call_id for p in parts if p.role is Role.TOOL]
    assert sorted(calls) == sorted(results)
    assert len(set(calls)) == len(calls)
    pending = {c.tool_call_id for c in state.pending_tool_calls}
    assert not pending & set(calls)


@settings(max_examples=150)
@given(data=st.data(), options=OPTIONS)
def test_openai_output_keeps_tool_conventions_and_round_trips(
    data: st.DataObject, options: RenderOptions
) -> None:
    parts = render_live_context(build_history(data), options)
    messages = to_openai_messages(parts)
    assert_openai_conventions(messages)
    expected = [
        part.model_copy(
            update={
                "is_error": False,  # OpenAI has no error flag
                "tool_calls": [
                    c.model_copy(update={"raw_arguments": c.raw_arguments or "{}"})
                    for c in part.tool_calls
                ]
                if part.tool_calls
                else None,
            }
        )
        for part in parts
    ]
    assert from_openai_messages(messages) == expected
    assert from_openai_messages(json.loads(json.dumps(messages))) == expected


@settings(max_examples=150)
@given(data=st.data(), options=OPTIONS)
def test_anthropic_output_keeps_alternation_and_groups_results(
    data: st.DataObject, options: RenderOptions
) -> None:
    state = build_history(data)
    request = to_anthropic_messages(render_live_context(state, options))
    assert_anthropic_conventions(request)
    assert request.system == (state.system_instruction or "")
    json.dumps(request.messages)  # wire-ready
    errors = {b["tool_use_id"] for m in request.messages for b in m["content"] if b.get("is_error")}
    failed = {
        r.tool_call_id
        for r in state.document.session.tool_state.tool_calls
        if r.status is not ToolCallStatus.SUCCESS
    }
    assert errors <= failed


def test_render_accepts_a_document_model() -> None:
    state = summarized_state()
    assert isinstance(state.document, SessionDocument)
    assert render_live_context(state.document) == render_live_context(state)
