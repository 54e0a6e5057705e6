"""An earlier answer that the newest user message quotes in full reaches the model once: the
history's copy becomes a pointer to the prompt while that prompt is the newest user message
(a crew's task handed an earlier task's output, "translate this: ...")."""

from __future__ import annotations

from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.formats import to_openai_messages
from ce.core.pipeline._quotes import QUOTED_ANSWER, QUOTED_IN_PROMPT, QUOTED_REASON
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.schema import Message, ModelInvocation, Role
from ce.core.stores import MemoryStore

INV = ModelInvocation(provider="openai", model="gpt-4o")
FINDING = (
    "FINDING-7731: Paris is sunny today with 24 degrees, light wind from the west and no "
    "rain expected before the weekend."
)


def _engine(budget: int = 8_000) -> ContextEngine:
    return ContextEngine(
        MemoryStore(),
        config=RuntimeConfig(
            model_hint="gpt-4o",
            budget=BudgetConfig(max_input_tokens=budget + 1_024, reserved_reply_tokens=1_024),
        ),
        clock=SteppingClock(),
        id_generator=SequentialIdGenerator("id"),
    )


def _answer(text: str) -> Message:
    return Message(role=Role.ASSISTANT, content=text, invocation=INV)


def _wire(messages: list[dict[str, object]]) -> str:
    return "\n".join(str(m.get("content")) for m in messages)


async def test_an_answer_the_newest_prompt_quotes_is_sent_once_then_whole_again() -> None:
    engine = _engine()
    await engine.prepare_turn("s1", "What is the weather in Paris?")
    await engine.commit_assistant_message("s1", _answer(FINDING))
    prompt = f"Write one line about it.\n\nThis is the context you're working with:\n{FINDING}"
    result = await engine.prepare_turn("s1", prompt)
    sent = to_openai_messages(result.assembled_input.parts)
    assert _wire(sent).count(FINDING) == 1
    assert sent[-1] == {"role": "user", "content": prompt}  # the prompt goes whole
    assert {"role": "assistant", "content": QUOTED_ANSWER} in sent  # the answer points to it
    assert "What is the weather in Paris?" in _wire(sent)
    # the report says why the answer cost so little
    (pointer,) = [d for d in result.report.prune_decisions if QUOTED_REASON in d.reason]
    assert pointer.action == "kept" and pointer.block_count == 1
    assert [d for d in result.report.prune_decisions if d.action == "kept"] != [pointer]
    doc = await engine.get_session("s1")
    assert doc is not None
    assert [m.content for m in doc.session.messages if m.role is Role.ASSISTANT] == [FINDING]

    await engine.commit_assistant_message("s1", _answer("Sunny Paris, 24 degrees."))
    result = await engine.prepare_turn("s1", "Thanks. And tomorrow?")  # quotes nothing
    sent = to_openai_messages(result.assembled_input.parts)
    assert _wire(sent).count(FINDING) == 2  # the answer whole again, and the older prompt
    assert QUOTED_ANSWER not in _wire(sent)


async def test_the_budget_counts_the_pointer_not_the_answer() -> None:
    """The same conversation whose earlier answer the prompt does not quote (an answer of the
    same length) costs the answer's tokens more: the pointer's room goes to older history."""
    other = FINDING.replace("Paris", "Rome ").replace("7731", "8842")
    assert len(other) == len(FINDING) and other != FINDING

    async def used(answer: str) -> int:
        engine = _engine()
        await engine.prepare_turn("s1", "What is the weather in Paris?")
        await engine.commit_assistant_message("s1", _answer(answer))
        result = await engine.prepare_turn("s1", f"Write one line about it.\n{FINDING}")
        return result.report.token_used

    assert await used(FINDING) < await used(other) - 10


async def test_short_answers_and_answers_partly_quoted_stay_whole() -> None:
    engine = _engine()
    await engine.prepare_turn("s1", "Is it sunny?")
    await engine.commit_assistant_message("s1", _answer("Yes."))
    await engine.prepare_turn("s1", "Describe Paris.")
    await engine.commit_assistant_message("s1", _answer(FINDING))
    prompt = "Yes. Rewrite this: " + FINDING[:60] + " and more " * 10
    result = await engine.prepare_turn("s1", prompt)
    sent = to_openai_messages(result.assembled_input.parts)
    assert [m["content"] for m in sent if m["role"] == "assistant"] == ["Yes.", FINDING]


async def test_every_earlier_prompt_quoting_the_same_answers_points_to_the_newest() -> None:
    """A sequential crew's third task gets both earlier outputs, the second task got the
    first: each output reaches the model once, in the newest prompt; the answers and the
    second prompt's copy go as pointers, the rest of the second prompt as it was."""
    other = FINDING.replace("FINDING-7731", "ANALYSIS-0042")
    engine = _engine()
    await engine.prepare_turn("s1", "Task 1: research.")
    await engine.commit_assistant_message("s1", _answer(FINDING))
    await engine.prepare_turn("s1", f"Task 2: analyse.\nContext:\n{FINDING}")
    await engine.commit_assistant_message("s1", _answer(other))
    newest = f"Task 3: write.\nContext:\n{FINDING}\n\n----------\n\n{other}"
    result = await engine.prepare_turn("s1", newest)
    sent = to_openai_messages(result.assembled_input.parts)
    assert [(m["role"], m["content"]) for m in sent] == [
        ("user", "Task 1: research."),
        ("assistant", QUOTED_ANSWER),
        ("user", f"Task 2: analyse.\nContext:\n{QUOTED_IN_PROMPT}"),
        ("assistant", QUOTED_ANSWER),
        ("user", newest),
    ]
    pointed = [d for d in result.report.prune_decisions if QUOTED_REASON in d.reason]
    assert sum(d.block_count for d in pointed) == 3
