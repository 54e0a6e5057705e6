"""Two evidences with the same text (two retrievers, sources or indexes returning one passage)
reach the model once: the oldest one kept goes whole (the one a prompt quoting the text names),
the others as fenced blocks of their own (id and source) pointing to it, and a pointer never
points at a block left out."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.pipeline._quotes import SAME_TEXT_POINTER
from ce.core.schema import (
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    Message,
    ModelInvocation,
    PrepareResult,
    Role,
    SourceKind,
    ToolCallRequest,
)
from ce.core.testing import deterministic_engine

PASSAGE = (
    "REFUND-POLICY-4411: annual plans can be refunded within 30 days of purchase; after that "
    "the refund is prorated by the months left, minus a processing fee of five percent. "
    "Monthly plans are not refunded, but they can be cancelled at any time before renewal."
)
_INVOCATION = ModelInvocation(provider="openai", model="gpt-4o")
_BLOCK = re.compile(r'<evidence id="([^"]+)"[^>]*>\n(.*?)\n</evidence>', re.S)


def _engine(budget: int = 4_000) -> ContextEngine:
    budget_config = BudgetConfig(max_input_tokens=budget + 1_024, reserved_reply_tokens=1_024)
    return deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=budget_config))


async def _hit(engine: ContextEngine, text: str, uri: str, score: float | None = None) -> str:
    evidence = await engine.ingest_evidence(
        "s1",
        text,
        EvidenceSource(kind=SourceKind.RAG, uri=uri),
        EvidenceType.RAG_DOC,
        metadata=None if score is None else {"score": score},
    )
    return evidence.evidence_id


def _blocks(result: PrepareResult) -> dict[str, str]:
    """The evidence blocks the model receives: id -> body."""
    system = result.assembled_input.parts[0].content
    return dict(_BLOCK.findall(system))


def _pointer(evidence_id: str) -> str:
    return SAME_TEXT_POINTER.format(evidence_id=evidence_id)


async def test_a_passage_two_sources_return_is_sent_once_and_both_are_cited() -> None:
    engine = _engine()
    billing = await _hit(engine, PASSAGE, "kb://billing/refunds")
    faq = await _hit(engine, PASSAGE + "\n", "kb://faq/annual-plans")  # whitespace aside
    other = await _hit(engine, "Support is open on weekdays from 9 to 17.", "kb://support/hours")
    result = await engine.prepare_turn("s1", "Can I get my money back on an annual plan?")
    system = result.assembled_input.parts[0].content
    assert system.count("REFUND-POLICY-4411") == 1
    blocks = _blocks(result)
    assert blocks[billing] == PASSAGE  # the older copy goes whole
    assert blocks[faq] == _pointer(billing)  # the other one points to it, with its own source
    assert 'uri="kb://billing/refunds"' in system and 'uri="kb://faq/annual-plans"' in system
    assert blocks[other] == "Support is open on weekdays from 9 to 17."
    # the report says why the block costs one line, and what its pointer saved
    decision = next(d for d in result.report.prune_decisions if d.block_id == f"ev:{faq}")
    assert decision.action == "kept"
    assert decision.reason == f"the same text as evidence {billing}, kept whole: a pointer here"
    assert decision.saved_tokens > 0
    whole = next(d for d in result.report.prune_decisions if d.block_id == f"ev:{billing}")
    assert decision.token_estimate + decision.saved_tokens >= whole.token_estimate - 20
    # the session keeps both evidences as they came
    doc = await engine.get_session("s1")
    assert doc is not None
    assert sum(e.content.strip() == PASSAGE for e in doc.evidences.values()) == 2


async def test_the_budget_counts_the_pointer_not_the_text() -> None:
    """With the same passage from two sources the input costs about one passage less than
    with two different passages of the same length."""

    async def used(second: str) -> int:
        engine = _engine()
        await _hit(engine, PASSAGE, "kb://billing/refunds")
        await _hit(engine, second, "kb://faq/annual-plans")
        result = await engine.prepare_turn("s1", "Can I get my money back?")
        return result.report.token_used

    different = PASSAGE.replace("4411", "5522").replace("annual", "yearly")
    assert await used(PASSAGE) < await used(different) - 20


async def test_a_short_text_costs_less_whole_than_its_pointer() -> None:
    engine = _engine()
    first = await _hit(engine, "Yes.", "kb://a")
    second = await _hit(engine, "Yes.", "kb://b")
    blocks = _blocks(await engine.prepare_turn("s1", "Is it open?"))
    assert blocks == {first: "Yes.", second: "Yes."}


@pytest.mark.parametrize("scores", [(0.9, 0.5), (0.5, 0.9)])
async def test_copies_in_two_priority_tiers_point_to_the_oldest(
    scores: tuple[float, float],
) -> None:
    """Evidence is walked tier by tier (by confidence), so the first copy met may be the
    newer one or the older one: either way the older one goes whole."""
    engine = _engine()
    older = await _hit(engine, PASSAGE, "kb://a", scores[0])
    newer = await _hit(engine, PASSAGE, "kb://b", scores[1])
    blocks = _blocks(await engine.prepare_turn("s1", "Refunds?"))
    assert blocks == {older: PASSAGE, newer: _pointer(older)}


@settings(max_examples=40, deadline=None)
@given(
    hits=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from([None, 0.9, 0.5, 0.2])),
        min_size=1,
        max_size=8,
    ),
    budget=st.integers(min_value=120, max_value=900),
)
async def test_a_pointer_always_points_at_a_text_sent_whole(
    hits: list[tuple[str, float | None]], budget: int
) -> None:
    """Whatever the budget leaves room for and however the copies spread over the priority
    tiers: every pointer names an evidence whose whole text is in the same input, no text
    goes whole twice, and the input stays within the budget."""
    passages = {k: f"{k.upper()}-{k * 3}: " + PASSAGE for k in "abc"}
    engine = _engine(budget)
    ids = {}
    for i, (key, score) in enumerate(hits):
        ids[await _hit(engine, passages[key], f"kb://{i}", score)] = key
    result = await engine.prepare_turn("s1", "Refunds?")
    assert result.report.token_used <= budget
    blocks = _blocks(result)
    pointer = re.compile(re.escape(_pointer("X")).replace("X", "(.+)"))
    whole = {i: body for i, body in blocks.items() if body == passages[ids[i]]}
    assert len(set(whole.values())) == len(whole)  # each text at most once whole
    for evidence_id, body in blocks.items():
        target = pointer.fullmatch(body)
        if target is None:  # the text itself, whole or shortened to fit
            assert body[:2] == passages[ids[evidence_id]][:2]
            continue
        assert target.group(1) in whole  # kept whole in this very input
        assert ids[target.group(1)] == ids[evidence_id]  # and it holds this block's text


async def test_three_copies_point_to_the_oldest_one_kept() -> None:
    """The walk meets the newest copy first; each older one takes the text over and the
    others are sent again pointing to it: no pointer leads to another pointer."""
    engine = _engine()
    first = await _hit(engine, PASSAGE, "kb://a")
    second = await _hit(engine, PASSAGE, "kb://b")
    third = await _hit(engine, PASSAGE, "kb://c")
    result = await engine.prepare_turn("s1", "Refunds?")
    assert _blocks(result) == {first: PASSAGE, second: _pointer(first), third: _pointer(first)}
    decisions = {d.block_id: d for d in result.report.prune_decisions}
    assert decisions[f"ev:{first}"].reason == "fits; the other blocks of its text point here"
    assert all(decisions[f"ev:{i}"].saved_tokens > 0 for i in (second, third))
    # the budget counts what is sent: one passage and two pointers, not three passages
    other = _engine()
    for n in range(3):
        await _hit(other, PASSAGE.replace("4411", f"441{n}"), f"kb://{n}")
    three = await other.prepare_turn("s1", "Refunds?")
    assert result.report.token_used < three.report.token_used - 60


async def test_a_retrieval_tools_two_copies_of_a_passage_go_once_in_its_result() -> None:
    """A retrieval tool asking two indexes that both hold a passage: the call's result
    carries its documents fenced (linked to the call), the passage whole once, the other
    source's copy as its own block pointing to it; a different document and a text shorter
    than a pointer go whole."""
    engine = _engine()
    await engine.prepare_turn("s1", "Can I get a refund on an annual plan?")
    call = ToolCallRequest(tool_call_id="c1", name="search", arguments={"q": "refund"})
    reply = Message(role=Role.ASSISTANT, content="", tool_calls=[call], invocation=_INVOCATION)
    await engine.commit_assistant_message("s1", reply)
    documents = [
        (PASSAGE, "kb://handbook/refunds"),
        (PASSAGE, "faq://returns"),
        ("Support: weekdays.", "kb://support"),
        ("Support: weekdays.", "faq://support"),
        ("Monthly plans renew on the first day of each month.", "kb://billing"),
    ]
    ids = [
        (
            await engine.ingest_evidence(
                "s1",
                text,
                EvidenceSource(kind=SourceKind.RAG, uri=uri),
                EvidenceType.RAG_DOC,
                links=EvidenceLinks(tool_call_id="c1"),
            )
        ).evidence_id
        for text, uri in documents
    ]
    result = Message(role=Role.TOOL, content="5 documents found.", tool_call_id="c1", name="search")
    prepared = await engine.prepare_call("s1", [result])
    (tool,) = [p for p in prepared.assembled_input.parts if p.role is Role.TOOL]
    assert tool.content.count("REFUND-POLICY-4411") == 1
    blocks = dict(_BLOCK.findall(tool.content))
    assert blocks[ids[0]] == PASSAGE
    assert blocks[ids[1]] == _pointer(ids[0])  # the other source, cited, pointing to it
    assert 'uri="faq://returns"' in tool.content
    assert blocks[ids[2]] == blocks[ids[3]] == "Support: weekdays."  # shorter than a pointer
    assert blocks[ids[4]] == "Monthly plans renew on the first day of each month."
    # the budget counts what is sent: the pointer, not the passage twice
    assert prepared.report.token_used <= prepared.report.token_budget
