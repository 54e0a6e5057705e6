"""A prompt that quoted retrieved documents holds pointers to them, and the documents go once,
fenced as evidence. The documents the call's own prompt points to are part of that prompt: they
are decided right after it, before the history and outside the evidence share of the budget.
A pointer never names a block the model does not get: one whose document is not in the input
says that a document was left out."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from test_same_text_evidence import _hit

from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.pipeline import LEFT_OUT_POINTER, document_pointer
from ce.core.schema import (
    Message,
    ModelInvocation,
    PrepareResult,
    Role,
)
from ce.core.testing import deterministic_engine

_INVOCATION = ModelInvocation(provider="openai", model="gpt-4o")
_POINTER = re.compile(re.escape(document_pointer("X")).replace("X", "([^\\]]+)"))


def _engine(budget: int) -> ContextEngine:
    budget_config = BudgetConfig(max_input_tokens=budget + 1_024, reserved_reply_tokens=1_024)
    return deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=budget_config))


def _document(key: str, sentences: int = 12) -> str:
    sentence = "{}-{}: the {} plan covers item {} for thirty days."
    return " ".join(sentence.format(key.upper(), i, key, i) for i in range(sentences))


def _prompt(documents: list[str]) -> str:
    return "Answer from the context.\n---\n" + "\n\n".join(documents) + "\n---\nBe brief."


def _fenced(result: PrepareResult) -> set[str]:
    system = result.assembled_input.parts[0].content
    return set(re.findall(r'<evidence id="([^"]+)"', system))


def _pointers(result: PrepareResult) -> list[str]:
    return [
        evidence_id
        for part in result.assembled_input.parts
        for evidence_id in _POINTER.findall(part.content or "")
    ]


async def _history(engine: ContextEngine, turns: int) -> None:
    for i in range(turns):
        await engine.prepare_turn("s1", f"Question {i} about my order, with some detail {i}?")
        await engine.commit_assistant_message(
            "s1",
            Message(
                role=Role.ASSISTANT,
                content=f"Answer {i}: your order ships in {i + 2} days. " * 4,
                invocation=_INVOCATION,
            ),
        )


async def test_the_prompts_documents_come_before_the_history_and_other_evidence() -> None:
    """A session with a history and a newer, more confident document the prompt does not
    quote: the two documents the prompt quotes are kept whole, the prompt pointing at each,
    though together they take more than the evidence share; the rest of the budget goes to
    the history and the other document as before."""
    engine = _engine(1_300)
    await _history(engine, 6)
    quoted = [_document("gold"), _document("silver")]
    ids = [await _hit(engine, text, f"kb://{i}") for i, text in enumerate(quoted)]
    other = await _hit(engine, _document("bronze"), "kb://other", score=0.9)
    history = [
        Message(role=Role.SYSTEM, content=_prompt(quoted)),
        Message(role=Role.USER, content="Which plan covers item 3?"),
    ]
    result = await engine.prepare_call("s1", history)
    system = result.assembled_input.parts[0].content
    assert set(ids) <= _fenced(result)
    assert all(system.count(text) == 1 for text in quoted)
    assert _pointers(result) == ids and LEFT_OUT_POINTER not in system
    decisions = {d.block_id: d for d in result.report.prune_decisions}
    assert all("the prompt points to it" in decisions[f"ev:{i}"].reason for i in ids)
    assert "the prompt points to it" not in decisions[f"ev:{other}"].reason
    assert any(p.role is Role.ASSISTANT for p in result.assembled_input.parts)  # history too
    assert result.report.token_used <= result.report.token_budget


async def test_documents_that_do_not_fit_are_said_left_out_where_the_prompt_held_them() -> None:
    """Room for the first document only: it goes whole, the second is degraded if it fits so,
    and the third, with no room at any level, is reported dropped and its place in the
    prompt says a document was left out."""
    engine = _engine(450)
    quoted = [_document("gold", 14), _document("silver", 14), _document("tin", 14)]
    ids = [await _hit(engine, text, f"kb://{i}") for i, text in enumerate(quoted)]
    history = [
        Message(role=Role.SYSTEM, content=_prompt(quoted)),
        Message(role=Role.USER, content="Which plan covers item 3?"),
    ]
    result = await engine.prepare_call("s1", history)
    decisions = {d.block_id: d for d in result.report.prune_decisions}
    actions = [decisions[f"ev:{i}"].action for i in ids]
    assert actions == ["kept", "degraded", "dropped"]
    sent = [i for i, action in zip(ids, actions, strict=True) if action != "dropped"]
    assert _pointers(result) == sent and sent == sorted(_fenced(result), key=ids.index)
    system = result.assembled_input.parts[0].content
    assert system.count(LEFT_OUT_POINTER) == len(ids) - len(sent)
    assert result.report.token_used <= result.report.token_budget


async def test_an_earlier_prompts_pointer_to_a_document_left_out_says_so() -> None:
    """Turn 1's prompt quoted a document (stored with a pointer to it). On turn 2 newer,
    more confident documents take the evidence share: turn 1's document is left out, and
    turn 1's prompt, still in the history, says so instead of naming a block not sent."""
    engine = _engine(900)
    first = _document("gold")
    old = await _hit(engine, first, "kb://gold")
    await engine.prepare_turn("s1", f"Context:\n{first}\nQuestion: what does gold cover?")
    await engine.commit_assistant_message(
        "s1", Message(role=Role.ASSISTANT, content="Items 0-11.", invocation=_INVOCATION)
    )
    for key in ("silver", "tin"):
        await _hit(engine, _document(key, 16), f"kb://{key}", score=0.95)
    result = await engine.prepare_turn("s1", "And what does tin cover?")
    decisions = {d.block_id: d for d in result.report.prune_decisions}
    assert decisions[f"ev:{old}"].action == "dropped"
    (earlier,) = [p for p in result.assembled_input.parts if "what does gold cover" in p.content]
    assert LEFT_OUT_POINTER in earlier.content and old not in earlier.content
    assert result.report.token_used <= result.report.token_budget


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=4),
    turns=st.integers(min_value=0, max_value=4),
    others=st.integers(min_value=0, max_value=3),
    budget=st.integers(min_value=150, max_value=2_000),
)
async def test_a_document_pointer_always_names_a_block_the_model_gets(
    sizes: list[int], turns: int, others: int, budget: int
) -> None:
    """Whatever the budget, the history and the other evidence: every pointer in the input
    names an evidence fenced in that same input, each document the prompt quoted is either
    fenced or said left out there, and the input stays within the budget."""
    engine = _engine(budget)
    await _history(engine, turns)
    for i in range(others):
        await _hit(engine, _document(f"other{i}", 8), f"kb://other{i}", score=0.9)
    quoted = [_document(f"doc{i}", size) for i, size in enumerate(sizes)]
    for i, text in enumerate(quoted):
        await _hit(engine, text, f"kb://{i}")
    history = [
        Message(role=Role.SYSTEM, content=_prompt(quoted)),
        Message(role=Role.USER, content="Which plan covers item 3?"),
    ]
    try:
        result = await engine.prepare_call("s1", history)
    except Exception as exc:  # the prompt alone over the budget: a typed error, nothing sent
        assert type(exc).__name__ == "BudgetExceededError"
        return
    assert result.report.token_used <= result.report.token_budget
    fenced = _fenced(result)
    pointers = _pointers(result)
    assert set(pointers) <= fenced
    system = result.assembled_input.parts[0].content
    prompt = system.split("\n\n## Evidence")[0]
    assert len(_POINTER.findall(prompt)) + prompt.count(LEFT_OUT_POINTER) == len(
        {text for text in quoted if len(text) >= 16}
    )
