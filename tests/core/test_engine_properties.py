"""Property tests of the assembled input over random histories and budgets."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.errors import BudgetExceededError
from ce.core.formats import to_anthropic_messages, to_openai_messages
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.schema import (
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    ModelInvocation,
    Role,
    SourceKind,
    ToolCallRequest,
)
from ce.core.state import AgentState, ModelOutput, ToolResult
from ce.core.stores import MemoryStore, SessionChanges
from ce.core.testing.assertions import assert_tool_pairs_intact
from ce.core.tokens import CharBasedEstimator

WORDS = ["alpha", "beta", "gamma", "délta", "东京", "42", "x=1;", '{"k": 3}']
INV = ModelInvocation(provider="openai", model="gpt-4o")


@dataclass
class Step:
    user: str
    calls: list[list[int]]  # per assistant step: result lengths of its parallel calls
    answer: str
    evidences: list[tuple[int, float | None, bool]]  # (length, confidence, linked to a call)


def text(draw: st.DrawFn, max_words: int) -> str:
    n = draw(st.integers(1, max_words))
    return " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=n, max_size=n)))


@st.composite
def steps(draw: st.DrawFn) -> list[Step]:
    out = []
    for _ in range(draw(st.integers(1, 14))):
        calls = draw(
            st.lists(
                st.lists(st.sampled_from([5, 40, 400, 2500]), min_size=1, max_size=3),
                max_size=2,
            )
        )
        evidences = draw(
            st.lists(
                st.tuples(
                    st.sampled_from([20, 300, 1500]),
                    st.none() | st.floats(0, 1),
                    st.booleans(),
                ),
                max_size=3,
            )
        )
        out.append(Step(text(draw, 60), calls, text(draw, 80), evidences))
    return out


def build(session_id: str, history: list[Step]) -> tuple[SessionChanges, int]:
    """The session through AgentState; returns its changes and the number of candidates
    the engine must account for (excluding the new user message of the turn)."""
    state = AgentState(session_id, clock=SteppingClock(), id_generator=SequentialIdGenerator("h"))
    state.set_system_instruction("You answer questions using tools.")
    groups = standalone = 0
    counter = 0
    for step in history:
        state.append_model_input(step.user)
        groups += 1
        last_call = None
        for round_ in step.calls:
            calls = []
            for _ in round_:
                counter += 1
                calls.append(
                    ToolCallRequest(
                        tool_call_id=f"c{counter}", name="search", raw_arguments='{"q": "w"}'
                    )
                )
            state.append_model_output(ModelOutput(tool_calls=calls, invocation=INV))
            groups += 1
            state.append_tool_results(
                [
                    ToolResult(tool_call_id=c.tool_call_id, name="search", content="r" * n)
                    for c, n in zip(calls, round_, strict=False)
                ]
            )
            last_call = calls[-1].tool_call_id
        for i, (length, confidence, linked) in enumerate(step.evidences):
            counter += 1
            link = last_call if linked and last_call else None
            standalone += link is None
            state.add_evidence(
                Evidence(
                    evidence_id=f"e{counter}-{i}",
                    type=EvidenceType.RAG_DOC,
                    source=EvidenceSource(kind=SourceKind.RAG, uri=f"kb://{counter}"),
                    content="doc " * (length // 4),
                    confidence=confidence,
                    links=EvidenceLinks(tool_call_id=link),
                )
            )
        state.append_model_output(ModelOutput(text=step.answer, invocation=INV))
        groups += 1
    return state.take_changes(), 1 + groups + standalone


def add_dangling_call(changes: SessionChanges) -> None:
    """End the session with an assistant tool call that never got its result."""
    changes.messages.append(
        changes.messages[-1].model_copy(
            update={
                "message_id": "dangling",
                "content": "",
                "tool_calls": [ToolCallRequest(tool_call_id="never", name="f", raw_arguments="{}")],
            }
        )
    )


@settings(max_examples=60)
@given(history=steps(), budget=st.integers(150, 6000), unanswered=st.booleans())
def test_assembled_input_respects_budget_pairs_and_accounts_for_every_block(
    history: list[Step], budget: int, unanswered: bool
) -> None:
    async def run() -> None:
        store = MemoryStore()
        changes, candidates = build("p", history)
        if unanswered:  # an interrupted run: a call that never got its result
            add_dangling_call(changes)
            candidates += 1
        await store.commit("p", changes)
        config = RuntimeConfig(
            model_hint="gpt-4o",
            budget=BudgetConfig(max_input_tokens=budget + 100, reserved_reply_tokens=100),
        )
        engine = ContextEngine(
            store, config=config, clock=SteppingClock(), id_generator=SequentialIdGenerator()
        )
        try:
            result = await engine.prepare_turn("p", "the newest question")
        except BudgetExceededError:
            assert budget < 400  # only a tiny budget cannot hold instruction + question
            return
        assembled = result.assembled_input
        assert assembled.total_tokens <= budget == result.report.token_budget
        parts = assembled.parts
        assert parts[0].role is Role.SYSTEM
        assert parts[-1].role is Role.USER and parts[-1].content == "the newest question"
        assert_tool_pairs_intact(parts)
        anthropic = to_anthropic_messages(parts)
        roles = [m["role"] for m in anthropic.messages]
        assert all(a != b for a, b in itertools.pairwise(roles)), roles
        assert to_openai_messages(parts)[0]["role"] == "system"
        decisions = result.report.prune_decisions
        assert sum(d.block_count for d in decisions) == candidates + 1  # + the new question
        assert len({d.block_id for d in decisions}) == len(decisions)
        replayed = await engine.replay_turn("p", result.report.turn_id)
        assert replayed.assembled_input == assembled
        assert replayed.report.prune_decisions == decisions

    asyncio.run(run())


@settings(max_examples=25)
@given(history=steps(), budget=st.integers(400, 3000))
def test_same_inputs_give_identical_output_with_any_estimator(
    history: list[Step], budget: int
) -> None:
    async def once() -> list[object]:
        store = MemoryStore()
        changes, _ = build("d", history)
        await store.commit("d", changes)
        engine = ContextEngine(
            store,
            config=RuntimeConfig(
                model_hint="claude-x",
                budget=BudgetConfig(max_input_tokens=budget + 50, reserved_reply_tokens=50),
            ),
            clock=SteppingClock(),
            id_generator=SequentialIdGenerator(),
            token_estimator=CharBasedEstimator(),
        )
        result = await engine.prepare_turn("d", "again")
        return [result.assembled_input, result.report.prune_decisions]

    assert asyncio.run(once()) == asyncio.run(once())


@settings(max_examples=40)
@given(history=steps(), budget=st.integers(400, 6000), unanswered=st.booleans())
def test_the_conversation_walk_decides_as_the_general_path_does(
    history: list[Step], budget: int, unanswered: bool
) -> None:
    """A TTL that never expires sends every conversation block through the pruner's general
    per-block path; without one, blocks that fit at Live are decided in the walk itself.
    Both must give the same input and the same report."""

    async def prepared(ttl: dict[str, int] | None) -> tuple[object, object]:
        store = MemoryStore()
        changes, _ = build("p", history)
        if unanswered:
            add_dangling_call(changes)
        await store.commit("p", changes)
        config = RuntimeConfig.model_validate(
            {
                "model_hint": "gpt-4o",
                "budget": {"max_input_tokens": budget + 100, "reserved_reply_tokens": 100},
                "prune": {"ttl_seconds": ttl},
            }
        )
        engine = ContextEngine(
            store, config=config, clock=SteppingClock(), id_generator=SequentialIdGenerator()
        )
        result = await engine.prepare_turn("p", "the newest question")
        return result.assembled_input, result.report.prune_decisions

    async def run() -> None:
        forever = 10**9
        try:
            walked = await prepared(None)
        except BudgetExceededError:
            return
        general = await prepared({"high": forever, "medium": forever, "low": forever})
        assert walked == general

    asyncio.run(run())
