"""The record-based tool flow renders: an assistant tool call whose run was recorded with
``record_tool_call`` and a ``tool_result`` evidence linked by ``tool_call_id`` (no tool
message) reaches the model as the proper pair, its result fenced with its evidence id; a call
with neither a result message nor linked result evidence stays out, reported unanswered."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ce.core import (
    BudgetConfig,
    ContextEngine,
    Evidence,
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
    ToolCallStatus,
    to_openai_messages,
)
from ce.core.schema import ProviderKind, ToolProvider
from ce.core.testing import deterministic_engine
from ce.core.testing.assertions import fenced, unfenced

INV = ModelInvocation(provider="openai", model="gpt-4o")


def _call(call_id: str, city: str) -> ToolCallRequest:
    return ToolCallRequest(
        tool_call_id=call_id, name="weather", raw_arguments=f'{{"city": "{city}"}}'
    )


async def _record_run(
    engine: ContextEngine, call_id: str, output: str, args: dict[str, Any] | None = None
) -> str:
    """What an integration records of one tool run: its output as ``tool_result`` evidence
    linked to ``call_id``, then the run itself; the evidence's id."""
    evidence = await engine.ingest_evidence(
        "s",
        output,
        EvidenceSource(kind=SourceKind.TOOL, name="weather"),
        EvidenceType.TOOL_RESULT,
        links=EvidenceLinks(tool_call_id=call_id),
    )
    await engine.record_tool_call(
        "s",
        ToolCall(
            tool_call_id=call_id,
            tool="weather",
            provider=ToolProvider(kind=ProviderKind.OTHER),
            status=ToolCallStatus.SUCCESS,
            args_digest=args or {},
        ),
        result_evidence_ids=[evidence.evidence_id],
    )
    return evidence.evidence_id


async def _retrieving_call(engine: ContextEngine, doc: str) -> Evidence:
    """A question, the model's call ``c1`` of a notes tool, and the document that call
    retrieved (linked to it); the document's evidence."""
    await engine.prepare_turn("s", "When is the meeting?")
    call = ToolCallRequest(tool_call_id="c1", name="notes", raw_arguments='{"q": "meeting"}')
    await engine.commit_assistant_message(
        "s", Message(role=Role.ASSISTANT, content="", tool_calls=[call], invocation=INV)
    )
    return await engine.ingest_evidence(
        "s",
        doc,
        EvidenceSource(kind=SourceKind.RAG, uri="notes://1"),
        EvidenceType.RAG_DOC,
        links=EvidenceLinks(tool_call_id="c1"),
    )


async def test_a_recorded_tool_run_renders_as_the_call_and_its_fenced_result() -> None:
    engine = deterministic_engine()
    await engine.prepare_turn("s", "Weather in Oslo and Rome?")
    await engine.commit_assistant_message(
        "s",
        Message(
            role=Role.ASSISTANT,
            content="",
            tool_calls=[_call("c1", "Oslo"), _call("c2", "Rome")],
            invocation=INV,
        ),
    )
    evidence_id = await _record_run(engine, "c1", "Oslo: sunny, 18C")
    result = await engine.prepare_turn("s", "And tomorrow?")
    sent = to_openai_messages(result.assembled_input.parts)
    roles = [m["role"] for m in sent]
    assert roles == ["user", "assistant", "tool", "user"]
    assistant, tool = sent[1], sent[2]
    # c2 has neither a result message nor result evidence: unanswered, left out
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1"]
    assert tool["tool_call_id"] == "c1"
    assert "Oslo: sunny, 18C" in tool["content"]
    assert f'id="{evidence_id}"' in tool["content"]
    decisions = {d.block_id: d for d in result.report.prune_decisions}
    assert any(d.action == "kept" for d in decisions.values())


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=120), min_size=2, max_size=8),
    budget=st.integers(min_value=350, max_value=1400),
)
def test_the_pruned_window_starts_at_a_turn_boundary(sizes: list[int], budget: int) -> None:
    """Whatever the budget drops, the kept history never begins with an assistant answer
    whose user question was dropped."""
    import asyncio

    config = RuntimeConfig(
        model_hint="gpt-4o",
        budget=BudgetConfig(max_input_tokens=budget, reserved_reply_tokens=100),
    )
    engine = deterministic_engine(config)

    async def run() -> list[dict[str, Any]]:
        await engine.set_system_instruction("s", "Be brief.")
        for turn, size in enumerate(sizes):
            await engine.prepare_turn("s", f"question {turn} " + "word " * size)
            await engine.commit_assistant_message(
                "s",
                Message(
                    role=Role.ASSISTANT, content=f"answer {turn} " + "tok " * size, invocation=INV
                ),
            )
        result = await engine.prepare_turn("s", "last question")
        return to_openai_messages(result.assembled_input.parts)

    sent = asyncio.run(run())
    history = [m for m in sent if m["role"] != "system"]
    assert history[0]["role"] == "user", [m["content"][:20] for m in history]
    assert history[-1]["content"] == "last question"


