"""The part of the store contract about reading a session's newest records
(:class:`~ce.core.stores.SliceStore`)."""

from __future__ import annotations

import json

import pytest

from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.schema import (
    BlockType,
    ContextBlock,
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    ModelInvocation,
    Priority,
    ProviderKind,
    Ref,
    Role,
    SessionDocument,
    SourceKind,
    ToolCall,
    ToolCallRequest,
    ToolProvider,
)
from ce.core.schema._document import evidence_link, may_state_facts
from ce.core.state import AgentState, ModelOutput, ToolResult
from ce.core.stores.base import SessionChanges, SessionSlice, SliceStore, Store

__all__ = ["TailContract"]

_INV = ModelInvocation(provider="openai", model="gpt-4o")
_SIZES = [(1, 0), (2, 1), (3, 4), (5, 2), (9, 7), (100, 100)]


async def _session(store: Store) -> SessionDocument:
    """A session of several commits: a system message, then turns with tool calls and their
    records, retrieved documents linked to calls, JSON facts, a summary of one message, a
    second system message, a block that pins the first evidence; returns what is stored."""
    state = AgentState("tail", clock=SteppingClock(), id_generator=SequentialIdGenerator("t"))
    state.set_system_instruction("first instruction")
    await store.commit("tail", state.take_changes())
    for turn in range(8):
        state.append_model_input(f"question {turn}")
        call = f"call-{turn}"
        if turn % 2 == 0:
            request = ToolCallRequest(tool_call_id=call, name="lookup", raw_arguments="{}")
            state.append_model_output(ModelOutput(tool_calls=[request], invocation=_INV))
            state.append_tool_results([ToolResult(tool_call_id=call, name="lookup", content="r")])
            state.record_tool_call(
                ToolCall(
                    tool_call_id=call, tool="lookup", provider=ToolProvider(kind=ProviderKind.OTHER)
                )
            )
            state.add_evidence(
                Evidence(
                    evidence_id=f"linked-{turn}",
                    type=EvidenceType.TOOL_RESULT,
                    source=EvidenceSource(kind=SourceKind.TOOL),
                    content=json.dumps({"order_id": "A-1", "status": str(turn)}),
                    links=EvidenceLinks(tool_call_id=call),
                )
            )
        state.add_evidence(
            Evidence(
                evidence_id=f"doc-{turn}",
                type=EvidenceType.RAG_DOC,
                source=EvidenceSource(kind=SourceKind.RAG),
                content=f"document {turn}",
                metadata={"entity": "order_id=A-1", "field": "status"} if turn == 1 else {},
            )
        )
        answer = state.append_model_output(ModelOutput(text=f"answer {turn}", invocation=_INV))
        if turn % 3 == 0:
            state.add_evidence(
                Evidence(
                    evidence_id=f"gist-{turn}",
                    type=EvidenceType.LLM_OUTPUT,
                    source=EvidenceSource(kind=SourceKind.LLM),
                    content=f"gist {turn}",
                    metadata={"summary_of": answer.message_id},
                )
            )
        if turn == 0:
            state.put_context_block(
                ContextBlock(
                    block_id="pinned",
                    block_type=BlockType.MEMORY,
                    priority=Priority.HIGH,
                    refs=[Ref(evidence_id="doc-0")],
                )
            )
        if turn == 4:
            state.set_system_instruction("second instruction")
        await store.commit("tail", state.take_changes())
    doc = await store.get_session("tail")
    assert doc is not None
    return doc


def _check(part: SessionSlice, doc: SessionDocument, messages: int, evidences: int) -> None:
    session = doc.session
    held = part.changes
    total = len(session.messages)
    count = len(held.messages)
    assert count >= min(messages, total)
    assert held.messages == session.messages[total - count :]
    assert part.older_messages == total - count
    earlier = [m for m in session.messages[: total - count] if m.role is Role.SYSTEM]
    assert part.instruction == (earlier[-1] if earlier else None)
    assert part.older_system == len(earlier)

    stored = list(doc.evidences.values())
    ids = [e.evidence_id for e in held.evidences]
    assert ids == [e.evidence_id for e in stored if e.evidence_id in set(ids)]  # stored order
    assert held.evidences == [doc.evidences[i] for i in ids]
    assert part.older_evidences == len(stored) - len(ids)
    run = min(evidences, len(stored))
    newest = [e.evidence_id for e in stored[len(stored) - run :]]
    assert set(newest) <= set(ids)
    declared = {c.tool_call_id for m in held.messages for c in m.tool_calls or ()}
    own = declared | {m.message_id for m in held.messages if m.message_id}
    belonging = {e.evidence_id for e in stored if evidence_link(e) in own}
    assert belonging <= set(ids)
    assert {r.evidence_id for b in held.context_blocks for r in b.refs} <= set(ids)

    assert held.tool_calls == [
        c for c in session.tool_state.tool_calls if c.tool_call_id in declared
    ]
    assert held.context_blocks == doc.context_blocks
    assert held.tasks == session.task_state.todo_list.tasks
    assert (held.summary, held.run, held.meta) == (session.summary, session.run, doc.meta)
    assert held.model_usage == [] and held.turns == []

    before_run = stored[: len(stored) - run]
    sources = [e.evidence_id for e in part.fact_sources]
    assert sources == [e.evidence_id for e in before_run if e.evidence_id in set(sources)]
    assert all(may_state_facts(e) for e in part.fact_sources)
    facts = {e.evidence_id for e in stored if may_state_facts(e)}
    assert facts <= set(sources) | set(ids)


