"""An app that goes back in its conversation (``prepare_call(..., rewind=True)``: it asks its
last question again without the answer it got, edits a message and drops what followed,
resumes from an earlier state) gets the conversation it went back to: the turns it took back
are not sent, not matched against what it passes, stay stored and are reported. Without
``rewind`` (several agents or requests sharing a session) nothing is taken back."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cut_history import (
    Events,
    ScriptedAdapter,
    make_engine,
    removed_decisions,
    reply,
    result,
    texts,
    user,
)

from ce.core.cli import main
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import Message, Role, ToolCallRequest
from ce.core.stores import SQLiteStore, Store
from ce.core.testing.assertions import assert_tool_pairs_intact

SYSTEM = Message(role=Role.SYSTEM, content="You answer briefly.")


async def talk(engine: ContextEngine, history: list[Message], answer: str) -> list[str]:
    """One model call of an app that passes its whole conversation: what the model got."""
    prepared = await engine.prepare_call("s", [SYSTEM, *history], rewind=True)
    await engine.commit_assistant_message("s", reply(answer))
    history.append(reply(answer))
    return texts(prepared.assembled_input.parts)


async def two_turns(engine: ContextEngine) -> list[Message]:
    history: list[Message] = []
    for n in (1, 2):
        history.append(user(f"question {n}"))
        await talk(engine, history, f"answer {n}")
    return history


async def test_an_answer_asked_for_again_is_not_sent_with_the_question() -> None:
    events = Events()
    engine = make_engine(events=events)
    history = await two_turns(engine)
    history.pop()  # regenerate: the app drops the answer it got and asks again

    sent = await talk(engine, history, "answer 2, again")

    assert sent == ["question 1", "answer 1", "question 2"]
    doc = await engine.get_session("s")
    assert [m.content for m in doc.session.messages][-2:] == ["answer 2", "answer 2, again"]
    summary = doc.session.summary
    assert summary is not None and [(w.from_index, w.to_index) for w in summary.withdrawn] == [
        (4, 5)
    ]
    # the next turn continues from the new answer
    history.append(user("question 3"))
    prepared = await engine.prepare_call("s", [SYSTEM, *history], rewind=True)
    assert texts(prepared.assembled_input.parts) == [
        "question 1",
        "answer 1",
        "question 2",
        "answer 2, again",
        "question 3",
    ]
    (decision,) = removed_decisions(prepared.report.prune_decisions)
    assert (decision.block_id, decision.action, decision.block_count) == (
        "withdrawn:4..4",
        "dropped",
        1,
    )
    assert events.degraded() == []
    await engine.close()


async def test_an_edited_message_replaces_it_and_what_followed() -> None:
    engine = make_engine()
    history = await two_turns(engine)
    edited = [*history[:2], user("question 2, edited")]

    sent = await talk(engine, edited, "answer to the edit")

    assert sent == ["question 1", "answer 1", "question 2, edited"]
    edited.append(user("question 3"))
    assert await talk(engine, edited, "answer 3") == [
        "question 1",
        "answer 1",
        "question 2, edited",
        "answer to the edit",
        "question 3",
    ]
    # going back to the first version: its messages are new again, stored and sent
    first = [*history, user("question 3 of the first version")]
    assert await talk(engine, first, "answer 3 of the first version") == [
        "question 1",
        "answer 1",
        "question 2",
        "answer 2",
        "question 3 of the first version",
    ]
    doc = await engine.get_session("s")
    assert len(doc.session.messages) == 13  # nothing stored is lost
    summary = doc.session.summary
    # each going back reached the one before it: one span
    assert summary is not None and [(w.from_index, w.to_index) for w in summary.withdrawn] == [
        (3, 9)
    ]
    await engine.close()


async def test_an_edit_after_an_answer_asked_for_again_that_never_came() -> None:
    engine = make_engine()
    history = await two_turns(engine)
    history.pop()
    await engine.prepare_call("s", [SYSTEM, *history], rewind=True)  # the model call fails
    edited = [*history[:2], user("question 2, edited")]

    assert await talk(engine, edited, "answer to the edit") == [
        "question 1",
        "answer 1",
        "question 2, edited",
    ]
    await engine.close()


async def test_an_answer_given_twice_is_a_place_to_go_back_to() -> None:
    """The same answer to two questions ("OK."): going back to the first one is found by
    the message before it, not by the answer's newest place."""
    engine = make_engine()
    history: list[Message] = []
    for n in (1, 2):
        history.append(user(f"question {n}"))
        await talk(engine, history, "OK.")
    history.append(user("question 3"))
    assert await talk(engine, history, "OK.") == [  # going on: nothing taken back
        "question 1",
        "OK.",
        "question 2",
        "OK.",
        "question 3",
    ]
    edited = [*history[:2], user("question 2, edited")]

    assert await talk(engine, edited, "Fine.") == ["question 1", "OK.", "question 2, edited"]
    again = [*edited[:3]]  # and the answer to the edit asked for again
    assert await talk(engine, again, "Fine, again.") == [
        "question 1",
        "OK.",
        "question 2, edited",
    ]
    doc = await engine.get_session("s")
    summary = doc.session.summary
    assert summary is not None and [(w.from_index, w.to_index) for w in summary.withdrawn] == [
        (3, 7),
        (8, 9),
    ]
    await engine.close()


