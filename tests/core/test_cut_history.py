"""An app's cut of the oldest part of its history (``ContextEngine.cut_history``): an app that
removes its oldest turns (keeping what matters of them in a summary of its own prompt) no
longer gets them back from the session. The cut hides a prefix, reports it, never reaches the
current run nor splits a tool call from its results, never moves backwards, is stored (a
fresh engine on the same file honours it, a cold one cuts on the session's newest records),
and the engine's own rolling summary starts after it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine_properties import Step, build, steps

from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.errors import InvariantViolationError
from ce.core.events import Event, InMemoryEventBus
from ce.core.pipeline import LlmRequest, LlmResponse
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.schema import (
    Message,
    ModelInvocation,
    PruneDecision,
    Role,
    Summary,
    ToolCallRequest,
)
from ce.core.state import AgentState, ModelOutput
from ce.core.stores import MemoryStore, SQLiteStore, Store
from ce.core.testing.assertions import assert_tool_pairs_intact

INV = ModelInvocation(provider="openai", model="gpt-4o")
REMOVED = "removed by the app"
SHORTENED = "history_cut_shortened"


class Events:
    def __init__(self) -> None:
        self.bus = InMemoryEventBus()
        self.seen: list[Event] = []
        self.bus.on_all(self.seen.append)

    def degraded(self) -> list[str]:
        return [e.payload["reason"] for e in self.seen if e.event_type == "Degraded"]


def make_engine(
    store: Store | None = None, events: Events | None = None, **kwargs: Any
) -> ContextEngine:
    kwargs.setdefault("config", RuntimeConfig(model_hint="gpt-4o"))
    return ContextEngine(
        store or MemoryStore(),
        clock=SteppingClock(),
        id_generator=SequentialIdGenerator("id"),
        event_bus=(events or Events()).bus,
        **kwargs,
    )


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


def reply(text: str, *calls: str) -> Message:
    requests = [ToolCallRequest(tool_call_id=c, name="search", raw_arguments="{}") for c in calls]
    return Message(role=Role.ASSISTANT, content=text, invocation=INV, tool_calls=requests or None)


def result(call: str) -> Message:
    return Message(role=Role.TOOL, content=f"result of {call}", tool_call_id=call, name="search")


def turns(*numbers: int) -> list[Message]:
    """The app's messages of turns ``numbers`` (no ids: matched by role and text)."""
    return [m for n in numbers for m in (user(f"question {n}"), reply(f"answer {n}"))]


async def chat(engine: ContextEngine, numbers: range, session: str = "s") -> None:
    for n in numbers:
        await engine.prepare_turn(session, f"question {n}")
        await engine.commit_assistant_message(session, reply(f"answer {n}"))


def texts(parts: Any) -> list[str]:
    return [p.content for p in parts if p.role is not Role.SYSTEM]


def removed_decisions(decisions: list[PruneDecision]) -> list[PruneDecision]:
    return [d for d in decisions if d.reason.startswith(REMOVED)]


async def test_a_cut_hides_exactly_the_prefix_and_reports_it() -> None:
    events = Events()
    engine = make_engine(events=events)
    await chat(engine, range(4))
    cfg = engine.config
    index = engine._entries["s"].index(cfg.model_hint, cfg.render.fence_tool_results)
    cut_tokens = index.group_tokens(0, 4)

    put = await engine.cut_history("s", turns(0, 1))
    prepared = await engine.prepare_turn("s", "question 4")

    assert texts(prepared.assembled_input.parts) == [
        "question 2",
        "answer 2",
        "question 3",
        "answer 3",
        "question 4",
    ]
    assert not any(p.role is Role.SYSTEM for p in prepared.assembled_input.parts)  # no summary
    (decision,) = removed_decisions(prepared.report.prune_decisions)
    assert decision.reason == REMOVED and decision.action == "dropped"
    assert (decision.block_count, decision.token_estimate) == (4, cut_tokens)
    assert cut_tokens > 0
    assert not any("summary" in d.reason for d in prepared.report.prune_decisions)
    doc = await engine.get_session("s")
    assert put.version < await engine.store.get_version("s")
    assert len(doc.session.messages) == 9  # every message stays stored
    summary = doc.session.summary
    assert summary is not None and summary.source == "app" and summary.content == ""
    assert summary.message_index_range.to_index == 3
    replayed = await engine.replay_turn("s", prepared.report.turn_id)
    assert replayed.assembled_input == prepared.assembled_input
    assert events.degraded() == []
    await engine.close()