class TailContract:
    """Mixed into :class:`~ce.core.testing.StoreContract` (see there): a store that reads a
    session's newest records (a :class:`~ce.core.stores.SliceStore`) keeps its rules."""

    async def test_read_tail_holds_the_newest_records_and_what_goes_with_them(
        self, store: Store
    ) -> None:
        if not isinstance(store, SliceStore):
            pytest.skip("the store does not read a session's newest records")
        doc = await _session(store)
        for messages, evidences in _SIZES:
            part = await store.read_tail("tail", messages=messages, evidences=evidences)
            assert part is not None
            assert part.version == await store.get_version("tail")
            _check(part, doc, messages, evidences)

    async def test_read_tail_of_a_missing_session_or_of_no_size(self, store: Store) -> None:
        if not isinstance(store, SliceStore):
            pytest.skip("the store does not read a session's newest records")
        assert await store.read_tail("absent", messages=5, evidences=5) is None
        await _session(store)
        with pytest.raises(ValueError):
            await store.read_tail("tail", messages=0, evidences=5)
        with pytest.raises(ValueError):
            await store.read_tail("tail", messages=5, evidences=-1)

    async def test_read_messages_reads_the_messages_with_those_ids(self, store: Store) -> None:
        if not isinstance(store, SliceStore):
            pytest.skip("the store does not read a session's newest records")
        assert await store.read_messages("absent", ["x"]) == []
        doc = await _session(store)
        stored = doc.session.messages
        wanted = [stored[-1].message_id, "no such id", stored[0].message_id, stored[3].message_id]
        got = await store.read_messages("tail", [i for i in wanted if i is not None])
        assert got == [stored[0], stored[3], stored[-1]]  # stored order, unknown ids left out
        assert await store.read_messages("tail", []) == []
        assert await store.read_messages("tail", ["a\x00b"]) == []  # no stored id holds U+0000

    async def test_token_counts_come_back_with_their_records(self, store: Store) -> None:
        """A store that keeps token counts (``keeps_token_counts``) gives each back with its
        message or evidence from ``read_since`` and ``read_tail``; one that does not drops
        them, and nothing else of the commit."""
        doc = await _session(store)
        message = doc.session.messages[-1].model_copy(update={"message_id": "counted-m"})
        evidence = next(iter(doc.evidences.values())).model_copy(
            update={"evidence_id": "counted-e", "content": "counted"}
        )
        counts = {
            "counted-m": json.dumps({"tiktoken:o200k_base": {"ab" * 10: 7}}),
            "counted-e": json.dumps({"tiktoken:o200k_base": {"cd" * 10: 3}}),
        }
        read = await store.read_since("tail")
        assert read is not None
        changes = SessionChanges(messages=[message], evidences=[evidence], token_counts=counts)
        await store.commit("tail", changes)
        keeps = getattr(store, "keeps_token_counts", False)
        update = await store.read_since("tail", read.version, read.epoch)
        assert update is not None  # what was added (or, for some stores, the whole session)
        assert update.changes.messages[-1].message_id == "counted-m"
        assert update.changes.evidences[-1].evidence_id == "counted-e"
        assert update.changes.token_counts == (counts if keeps else {})
        whole = await store.read_since("tail")
        assert whole is not None and whole.changes.token_counts == (counts if keeps else {})
        if isinstance(store, SliceStore):
            part = await store.read_tail("tail", messages=1, evidences=1)
            assert part is not None
            assert part.changes.token_counts == (counts if keeps else {})

    async def test_read_evidences_finds_the_evidences_of_those_dedup_keys(
        self, store: Store
    ) -> None:
        if not isinstance(store, SliceStore):
            pytest.skip("the store does not read a session's newest records")
        assert await store.read_evidences("absent", ["k"]) == []
        await _session(store)
        keyed = [
            Evidence(
                evidence_id=f"keyed-{i}",
                type=EvidenceType.LLM_OUTPUT,
                source=EvidenceSource(kind=SourceKind.LLM, name="model"),
                content=f"output {i}",
                metadata={"dedup_key": key},
            )
            for i, key in enumerate(["llm_output|b", "llm_output|a", "llm_output|c"])
        ]
        await store.commit("tail", SessionChanges(evidences=keyed[:2]))
        await store.commit("tail", SessionChanges(evidences=keyed[2:]))
        found = await store.read_evidences("tail", ["llm_output|c", "nope", "llm_output|b"])
        assert found == [keyed[0], keyed[2]]  # stored order, unknown keys left out
        assert await store.read_evidences("tail", []) == []
        assert await store.read_evidences("tail", ["a\x00b"]) == []