async def test_within_its_turn_a_recorded_run_waits_for_the_frameworks_tool_message() -> None:
    """An integration records a tool run (result evidence) before the framework's tool
    message arrives: within that turn the call is not rendered from the evidence (the
    framework would get back a result text it never produced); its message renders it."""
    engine = deterministic_engine()
    await engine.prepare_turn("s", "Weather in Oslo?")
    await engine.commit_assistant_message(
        "s",
        Message(role=Role.ASSISTANT, content="", tool_calls=[_call("c1", "Oslo")], invocation=INV),
    )
    await engine.ingest_evidence(
        "s",
        "Oslo: sunny, 18C",
        EvidenceSource(kind=SourceKind.TOOL, name="weather"),
        EvidenceType.TOOL_RESULT,
        links=EvidenceLinks(tool_call_id="c1"),
    )
    during = await engine.prepare_call("s", [])
    assert [p.role for p in during.assembled_input.parts] == [Role.USER]
    tool = Message(role=Role.TOOL, content="Oslo: sunny", tool_call_id="c1", name="weather")
    after = await engine.prepare_call("s", [tool])
    sent = to_openai_messages(after.assembled_input.parts)
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert unfenced(sent[-1]["content"]) == "Oslo: sunny"  # the framework's own result text
    # fenced with the id of the run's recorded result
    evidence_id = next(iter((await engine.get_session("s")).evidences))
    assert fenced(sent[-1]["content"]) == {
        "id": evidence_id,
        "tool": "weather",
        "status": "success",
    }


async def test_a_run_keeps_its_own_tool_chain_when_other_runs_wrote_to_the_session() -> None:
    """Runs that share a session (workers, or agents, each with its own question): other
    runs asked and were answered after this run's tool call, yet its next model call gets its
    own question, call and result, as the session's newest question would, and the report
    accounts for every block once."""

    async def next_call(budget: int) -> list[Any]:
        engine = deterministic_engine(
            RuntimeConfig(
                model_hint="gpt-4o",
                budget=BudgetConfig(max_input_tokens=budget, reserved_reply_tokens=60),
            )
        )
        mine = Message(role=Role.USER, content="Weather in Oslo?")
        await engine.prepare_call("s", [mine])
        call = Message(
            role=Role.ASSISTANT, content="", tool_calls=[_call("c-mine", "Oslo")], invocation=INV
        )
        await engine.commit_assistant_message("s", call)  # the model asked for the tool
        for n in range(3):  # meanwhile other runs ask, and two get their answers
            await engine.prepare_call("s", [Message(role=Role.USER, content=f"Other {n}?")])
            if n < 2:
                answer = f"answer {n}: " + "beta gamma delta " * 20
                await engine.commit_assistant_message(
                    "s", Message(role=Role.ASSISTANT, content=answer, invocation=INV)
                )
        result = Message(
            role=Role.TOOL, content="Oslo: sunny", tool_call_id="c-mine", name="weather"
        )
        prepared = await engine.prepare_call("s", [mine, call, result])
        decisions = prepared.report.prune_decisions
        assert len({d.block_id for d in decisions}) == len(decisions)
        groups = 3 + 2 + 2  # the other questions, two answers, this run's question and call
        assert sum(d.block_count for d in decisions) == groups
        return to_openai_messages(prepared.assembled_input.parts)

    for budget in (160, 260):  # little room beside the newest question, or some
        sent = await next_call(budget)
        assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ["c-mine"]
        asked = [m["content"] for m in sent if m["role"] == "user"]
        assert "Weather in Oslo?" in asked and asked[-1] == "Other 2?"