async def test_the_app_passing_its_kept_turns_gets_them_once() -> None:
    engine = make_engine()
    await chat(engine, range(3))
    await engine.cut_history("s", turns(0, 1))
    pending = [Message(role=Role.SYSTEM, content="Summary: q0, q1"), *turns(2), user("q3")]
    prepared = await engine.prepare_call("s", pending)
    parts = prepared.assembled_input.parts
    assert [(p.role, p.content) for p in parts] == [
        (Role.SYSTEM, "Summary: q0, q1"),
        (Role.USER, "question 2"),
        (Role.ASSISTANT, "answer 2"),
        (Role.USER, "q3"),
    ]
    await engine.close()


async def test_messages_are_matched_by_their_stored_id_and_redacted_text() -> None:
    engine = make_engine()
    await engine.prepare_turn("s", Message(role=Role.USER, content="hi", message_id="u0"))
    await engine.commit_assistant_message("s", reply("mail me at bob@example.com"))
    await engine.prepare_turn("s", "hi")
    await engine.commit_assistant_message("s", reply("hello again"))
    await chat(engine, range(2, 4))
    # a later message has the same text: the stored id names the first one
    await engine.cut_history("s", [Message(role=Role.USER, content="hi", message_id="u0")])
    summary = (await engine.get_session("s")).session.summary
    assert summary is not None and summary.message_index_range.to_index == 0
    # the app's text of the reply is the unredacted one: compared as the session stores it
    stored = (await engine.get_session("s")).session.messages[1].content
    assert "bob@example.com" not in stored
    await engine.cut_history("s", [reply("mail me at bob@example.com")])
    summary = (await engine.get_session("s")).session.summary
    assert summary is not None and summary.message_index_range.to_index == 1
    await engine.close()


async def test_the_newest_user_message_and_the_run_in_flight_are_never_cut() -> None:
    events = Events()
    engine = make_engine(events=events)
    await chat(engine, range(2))
    history = [*turns(0, 1), user("question 2"), reply("", "c1")]
    await engine.prepare_call("s", history[:-1])
    await engine.commit_assistant_message("s", history[-1])

    await engine.cut_history("s", history)  # everything the app holds, the run in flight too

    summary = (await engine.get_session("s")).session.summary
    assert summary is not None and summary.message_index_range.to_index == 3
    assert events.degraded() == [SHORTENED]
    prepared = await engine.prepare_call("s", [*history, result("c1")])
    parts = prepared.assembled_input.parts
    assert [p.role for p in parts] == [Role.USER, Role.ASSISTANT, Role.TOOL]
    assert parts[0].content == "question 2" and parts[2].content.find("result of c1") >= 0
    assert_tool_pairs_intact(parts)
    await engine.close()