async def test_the_replies_a_session_holds_are_found_by_their_text(tmp_path: Path) -> None:
    """``replies_held``: the texts of the session's replies, as another process finds them
    in the store; not a tool-calling message's text, not an answer the app took back (a
    regenerate), nothing of another session; the blocking twin answers the same."""
    path = str(tmp_path / "s.db")
    engine = ContextEngine(SQLiteStore(path))
    history = await two_turns(engine)
    call = ToolCallRequest(tool_call_id="c1", name="search", raw_arguments="{}")
    calling = Message(role=Role.ASSISTANT, content="let me look", tool_calls=[call])
    await engine.commit_assistant_message("s", calling)
    await engine.close()

    worker = ContextEngine(SQLiteStore(path))
    asked = ["answer 1", "answer 2", "let me look", "question 1", "never said", ""]
    assert await worker.replies_held("s", asked) == {"answer 1", "answer 2"}
    assert await worker.replies_held("other", asked) == frozenset()
    history.pop()  # regenerate: "answer 2" is taken back
    await talk(worker, history, "answer 2, again")
    assert await worker.replies_held("s", [*asked, "answer 2, again"]) == {
        "answer 1",
        "answer 2, again",
    }
    await worker.close()
    assert ContextEngine(SQLiteStore(path)).sync.replies_held("s", ["answer 1"]) == {"answer 1"}


async def test_without_rewind_nothing_is_taken_back() -> None:
    engine = make_engine()
    history = await two_turns(engine)
    prepared = await engine.prepare_call("s", [SYSTEM, *history[:3]])  # several flows

    assert texts(prepared.assembled_input.parts) == [
        "question 1",
        "answer 1",
        "question 2",
        "answer 2",
        "question 2",
    ]
    await engine.close()


async def test_what_is_no_going_back_takes_nothing_back() -> None:
    engine = make_engine()
    history = await two_turns(engine)
    # an app that passes only its new question (the same words as an earlier one)
    alone = await engine.prepare_call("s", [SYSTEM, user("question 1")], rewind=True)
    assert texts(alone.assembled_input.parts)[-3:] == ["question 2", "answer 2", "question 1"]
    await engine.commit_assistant_message("s", reply("answer 1, again"))
    # an app that keeps the answers in its own form: a different reply, then a new question
    history += [user("question 1"), reply("answer 1, as the app keeps it"), user("question 3")]
    kept = await engine.prepare_call("s", [SYSTEM, *history], rewind=True)
    assert "answer 1, again" in texts(kept.assembled_input.parts)
    doc = await engine.get_session("s")
    assert doc.session.summary is None
    await engine.close()


async def test_a_conversation_run_again_from_a_tools_result_gets_what_followed_taken_back() -> None:
    """A graph run again from its checkpoint after a tool step (LangGraph's time travel):
    the app's conversation ends with the tool's result the session holds, and the turns after
    it are taken back, the model asked to answer that result again."""
    engine = make_engine()
    called = reply("", "c1")
    asked = [user("weather in Paris?"), called]
    await engine.prepare_call("s", [SYSTEM, user("weather in Paris?")], rewind=True)
    await engine.commit_assistant_message("s", called)
    looked_up = [*asked, result("c1")]
    await talk(engine, looked_up, "sunny in Paris")
    looked_up.append(user("thanks"))
    await talk(engine, looked_up, "you are welcome")

    replayed = await engine.prepare_call("s", [SYSTEM, *asked, result("c1")], rewind=True)

    sent = texts(replayed.assembled_input.parts)
    assert sent[:2] == ["weather in Paris?", ""] and len(sent) == 3
    assert "result of c1" in sent[2]  # the tool's result, fenced
    assert_tool_pairs_intact(replayed.assembled_input.parts)
    doc = await engine.get_session("s")
    assert doc is not None and doc.session.summary is not None
    assert [(w.from_index, w.to_index) for w in doc.session.summary.withdrawn] == [(4, 7)]
    await engine.close()