async def test_a_tool_that_answers_from_what_it_retrieved_sends_its_own_answer() -> None:
    """A tool whose run retrieved documents: a retriever's output (the documents alone)
    goes as the documents fenced with their evidence ids; a tool that answers from them (a
    query engine) goes as its own answer followed by the documents, and one that quotes them
    within text of its own keeps that text, each quoted document fenced in place."""
    doc = "Shared notes: the meeting moved to Thursday at ten."
    outputs = {
        "retriever": doc,
        "query_engine": "ANSWER: Thursday 10:00.",
        "with_sources": f"ANSWER: Thursday 10:00. Sources: {doc}",
    }
    for kind, output in outputs.items():
        engine = deterministic_engine()
        retrieved = await _retrieving_call(engine, doc)
        tool = Message(role=Role.TOOL, content=output, tool_call_id="c1", name="notes")
        result = await engine.prepare_call("s", [tool])
        sent = to_openai_messages(result.assembled_input.parts)[-1]["content"]
        fence = f'<evidence id="{retrieved.evidence_id}" type="rag_doc"'
        if kind == "retriever":
            assert sent.startswith(fence) and doc in sent
        elif kind == "query_engine":  # its answer, then what it was made from
            answer, documents = sent.split("\n\n", 1)
            assert unfenced(answer) == "ANSWER: Thursday 10:00."
            assert documents.startswith(fence) and sent.count(doc) == 1
        else:
            assert sent.startswith("ANSWER: Thursday 10:00. Sources: " + fence)
            assert sent.count(doc) == 1


async def test_a_run_reported_before_its_reply_reusing_an_answered_id_keeps_its_result() -> None:
    """A framework that reports each tool run before it hands over the reply that asked for
    it (CrewAI), with a model that names its call ``call_0`` in every round: the second run
    and its result evidence go to the id the second call is stored under, ``call_0~2``, not to
    the first call's, and each tool message the model gets back cites its own evidence."""
    engine = deterministic_engine()
    question = Message(role=Role.USER, content="Weather in Paris, then Rome?")
    history: list[Message] = [question]
    await engine.prepare_call("s", history)
    evidence_ids = []
    for city in ("Paris", "Rome"):
        evidence_ids.append(await _record_run(engine, "call_0", f"sunny in {city}", {"city": city}))
        history += [
            Message(
                role=Role.ASSISTANT, content="", tool_calls=[_call("call_0", city)], invocation=INV
            ),
            Message(role=Role.TOOL, content=f"sunny in {city}", tool_call_id="call_0"),
        ]
        prepared = await engine.prepare_call("s", history)
    doc = await engine.get_session("s")
    assert doc is not None
    runs = {r.tool_call_id: r for r in doc.session.tool_state.tool_calls}
    assert {k: (r.args_digest, r.result_evidence_ids) for k, r in runs.items()} == {
        "call_0": ({"city": "Paris"}, [evidence_ids[0]]),
        "call_0~2": ({"city": "Rome"}, [evidence_ids[1]]),
    }
    assert doc.evidences[evidence_ids[1]].links.tool_call_id == "call_0~2"
    sent = to_openai_messages(prepared.assembled_input.parts)
    tools = [m for m in sent if m["role"] == "tool"]
    assert [t["tool_call_id"] for t in tools] == ["call_0", "call_0~2"]
    for tool, evidence_id, city in zip(tools, evidence_ids, ("Paris", "Rome"), strict=True):
        assert f'id="{evidence_id}"' in tool["content"] and f"sunny in {city}" in tool["content"]


async def test_a_run_recorded_without_a_tool_message_sends_its_answer_and_its_documents() -> None:
    """A tool run recorded from the tool's side only (no tool message: a tool that returns
    its answer to the user directly, an agent that does not reflect on tool use): an answer
    made from the documents the call retrieved goes as the answer, then the documents, each
    once; a retriever's output (the documents themselves) goes as the documents alone."""
    doc = "Shared notes: the meeting moved to Thursday at ten."
    for kind, output in {"retriever": doc, "query_engine": "ANSWER: Thursday 10:00."}.items():
        engine = deterministic_engine()
        retrieved = await _retrieving_call(engine, doc)
        await _record_run(engine, "c1", output)
        result = await engine.prepare_turn("s", "And where?")
        sent = to_openai_messages(result.assembled_input.parts)
        assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user"]
        content = sent[2]["content"]
        assert content.count(doc) == 1
        fence = f'<evidence id="{retrieved.evidence_id}" type="rag_doc"'
        if kind == "retriever":
            assert content.startswith(fence)
        else:  # its answer, then what it was made from
            answer, documents = content.split("\n\n", 1)
            assert "ANSWER: Thursday 10:00." in answer and 'type="tool_result"' in answer
            assert documents.startswith(fence)