async def test_a_cut_never_splits_a_tool_call_from_its_results() -> None:
    events = Events()
    engine = make_engine(events=events)
    app = [user("question 0"), reply("", "c1"), result("c1"), reply("answer 0")]
    await engine.prepare_call("s", app[:1])
    await engine.commit_assistant_message("s", app[1])
    await engine.prepare_call("s", app[:3])
    await engine.commit_assistant_message("s", app[3])
    await chat(engine, range(1, 2))

    await engine.cut_history("s", app[:2])  # the call, not its result

    summary = (await engine.get_session("s")).session.summary
    assert summary is not None and summary.message_index_range.to_index == 0
    assert events.degraded() == [SHORTENED]
    prepared = await engine.prepare_turn("s", "question 2")
    parts = prepared.assembled_input.parts
    assert [p.role for p in parts][:3] == [Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    assert_tool_pairs_intact(parts)
    await engine.close()


def test_a_cut_that_matches_nothing_does_nothing() -> None:
    events = Events()
    engine = make_engine(events=events)
    for n in range(2):
        engine.sync.prepare_turn("s", f"question {n}")
        engine.sync.commit_assistant_message("s", reply(f"answer {n}"))
    engine.sync.flush()
    version = engine.sync.run(engine.store.get_version("s"))
    put = engine.sync.cut_history("s", [user("never asked"), reply("never said")])
    assert put.success and put.version == version
    assert engine.sync.run(engine.store.get_version("s")) == version
    assert engine.sync.get_session("s").session.summary is None
    assert engine.sync.cut_history("s", []).version == version
    assert events.degraded() == []
    engine.sync.close()


async def test_a_cut_never_moves_backwards() -> None:
    engine = make_engine()
    await chat(engine, range(4))
    await engine.cut_history("s", turns(0, 1))
    version = await engine.store.get_version("s")
    await engine.cut_history("s", turns(0))  # an older cut, after the newer one
    doc = await engine.get_session("s")
    assert await engine.store.get_version("s") == version
    assert doc.session.summary is not None
    assert doc.session.summary.message_index_range.to_index == 3
    await engine.cut_history("s", turns(2))  # a newer one moves it on
    summary = (await engine.get_session("s")).session.summary
    assert summary is not None and summary.message_index_range.to_index == 5
    await engine.close()


async def test_a_fresh_engine_honours_the_cut_and_cuts_on_the_newest_records(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    first = make_engine(SQLiteStore(path))
    await chat(first, range(40))  # 80 messages: more than a cold call reads first
    await chat(first, range(40), session="t")
    await first.close()

    second = make_engine(SQLiteStore(path))  # another process: it reads the newest records
    await second.cut_history("s", turns(30, 35))
    assert second._entries["s"].partial  # cut on the session's newest records
    await second.cut_history("t", turns(3))  # older than those: it reads further back
    await second.close()

    third = make_engine(SQLiteStore(path))
    prepared = await third.prepare_turn("s", "question 40")
    shown = texts(prepared.assembled_input.parts)
    assert shown == [
        *(f"{k} {n}" for n in range(36, 40) for k in ("question", "answer")),
        "question 40",
    ]
    decisions = removed_decisions(prepared.report.prune_decisions)
    assert sum(d.block_count for d in decisions) == 72
    assert decisions[0].block_id.startswith("history:0..")  # not read, reported as removed
    await third.commit_assistant_message("s", reply("answer 40"))
    # the app passes what it kept: matched against the newest records, none read again
    again = await third.prepare_call("s", [*turns(36, 37, 38, 39, 40), user("question 41")])
    assert texts(again.assembled_input.parts)[0] == "question 36"
    assert texts(again.assembled_input.parts)[-3:] == ["question 40", "answer 40", "question 41"]
    assert third._entries["s"].partial
    cut = (await third.get_session("t")).session.summary
    assert cut is not None and (cut.source, cut.message_index_range.to_index) == ("app", 7)
    await third.close()


class ScriptedAdapter:
    def __init__(self) -> None:
        self.requests: list[LlmRequest] = []

    async def generate(self, request: LlmRequest) -> LlmResponse:
        self.requests.append(request)
        return LlmResponse(content=f"summary #{len(self.requests)}", model="mini")


async def test_the_engines_summary_covers_only_messages_after_the_cut() -> None:
    adapter = ScriptedAdapter()
    config = RuntimeConfig(
        model_hint="gpt-4o",
        summary={"trigger_message_count": 6, "preserve_recent_messages": 2},  # type: ignore[arg-type]
    )
    engine = make_engine(config=config, llm_adapter=adapter)
    await chat(engine, range(2))
    await engine.cut_history("s", turns(0))
    await chat(engine, range(2, 6))

    asked = adapter.requests[0].messages[-1].content
    assert "question 0" not in asked and "answer 0" not in asked
    assert "question 1" in asked and "(none yet)" in asked  # the app's cut is no summary
    summary = (await engine.get_session("s")).session.summary
    assert summary is not None and summary.source == "engine"
    covered = summary.message_index_range
    assert covered.from_index == 2 and covered.to_index > 2
    prepared = await engine.prepare_turn("s", "question 6")
    shown = texts(prepared.assembled_input.parts)
    assert "question 0" not in shown and "question 1" not in shown
    assert "Summary of earlier conversation" in prepared.assembled_input.parts[0].content
    reasons = [d.reason for d in prepared.report.prune_decisions if d.action == "dropped"]
    assert reasons[:2] == [REMOVED, "covered by the rolling summary"]
    (removed,) = removed_decisions(prepared.report.prune_decisions)
    assert removed.block_count == 2

    # a later cut within what the summary covers: the summary stands for the rest of it
    await engine.cut_history("s", turns(2))
    moved = (await engine.get_session("s")).session.summary
    assert moved is not None and moved.source == "engine"
    assert (moved.message_index_range.from_index, moved.content) == (6, summary.content)
    await engine.close()


@settings(max_examples=40, deadline=None)
@given(history=steps(), cut=st.floats(0, 1))
def test_any_prefix_cut_sends_no_cut_message_and_keeps_tool_pairs(
    history: list[Step], cut: float
) -> None:
    async def run() -> None:
        store = MemoryStore()
        changes, _ = build("p", history)
        await store.commit("p", changes)
        engine = ContextEngine(
            store,
            config=RuntimeConfig(model_hint="gpt-4o"),
            clock=SteppingClock(),
            id_generator=SequentialIdGenerator(),
        )
        messages = (await engine.get_session("p")).session.messages
        end = int(cut * (len(messages) - 1))
        await engine.cut_history("p", messages[: end + 1])
        summary = (await engine.get_session("p")).session.summary
        prepared = await engine.prepare_turn("p", "the newest question")
        parts = prepared.assembled_input.parts
        assert_tool_pairs_intact(parts)
        if summary is None:  # nothing to cut before a turn boundary (a system message)
            assert all(m.role is Role.SYSTEM for m in messages[: end + 1])
            return
        assert summary.message_index_range.to_index <= end
        gone = [
            m
            for m in messages[: summary.message_index_range.to_index + 1]
            if m.role is not Role.SYSTEM
        ]
        after = messages[summary.message_index_range.to_index + 1 :]
        assert after[0].role is not Role.TOOL  # the cut ends between two blocks
        sent = {p.content for p in parts}
        kept = {m.content for m in after}
        assert not any(m.content in sent for m in gone if m.content not in kept)
        assert not any(
            d.reason.startswith("covered by the rolling summary")
            for d in prepared.report.prune_decisions
        )

    asyncio.run(run())


def test_the_state_records_a_cut_in_its_summary_slot() -> None:
    state = AgentState("s", clock=SteppingClock(), id_generator=SequentialIdGenerator("m"))
    for n in range(3):
        state.append_model_input(f"question {n}")
        state.append_model_output(ModelOutput(text=f"answer {n}", invocation=INV))
    with pytest.raises(InvariantViolationError):
        state.cut_history(6)
    with pytest.raises(InvariantViolationError):
        state.cut_history(1, held_from=2)  # before the messages the state holds
    cut = state.cut_history(1)
    assert cut is not None and (cut.source, cut.content, cut.removed_by_app) == ("app", "", 2)
    assert state.take_changes().summary == cut
    assert state.cut_history(0) is None and state.cut_history(1) is None
    summary = state.set_summary("q1 and q2", from_index=2, to_index=4)
    assert (summary.source, summary.removed_by_app) == ("engine", 2)
    assert state.cut_history(5, held_from=0) is not None  # past the summary: the app's
    assert state.summary is not None and state.summary.source == "app"
    # an engine summary is stored as before the field existed
    assert "source" not in summary.model_dump_json()
    assert Summary.model_validate_json(summary.model_dump_json()) == summary
