"""The report is true, recounted from what the model receives: every block reported kept or
degraded is in the assembled input, and every stored history message absent from it is covered
by a dropped (or degraded) decision with a reason, over random histories with both tool flows
(tool messages; ``record_tool_call`` with linked result evidence) and unanswered calls."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ce.core import (
    BudgetConfig,
    BudgetExceededError,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    Message,
    ModelInvocation,
    Role,
    RuntimeConfig,
    SourceKind,
    ToolCall,
    ToolCallRequest,
    to_openai_messages,
)
from ce.core.schema import ProviderKind, ToolProvider
from ce.core.testing import deterministic_engine

INV = ModelInvocation(provider="openai", model="gpt-4o")

# a turn: the question's size, then what the assistant did: answer, or call tools whose
# results arrive as tool messages, as recorded runs with result evidence, or never
_TURN = st.tuples(
    st.integers(min_value=1, max_value=60),
    st.sampled_from(["answer", "messages", "records", "unanswered", "mixed"]),
    st.integers(min_value=1, max_value=3),
)


async def _build(turns: list[tuple[int, str, int]], budget: int) -> tuple[Any, Any]:
    engine = deterministic_engine(
        RuntimeConfig(
            model_hint="gpt-4o",
            budget=BudgetConfig(max_input_tokens=budget, reserved_reply_tokens=100),
        )
    )
    await engine.set_system_instruction("s", "Be brief.")
    for t, (size, flow, calls) in enumerate(turns):
        await engine.prepare_turn("s", f"U{t}Q " + "word " * size)
        if flow == "answer":
            await engine.commit_assistant_message(
                "s", Message(role=Role.ASSISTANT, content=f"A{t}A " + "tok " * size, invocation=INV)
            )
            continue
        ids = [f"C{t}x{j}" for j in range(calls)]
        requests = [
            ToolCallRequest(tool_call_id=i, name="lookup", raw_arguments='{"q": 1}') for i in ids
        ]
        await engine.commit_assistant_message(
            "s", Message(role=Role.ASSISTANT, content="", tool_calls=requests, invocation=INV)
        )
        for j, call_id in enumerate(ids):
            how = flow if flow != "mixed" else ("messages", "records", "unanswered")[j % 3]
            body = f"R{call_id}R " + "res " * size
            if how == "messages":
                tool = Message(role=Role.TOOL, content=body, tool_call_id=call_id, name="lookup")
                await engine.prepare_call("s", [tool])
            elif how == "records":
                evidence = await engine.ingest_evidence(
                    "s",
                    body,
                    EvidenceSource(kind=SourceKind.TOOL, name="lookup"),
                    EvidenceType.TOOL_RESULT,
                    links=EvidenceLinks(tool_call_id=call_id),
                )
                await engine.record_tool_call(
                    "s",
                    ToolCall(
                        tool_call_id=call_id,
                        tool="lookup",
                        provider=ToolProvider(kind=ProviderKind.OTHER),
                    ),
                    result_evidence_ids=[evidence.evidence_id],
                )
    result = await engine.prepare_turn("s", "LASTQ now")
    doc = await engine.get_session("s")
    return result, doc


def _covered(decisions: list[Any], groups: list[str]) -> dict[str, Any]:
    """Each conversation block id -> the decision that covers it (its own or a range)."""
    out: dict[str, Any] = {}
    position = {g: i for i, g in enumerate(groups)}
    for decision in decisions:
        if ".." in decision.block_id:
            first, last = decision.block_id.split("..")
            for g in groups[position[first] : position[last] + 1]:
                out[g] = decision
        elif decision.block_id in position:
            out[decision.block_id] = decision
    return out


@settings(max_examples=60, deadline=None)
@given(turns=st.lists(_TURN, min_size=1, max_size=7), budget=st.integers(300, 2500))
def test_the_report_accounts_for_what_the_model_receives(
    turns: list[tuple[int, str, int]], budget: int
) -> None:
    try:
        result, doc = asyncio.run(_build(turns, budget))
    except BudgetExceededError:
        return  # the must blocks alone do not fit: nothing assembled to check
    sent = json.dumps(to_openai_messages(result.assembled_input.parts))
    messages = [m for m in doc.session.messages if m.role is not Role.SYSTEM]
    heads = [m for m in messages if m.role is not Role.TOOL]
    groups = [f"msg:{m.message_id}" for m in heads]
    decisions = _covered(result.report.prune_decisions, groups)

    def marker(message: Message) -> str:
        if message.role is Role.TOOL:
            return f"R{message.tool_call_id}R"
        if message.tool_calls:
            return message.tool_calls[0].tool_call_id
        return message.content.split(" ", 1)[0]

    answered = {m.tool_call_id for m in messages if m.role is Role.TOOL}
    answered |= {e.links.tool_call_id for e in doc.evidences.values() if e.links.tool_call_id}
    for head, group in zip(heads, groups, strict=True):
        decision = decisions.get(group)
        assert decision is not None, f"no decision covers {group}"
        assert decision.reason, decision
        calls = [c.tool_call_id for c in head.tool_calls or ()]
        present = any(f'"{c}"' in sent for c in calls) if calls else marker(head) in sent
        if decision.action in ("kept", "degraded"):
            assert present, f"{group} reported {decision.action} but not sent"
            for call_id in calls:  # an answered call goes with its result, else not at all
                if call_id in answered:
                    assert f"R{call_id}R" in sent
                else:
                    assert f'"{call_id}"' not in sent
        else:
            assert not present, f"{group} reported dropped but sent"
            if calls and not any(c in answered for c in calls):
                assert (
                    "unanswered" in decision.reason
                    or "older" in decision.reason
                    or ("fit" in decision.reason or "boundary" in decision.reason)
                )
    assert "LASTQ now" in sent
