"""Text tool use (ReAct) through the public engine API: a step re-rendered with its input
re-printed is the same step; an Observation belongs to the step before it (one block, never a
turn of its own); the newest question outlives older steps."""

from __future__ import annotations

from ce.core import BudgetConfig, Message, Role, RuntimeConfig, to_openai_messages
from ce.core.pipeline import canonical_step, is_observation, is_react_step
from ce.core.testing import deterministic_engine

STEP = 'Thought: look it up.\nAction: search\nAction Input: {"query": "cats", "k": 2}'
REPRINTED = "Thought: look it up.\nAction: search\nAction Input: {'k': 2, 'query': 'cats'}"


def test_a_step_and_its_reprint_read_the_same() -> None:
    assert is_react_step(STEP) and is_react_step(REPRINTED)
    assert canonical_step(STEP) == canonical_step(REPRINTED)
    assert canonical_step("Thought: x\nAction: a\nAction Input: not json") == (
        "Thought: x\nAction: a\nAction Input: not json"
    )
    assert not is_react_step("Thought: done.\nAnswer: 42")
    assert is_observation("Observation: 3 results") and not is_observation("An observation")


def _user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


def _assistant(text: str) -> Message:
    return Message(role=Role.ASSISTANT, content=text)


async def test_a_reprinted_step_is_stored_and_sent_once() -> None:
    engine = deterministic_engine()
    await engine.prepare_call("s", [_user("Cats?")])
    await engine.commit_assistant_message("s", _assistant(STEP))
    # the framework's next call renders the step its own way, then the observation
    prepared = await engine.prepare_call(
        "s", [_user("Cats?"), _assistant(REPRINTED), _user("Observation: cats purr")]
    )
    sent = to_openai_messages(prepared.assembled_input.parts)
    assert [(m["role"], m["content"]) for m in sent] == [
        ("user", "Cats?"),
        ("assistant", STEP),
        ("user", "Observation: cats purr"),
    ]
    doc = await engine.get_session("s")
    assert [m.content for m in doc.session.messages if m.role is Role.ASSISTANT] == [STEP]


async def test_an_observation_is_never_the_newest_question() -> None:
    """At a budget with room for one turn, the question and its steps stay, older turns go
    whole: no observation without its step, no step without its question."""
    budget = BudgetConfig(max_input_tokens=180, reserved_reply_tokens=40)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=budget))
    filler = " it is documented." * 12
    history: list[Message] = []
    for turn, topic in enumerate(("cats", "dogs", "birds")):
        history.append(_user(f"Question {turn}: tell me about {topic}"))
        history.append(
            _assistant(f'Thought: search.\nAction: kb\nAction Input: {{"q": "{topic}"}}')
        )
        history.append(_user(f"Observation: {topic}:{filler}"))
        if turn < 2:
            history.append(_assistant(f"Thought: done.\nAnswer: {topic} noted."))
    prepared = await engine.prepare_call("s", history)
    sent = to_openai_messages(prepared.assembled_input.parts)
    texts = [str(m["content"]) for m in sent]
    assert texts[0] == "Question 2: tell me about birds"  # the newest question stays
    assert is_observation(texts[-1]) and is_react_step(texts[-2])
    assert not any("cats" in t or "dogs" in t for t in texts)
    assert prepared.report.token_used <= prepared.report.token_budget
    dropped = [d for d in prepared.report.prune_decisions if d.action == "dropped"]
    assert sum(d.block_count for d in dropped) == 6  # two turns of three blocks each


async def test_a_finished_run_kept_as_one_scratchpad_message_is_not_stored_again() -> None:
    """Some framework versions keep a finished ReAct run in their memory as ONE assistant
    message (every step, its observation and the answer, with the input re-printed): the
    session holds those one by one, so it is not stored (nor sent) a second time."""
    engine = deterministic_engine()
    await engine.prepare_call("s", [_user("Cats?")])
    await engine.commit_assistant_message("s", _assistant(STEP))
    await engine.prepare_call("s", [_user("Cats?"), _assistant(STEP), _user("Observation: purr ")])
    await engine.commit_assistant_message("s", _assistant("Thought: done.\nAnswer: they purr"))
    scratchpad = f"{REPRINTED}\nObservation: purr \nThought: done.\nAnswer: they purr"
    prepared = await engine.prepare_call(
        "s", [_user("Cats?"), _assistant(scratchpad), _user("And dogs?")]
    )
    sent = [str(m["content"]) for m in to_openai_messages(prepared.assembled_input.parts)]
    assert sent == [
        "Cats?",
        STEP,
        "Observation: purr ",
        "Thought: done.\nAnswer: they purr",
        "And dogs?",
    ]
    # a scratchpad the session does not hold step by step is an ordinary message
    other = "Thought: x\nAction: kb\nAction Input: {}\nObservation: new\nThought: y\nAnswer: z"
    prepared = await engine.prepare_call("s", [_assistant(other), _user("Next?")])
    assert other in [p.content for p in prepared.assembled_input.parts]
