"""A model call that failed ends its run (``record_model_call`` with an error usage and no
reply): what the app does next is read against the conversation as it stood. An app that
drops the question whose call failed and asks another one does not send it; an app that asks
it again (a retry) sends it once, without what the failed attempt left (its tool call and
result); a retry with the same messages goes on as the run of that question. What the failed
attempt stored stays stored."""

from __future__ import annotations

import pytest
from test_cut_history import make_engine, reply, result, texts, user

from ce.core.engine import ContextEngine
from ce.core.schema import Message, ModelUsage, ModelUsageStatus, Role, RunStatus

SYSTEM = Message(role=Role.SYSTEM, content="You answer briefly.")


def failure(call_id: str) -> ModelUsage:
    return ModelUsage(
        model_usage_id=call_id,
        provider="openai",
        model="gpt-4o",
        status=ModelUsageStatus.ERROR,
        error="InternalServerError: overloaded",
    )


def answered(call_id: str) -> ModelUsage:
    return ModelUsage(model_usage_id=call_id, provider="openai", model="gpt-4o")


async def ask(engine: ContextEngine, history: list[Message]) -> list[str]:
    """One model call of an app that passes its whole conversation: what the model got."""
    prepared = await engine.prepare_call("s", [SYSTEM, *history], rewind=True, defer_commit=True)
    return texts(prepared.assembled_input.parts)


async def fail(engine: ContextEngine, history: list[Message], call_id: str) -> list[str]:
    sent = await ask(engine, history)
    await engine.record_model_call("s", failure(call_id))
    return sent


async def answer(
    engine: ContextEngine, history: list[Message], text: str, *calls: str
) -> list[str]:
    sent = await ask(engine, history)
    await engine.record_model_call("s", answered(f"u-{text}"), reply=reply(text, *calls))
    history.append(reply(text, *calls))
    return sent


async def stored(engine: ContextEngine) -> list[str]:
    doc = await engine.get_session("s")
    assert doc is not None
    return [m.content for m in doc.session.messages if m.role is not Role.SYSTEM]


async def test_a_question_dropped_after_its_call_failed_is_not_sent() -> None:
    engine = make_engine()
    history = [user("question 1")]
    await answer(engine, history, "answer 1")
    await fail(engine, [*history, user("delete my account")], "failed")
    doc = await engine.get_session("s")
    assert doc is not None and doc.session.run.status is RunStatus.FAILED
    assert doc.session.run.last_error == "InternalServerError: overloaded"

    history.append(user("never mind: what should I pack?"))
    sent = await answer(engine, history, "answer 2")

    assert sent == ["question 1", "answer 1", "never mind: what should I pack?"]
    # the failed turn stays stored, taken back
    assert await stored(engine) == [
        "question 1",
        "answer 1",
        "delete my account",
        "never mind: what should I pack?",
        "answer 2",
    ]
    history.append(user("question 3"))
    assert await ask(engine, history) == [
        "question 1",
        "answer 1",
        "never mind: what should I pack?",
        "answer 2",
        "question 3",
    ]
    await engine.close()


async def test_a_retry_with_the_same_messages_is_the_run_of_that_question() -> None:
    engine = make_engine()
    history = [user("question 1")]
    await answer(engine, history, "answer 1")
    history.append(user("question 2"))
    first = await fail(engine, history, "failed")

    again = await answer(engine, history, "answer 2")

    assert again == first == ["question 1", "answer 1", "question 2"]
    assert await stored(engine) == ["question 1", "answer 1", "question 2", "answer 2"]
    doc = await engine.get_session("s")
    assert doc is not None and doc.session.run.status is RunStatus.COMPLETED
    await engine.close()


async def test_a_turn_asked_again_after_a_failure_in_its_tool_loop_goes_without_it() -> None:
    """The app holds its conversation and runs the failed turn again from its question: the
    failed attempt's tool call and result are not sent with it (nor stored twice)."""
    engine = make_engine()
    history = [user("question 1")]
    await answer(engine, history, "answer 1")
    attempt = [*history, user("weather in Oslo?")]
    await answer(engine, attempt, "let me look", "c1")
    await fail(engine, [*attempt, result("c1")], "failed")

    history.append(user("weather in Oslo?"))
    sent = await answer(engine, history, "sunny")

    assert sent == ["question 1", "answer 1", "weather in Oslo?"]
    assert (await stored(engine)).count("weather in Oslo?") == 1
    await engine.close()


async def test_a_first_question_asked_again_after_its_call_failed_is_sent_once() -> None:
    """An app that passes only its newest question (the engine holds the conversation) asks
    it again after the call failed in its tool loop: the question once, without the failed
    attempt's tool call and result."""
    engine = make_engine()
    await answer(engine, [user("weather in Oslo?")], "let me look", "c1")
    await fail(
        engine, [user("weather in Oslo?"), reply("let me look", "c1"), result("c1")], "failed"
    )

    sent = await answer(engine, [user("weather in Oslo?")], "sunny")

    assert sent == ["weather in Oslo?"]
    assert (await stored(engine)).count("weather in Oslo?") == 1
    await engine.close()


async def test_a_question_asked_again_after_a_completed_run_is_a_new_turn() -> None:
    """Only a failed run's question asked again is a retry: the same question asked after
    its answer is a turn of its own."""
    engine = make_engine()
    await answer(engine, [user("how are you?")], "fine")

    sent = await answer(engine, [user("how are you?")], "still fine")

    assert sent == ["how are you?", "fine", "how are you?"]
    await engine.close()


async def test_a_turn_asked_again_after_its_tool_raised_out_of_the_agent_goes_without_it() -> None:
    """The run ended outside a model call (``end_run``: a tool's error raised out of the
    agent): the turn run again gets its question once, without the call left unanswered."""
    engine = make_engine()
    history = [user("question 1")]
    await answer(engine, history, "answer 1")
    await answer(engine, [*history, user("weather in Oslo?")], "let me look", "c1")
    await engine.end_run("s", "ToolInvocationError: the weather service is down")
    doc = await engine.get_session("s")
    assert doc is not None and doc.session.run.status is RunStatus.FAILED
    assert doc.session.run.last_error == "ToolInvocationError: the weather service is down"

    history.append(user("weather in Oslo?"))
    sent = await answer(engine, history, "sunny")

    assert sent == ["question 1", "answer 1", "weather in Oslo?"]
    assert (await stored(engine)).count("weather in Oslo?") == 1
    await engine.close()


async def test_a_cancelled_run_is_aborted_and_its_question_asked_alone_again_is_sent_once() -> None:
    engine = make_engine()
    await answer(engine, [user("weather in Oslo?")], "let me look", "c1")
    engine.sync.end_run("s", "CancelledError", cancelled=True)
    doc = await engine.get_session("s")
    assert doc is not None and doc.session.run.status is RunStatus.ABORTED

    sent = await answer(engine, [user("weather in Oslo?")], "sunny")

    assert sent == ["weather in Oslo?"]
    assert (await stored(engine)).count("weather in Oslo?") == 1
    await engine.close()


async def test_ending_a_run_that_is_not_in_flight_writes_nothing() -> None:
    engine = make_engine()
    await answer(engine, [user("how are you?")], "fine")
    version = await engine.store.get_version("s")
    result = await engine.end_run("s", "too late")
    assert result.version == version == await engine.store.get_version("s")
    doc = await engine.get_session("s")
    assert doc is not None and doc.session.run.status is RunStatus.COMPLETED
    with pytest.raises(ValueError, match="error"):
        await engine.end_run("s", "")
    await engine.close()