async def test_a_run_in_flight_is_never_taken_back() -> None:
    engine = make_engine()
    history = await two_turns(engine)
    await engine.prepare_call("s", [SYSTEM, *history, user("look it up")], rewind=True)
    await engine.commit_assistant_message("s", reply("", "c1"))  # a tool call in flight
    # another request on the session, with the history as it was before that question
    prepared = await engine.prepare_call("s", [SYSTEM, *history[:3]], rewind=True)

    assert "look it up" in texts(prepared.assembled_input.parts)
    assert_tool_pairs_intact(prepared.assembled_input.parts)
    assert (await engine.get_session("s")).session.summary is None
    await engine.close()


async def test_another_process_honours_what_was_taken_back(
    opener: Callable[[], Store],
) -> None:
    first = make_engine(opener())
    watcher = make_engine(opener())  # a process that read the session before
    history = await two_turns(first)
    await watcher.prepare_call("s", [SYSTEM, *history, user("question 3")])
    await watcher.commit_assistant_message("s", reply("answer 3"))
    history += [user("question 3"), reply("answer 3")]
    back = [*history[:2], user("question 2, edited")]

    assert await talk(first, back, "answer to the edit") == [
        "question 1",
        "answer 1",
        "question 2, edited",
    ]
    back.append(user("question 4"))
    for engine in (watcher, make_engine(opener())):  # caught up, and cold
        prepared = await engine.prepare_call("s", [SYSTEM, *back], rewind=True)
        assert texts(prepared.assembled_input.parts) == [
            "question 1",
            "answer 1",
            "question 2, edited",
            "answer to the edit",
            "question 4",
        ]
        await engine.close()
    await first.close()


@pytest.mark.parametrize("when", ["long ago", "just now"])
async def test_a_cold_process_reads_only_the_newest_records_after_going_back(
    tmp_path: Path, when: str
) -> None:
    path = tmp_path / "s.db"
    first = make_engine(SQLiteStore(path))
    history = await two_turns(first)
    if when == "long ago":
        history.pop()
        await talk(first, history, "answer 2, again")
    for n in range(3, 43):  # 80 messages more: more than a cold call reads first
        history.append(user(f"question {n}"))
        await talk(first, history, f"answer {n}")
    if when == "just now":
        history.pop()
        await talk(first, history, "answer 42")  # asked again, answered the same
    await first.close()

    budget = BudgetConfig(max_input_tokens=400, reserved_reply_tokens=100)
    cold = make_engine(SQLiteStore(path), config=RuntimeConfig(model_hint="gpt-4o", budget=budget))
    history.append(user("question 43"))
    prepared = await cold.prepare_call("s", [SYSTEM, *history], rewind=True)
    assert cold._entries["s"].partial  # the newest records were enough
    assert texts(prepared.assembled_input.parts)[-3:] == ["question 42", "answer 42", "question 43"]
    assert "answer 2" not in texts(prepared.assembled_input.parts)
    await cold.close()


async def test_the_rolling_summary_never_holds_what_was_taken_back() -> None:
    adapter = ScriptedAdapter()
    config = RuntimeConfig(
        model_hint="gpt-4o",
        summary={"trigger_message_count": 8, "preserve_recent_messages": 2},  # type: ignore[arg-type]
    )
    engine = make_engine(config=config, llm_adapter=adapter)
    history = await two_turns(engine)
    edited = [*history[:2], user("question 2, edited")]
    await talk(engine, edited, "answer to the edit")
    for n in range(3, 7):
        edited.append(user(f"question {n}"))
        await talk(engine, edited, f"answer {n}")

    assert adapter.requests  # the engine summarized the older turns
    asked = "\n".join(str(m.content) for r in adapter.requests for m in r.messages)
    assert "question 2, edited" in asked
    assert "question 2\n" not in asked + "\n" and "answer 2" not in asked
    await engine.close()


