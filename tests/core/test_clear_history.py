"""An app that clears its conversation to start over (``ContextEngine.clear_history``: a chat
engine's or an agent's reset, a "new chat") gets none of the earlier conversation back from
the session: not its messages, not what was retrieved for them. The messages stay stored and
reported; the clear is stored (a fresh engine honours it, a cold one clears on the session's
newest records); a session with nothing to clear is left as it is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cut_history import (
    INV,
    REMOVED,
    Events,
    chat,
    make_engine,
    removed_decisions,
    reply,
    texts,
    user,
)
from test_engine_properties import Step, build, steps

from ce.core.cli import main
from ce.core.schema import (
    EvidenceSource,
    EvidenceType,
    Message,
    Role,
    SourceKind,
    ToolCallRequest,
)
from ce.core.stores import MemoryStore, SQLiteStore, Store
from ce.core.testing.assertions import assert_tool_pairs_intact

RAG = EvidenceType.RAG_DOC


def _doc(name: str) -> EvidenceSource:
    return EvidenceSource(kind=SourceKind.RAG, uri=f"kb://{name}")


async def test_after_a_clear_only_the_new_conversation_is_sent() -> None:
    events = Events()
    engine = make_engine(events=events)
    await chat(engine, range(3))

    await engine.clear_history("s")
    prepared = await engine.prepare_turn("s", "question 0")  # the same words, a new chat

    assert texts(prepared.assembled_input.parts) == ["question 0"]
    (decision,) = removed_decisions(prepared.report.prune_decisions)
    assert (decision.action, decision.block_count) == ("dropped", 6)
    await engine.commit_assistant_message("s", reply("answer 0 again"))
    # a framework passes its own (new) history on the next call: each message once
    again = await engine.prepare_call(
        "s", [user("question 0"), reply("answer 0 again"), user("question 1")]
    )
    assert texts(again.assembled_input.parts) == ["question 0", "answer 0 again", "question 1"]
    doc = await engine.get_session("s")
    assert len(doc.session.messages) == 9  # every message stays stored
    summary = doc.session.summary
    assert summary is not None and (summary.source, summary.content) == ("app", "")
    assert summary.message_index_range.to_index == 5
    assert events.degraded() == []
    await engine.close()


async def test_a_clear_in_the_middle_of_a_tool_run_clears_it_whole() -> None:
    engine = make_engine()
    await engine.prepare_turn("s", "look it up")
    call = ToolCallRequest(tool_call_id="c1", name="search", raw_arguments="{}")
    await engine.commit_assistant_message(
        "s", Message(role=Role.ASSISTANT, content="", invocation=INV, tool_calls=[call])
    )

    await engine.clear_history("s")
    prepared = await engine.prepare_turn("s", "something else")

    assert texts(prepared.assembled_input.parts) == ["something else"]
    assert not any(p.tool_call_id or p.tool_calls for p in prepared.assembled_input.parts)
    await engine.close()


async def test_what_was_retrieved_before_the_clear_is_not_sent() -> None:
    engine = make_engine()
    await engine.prepare_turn("s", "what about paris?")
    paris = await engine.ingest_evidence("s", "PARIS-DOC: mild in autumn", _doc("paris"), RAG)
    await engine.commit_assistant_message("s", reply("it is mild"))
    before = await engine.prepare_turn("s", "and then?")
    assert "PARIS-DOC" in str(before.assembled_input.parts)  # sent while it is that chat's
    await engine.commit_assistant_message("s", reply("then cold"))

    await engine.clear_history("s")
    await engine.prepare_turn("s", "what about oslo?")
    await engine.ingest_evidence("s", "OSLO-DOC: cold in autumn", _doc("oslo"), RAG)
    after = await engine.prepare_call("s", [user("what about oslo?")])

    sent = str(after.assembled_input.parts)
    assert "OSLO-DOC" in sent and "PARIS-DOC" not in sent and "mild" not in sent
    assert any(
        d.reason == REMOVED and d.block_id == f"ev:{paris.evidence_id}"
        for d in after.report.prune_decisions
    )
    # the same document retrieved again in the new conversation is sent (stored anew)
    again = await engine.ingest_evidence("s", "PARIS-DOC: mild in autumn", _doc("paris"), RAG)
    assert again.evidence_id != paris.evidence_id
    assert "PARIS-DOC" in str(
        (await engine.prepare_call("s", [user("what about oslo?")])).assembled_input.parts
    )
    await engine.close()


async def test_a_cold_engine_tells_cleared_documents_from_new_ones(
    opener: Callable[[], Store],
) -> None:
    first = make_engine(opener())
    await first.prepare_turn("s", "what about paris?")
    await first.ingest_evidence("s", "PARIS-DOC: mild in autumn", _doc("paris"), RAG)
    await chat(first, range(40))
    await first.clear_history("s")
    for n in range(70):  # more evidences after the clear than a cold call reads first
        await first.ingest_evidence("s", f"DOC {n}", _doc(f"d{n}"), RAG)
    await first.close()

    second = make_engine(opener())  # another process, on the newest records
    await second.prepare_turn("s", "paris again?")
    stored = await second.ingest_evidence("s", "PARIS-DOC: mild in autumn", _doc("paris"), RAG)
    repeated = await second.ingest_evidence("s", "DOC 0", _doc("d0"), RAG)
    prepared = await second.prepare_call("s", [user("paris again?")])
    docs = await second.store.list_evidences("s")
    await second.close()

    assert sum(e.content.startswith("PARIS-DOC") for e in docs) == 2  # stored anew after the clear
    assert sum(e.content == "DOC 0" for e in docs) == 1  # one of the new conversation's: kept once
    assert stored.evidence_id == docs[-1].evidence_id
    assert repeated.evidence_id == docs[1].evidence_id
    assert "PARIS-DOC" in str(prepared.assembled_input.parts)


async def test_ce_show_says_what_the_app_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.db"
    engine = make_engine(SQLiteStore(path))
    await engine.prepare_turn("s", "what about paris?")
    await engine.ingest_evidence("s", "PARIS-DOC: mild in autumn", _doc("paris"), RAG)
    await chat(engine, range(2))
    await engine.clear_history("s")
    await engine.close()
    show = ["--store", f"sqlite:///{path}", "show", "s"]
    assert await asyncio.to_thread(main, show) == 0  # the CLI runs its own event loop
    assert "removed by the app: messages 0..4, evidences 0..0" in capsys.readouterr().out


async def test_a_fresh_engine_honours_the_clear_made_on_the_newest_records(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    first = make_engine(SQLiteStore(path))
    await chat(first, range(40))  # 80 messages: more than a cold call reads first
    await first.close()

    second = make_engine(SQLiteStore(path))  # another process
    await second.clear_history("s")
    assert second._entries["s"].partial  # cleared on the session's newest records
    await second.close()

    third = make_engine(SQLiteStore(path))
    prepared = await third.prepare_turn("s", "a new question")
    assert texts(prepared.assembled_input.parts) == ["a new question"]
    assert sum(d.block_count for d in removed_decisions(prepared.report.prune_decisions)) == 80
    summary = (await third.get_session("s")).session.summary
    assert summary is not None and (summary.source, summary.message_index_range.to_index) == (
        "app",
        79,
    )
    await third.close()


async def test_nothing_to_clear_leaves_the_session_as_it_is() -> None:
    engine = make_engine()
    await engine.clear_history("new")  # no such session yet
    assert await engine.store.get_session("new") is None
    await chat(engine, range(1))
    first = await engine.clear_history("s")
    second = await engine.clear_history("s")  # nothing since the last clear
    assert second.version == first.version == await engine.store.get_version("s")
    assert engine.sync.clear_history("s").version == first.version
    await engine.close()


@settings(max_examples=40, deadline=None)
@given(history=steps(), cold=st.booleans())
def test_after_any_history_a_clear_sends_only_what_follows(history: list[Step], cold: bool) -> None:
    async def run() -> None:
        store = MemoryStore()
        changes, _ = build("p", history)
        await store.commit("p", changes)
        writer = make_engine(store)
        await writer.clear_history("p")
        engine = make_engine(store) if cold else writer
        prepared = await engine.prepare_turn("p", "the newest question")
        parts = prepared.assembled_input.parts
        assert_tool_pairs_intact(parts)
        assert [p.content for p in parts if p.role is not Role.SYSTEM] == ["the newest question"]
        stored = (await engine.get_session("p")).evidences.values()
        sent = " ".join(p.content for p in parts)
        assert not any(e.content.strip() and e.content.strip() in sent for e in stored)

    asyncio.run(run())


async def test_the_old_conversation_passed_again_after_the_clear_is_sent_again() -> None:
    engine = make_engine()  # an app that loads a saved conversation after its reset
    await engine.prepare_call("s", [user("q0")])
    await engine.commit_assistant_message("s", reply("a0"))
    await engine.clear_history("s")

    first = await engine.prepare_call("s", [user("q0"), reply("a0"), user("q1")])
    await engine.commit_assistant_message("s", reply("a1"))
    second = await engine.prepare_call(
        "s", [user("q0"), reply("a0"), user("q1"), reply("a1"), user("q2")]
    )

    assert texts(first.assembled_input.parts) == ["q0", "a0", "q1"]
    assert texts(second.assembled_input.parts) == ["q0", "a0", "q1", "a1", "q2"]
    stored = [m.content for m in (await engine.get_session("s")).session.messages]
    assert stored == ["q0", "a0", "q0", "a0", "q1", "a1", "q2"]  # each passed again once
    await engine.close()


async def test_messages_with_framework_ids_passed_again_are_stored_anew_once(
    tmp_path: Path,
) -> None:
    def said(text: str, message_id: str, answer: bool = False) -> Message:
        message = reply(text) if answer else user(text)
        return message.model_copy(update={"message_id": message_id})

    events = Events()
    path = tmp_path / "s.db"
    writer = make_engine(SQLiteStore(path), events=events)
    history: list[Message] = []
    for n in range(40):  # 80 messages: more than a cold call reads first
        history += [said(f"q{n}", f"u{n}"), said(f"a{n}", f"r{n}", answer=True)]
        await writer.prepare_call("s", history[:-1])
        await writer.commit_assistant_message("s", history[-1])
    await writer.clear_history("s")
    restored = [*history[:4], said("new", "new")]
    first = await writer.prepare_call("s", restored)
    await writer.commit_assistant_message("s", said("answer", "answer", answer=True))
    await writer.close()

    cold = make_engine(SQLiteStore(path))  # another process, on the newest records
    later = await cold.prepare_call(
        "s", [*restored, said("answer", "answer", answer=True), said("next", "next")]
    )
    doc = await cold.get_session("s")
    await cold.close()

    assert texts(first.assembled_input.parts) == ["q0", "a0", "q1", "a1", "new"]
    assert texts(later.assembled_input.parts) == ["q0", "a0", "q1", "a1", "new", "answer", "next"]
    assert len(doc.session.messages) == 80 + 7
    assert "duplicate_message_id" not in events.degraded()  # put back, not an id reused


async def test_right_after_a_clear_nothing_is_sent() -> None:
    engine = make_engine()
    await chat(engine, range(2))
    await engine.prepare_turn("s", "question 2")  # a run in flight
    await engine.clear_history("s")

    prepared = await engine.prepare_call("s", [])  # a memory read before anything new

    assert texts(prepared.assembled_input.parts) == []
    await engine.close()