async def test_another_process_honours_an_answer_asked_for_again_twice(
    opener: Callable[[], Store],
) -> None:
    first = make_engine(opener())
    watcher = make_engine(opener())  # a process that keeps the session cached
    history = await two_turns(first)
    history.pop()
    await talk(first, history, "answer 2, again")
    assert "answer 2, again" in texts(
        (await watcher.prepare_call("s", [SYSTEM, *history], rewind=False)).assembled_input.parts
    )
    history.pop()
    await talk(first, history, "answer 2, third try")  # one span with the first going back
    history.append(user("question 3"))

    prepared = await watcher.prepare_call("s", [SYSTEM, *history], rewind=True)
    assert texts(prepared.assembled_input.parts) == [
        "question 1",
        "answer 1",
        "question 2",
        "answer 2, third try",
        "question 3",
    ]
    for engine in (first, watcher):
        await engine.close()


async def test_ce_show_says_what_the_app_took_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.db"
    engine = make_engine(SQLiteStore(path))
    history = await two_turns(engine)
    await talk(engine, history[:3], "answer 2, again")
    await engine.close()
    show = ["--store", f"sqlite:///{path}", "show", "s"]
    assert await asyncio.to_thread(main, show) == 0  # the CLI runs its own event loop
    assert "taken back by the app: messages 4..4" in capsys.readouterr().out


def go_back(
    history: list[Message], data: st.DataObject, round_: int, lowest: int = 1
) -> list[Message]:
    """The app's conversation after it went back to a question drawn from ``lowest`` on:
    asked again (the conversation up to it) or edited (its new text last)."""
    back = data.draw(st.integers(min_value=lowest, max_value=len(history) // 2 - 1))
    if data.draw(st.booleans()):
        return history[: 2 * back + 1]
    return [*history[: 2 * back], user(f"question {back}, edit {round_}")]


@settings(max_examples=40, deadline=None)
@given(
    turns=st.integers(min_value=2, max_value=7),
    data=st.data(),
)
def test_after_any_going_back_the_model_gets_the_apps_conversation(
    turns: int, data: st.DataObject
) -> None:
    """Whatever earlier point the app goes back to, by asking again or by an edit, and
    however often, the model receives the conversation the app passes, in its order (the
    answers unique, or some given twice)."""

    def answer(label: str) -> str:
        return data.draw(st.sampled_from([label, "OK.", "Sure."]))

    async def run() -> None:
        engine = make_engine()
        history: list[Message] = []
        for n in range(turns):
            history.append(user(f"question {n}"))
            await talk(engine, history, answer(f"answer {n}"))
        for round_ in range(data.draw(st.integers(min_value=1, max_value=3))):
            history = go_back(history, data, round_)
            expected = [m.content for m in history]
            again = answer(f"answer, round {round_}")
            assert await talk(engine, history, again) == expected
            history.append(user(f"next question {round_}"))
            assert await talk(engine, history, answer(f"next answer {round_}")) == [
                *expected,
                again,
                f"next question {round_}",
            ]
        await engine.close()

    asyncio.run(run())


@settings(max_examples=25, deadline=None)
@given(turns=st.integers(min_value=2, max_value=6), data=st.data())
def test_workers_on_the_newest_records_go_back_as_a_process_holding_all_of_it(
    turns: int, data: st.DataObject
) -> None:
    """A long session (more messages than a worker reads first, more than the budget keeps)
    served by workers that read only its newest records, a new one now and then (cold), the
    app going back by asking again or by an edit: every call gives the model what one process
    holding the whole session gives it."""
    cfg = RuntimeConfig(
        model_hint="gpt-4o", budget=BudgetConfig(max_input_tokens=600, reserved_reply_tokens=200)
    )

    async def run(directory: str) -> None:
        whole = make_engine(config=cfg)
        path = str(Path(directory) / "s.db")
        worker = ContextEngine(SQLiteStore(path), config=cfg)
        history: list[Message] = []

        async def both(answer: str) -> None:
            nonlocal worker
            if data.draw(st.booleans()):  # the next request goes to a new worker
                await worker.close()
                worker = ContextEngine(SQLiteStore(path), config=cfg)
            expected = await talk(whole, history, answer)
            history.pop()  # talk appended the answer: the worker's turn appends it again
            assert await talk(worker, history, answer) == expected

        for n in range(40 + turns):
            history.append(user(f"question {n}"))
            await both(f"answer {n}")
        for round_ in range(data.draw(st.integers(min_value=1, max_value=3))):
            history = go_back(history, data, round_, lowest=30)
            await both(f"answer, round {round_}")
            history.append(user(f"next question {round_}"))
            await both(f"next answer {round_}")
        await whole.close()
        await worker.close()

    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(run(directory))
