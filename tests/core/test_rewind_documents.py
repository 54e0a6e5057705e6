"""What was retrieved for the turns an app took back (``prepare_call(..., rewind=True)``: an
edited question, an answer asked for again) is taken back with them: the documents found for
the abandoned question are not sent with the edit, stay stored and are reported; a document
found again for the new question is sent, once; the facts they state conflict with nothing.
In the process that went back, in another that keeps the session cached, and in a cold one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from test_cut_history import REMOVED, make_engine, reply, texts, user

from ce.core.cli import main
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.pipeline import document_pointer
from ce.core.schema import (
    Evidence,
    EvidenceSource,
    EvidenceType,
    Message,
    PrepareResult,
    Role,
    SourceKind,
)
from ce.core.stores import SQLiteStore, Store
from ce.core.testing import CITY_GUIDES

SYSTEM = Message(role=Role.SYSTEM, content="You answer from the documents.")


async def retrieve(engine: ContextEngine, city: str) -> Evidence:
    source = EvidenceSource(kind=SourceKind.RAG, uri=f"kb://{city.lower()}")
    return await engine.ingest_evidence("s", CITY_GUIDES[city], source, EvidenceType.RAG_DOC)


async def ask(
    engine: ContextEngine, history: list[Message], cities: tuple[str, ...], answer: str
) -> PrepareResult:
    """One turn of a RAG app that passes its whole conversation: it retrieves for the newest
    question, then calls the model."""
    for city in cities:
        await retrieve(engine, city)
    prepared = await engine.prepare_call("s", [SYSTEM, *history], rewind=True)
    await engine.commit_assistant_message("s", reply(answer))
    history.append(reply(answer))
    return prepared


def guides(prepared: PrepareResult) -> list[str]:
    """The guides the model got, in the order it got them."""
    sent = "\n".join(p.content for p in prepared.assembled_input.parts)
    found = sorted((sent.find(text), city) for city, text in CITY_GUIDES.items() if text in sent)
    for city, text in CITY_GUIDES.items():
        assert sent.count(text) <= 1, f"the {city} guide was sent twice"
    return [city for _, city in found]


async def two_turns(engine: ContextEngine) -> list[Message]:
    history = [user("weather in Paris?")]
    await ask(engine, history, ("Paris",), "mild")
    history.append(user("and in Oslo?"))
    await ask(engine, history, ("Oslo",), "mild too")
    return history


async def test_the_documents_of_an_edited_question_go_with_it() -> None:
    engine = make_engine()
    history = await two_turns(engine)
    edited = [*history[:2], user("and in Rome?")]

    prepared = await ask(engine, edited, ("Rome",), "mild as well")

    assert texts(prepared.assembled_input.parts) == ["weather in Paris?", "mild", "and in Rome?"]
    assert guides(prepared) == ["Paris", "Rome"]
    doc = await engine.get_session("s")
    (oslo,) = [e for e in doc.evidences.values() if "Oslo" in e.content]  # it stays stored
    reported = [
        d for d in prepared.report.prune_decisions if d.block_id == f"ev:{oslo.evidence_id}"
    ]
    assert [(d.action, d.reason.split(":")[0], d.block_count) for d in reported] == [
        ("dropped", REMOVED, 1)
    ]
    # the next turns: the conversation the app went on with, and its documents
    edited.append(user("and tomorrow?"))
    assert guides(await ask(engine, edited, (), "sunny")) == ["Paris", "Rome"]
    # asking that again: its documents were retrieved before the question, they stay
    edited.pop()
    assert guides(await ask(engine, edited, (), "sunny, again")) == ["Paris", "Rome"]
    await engine.close()


async def test_a_document_found_again_for_the_new_question_is_sent_once() -> None:
    engine = make_engine()
    history = await two_turns(engine)

    # the edit finds the abandoned question's document again (it is stored: found, not
    # stored twice), and another
    edited = [*history[:2], user("and in Oslo or Rome?")]
    assert guides(await ask(engine, edited, ("Oslo", "Rome"), "both mild")) == [
        "Paris",
        "Oslo",
        "Rome",
    ]
    # going back again, to the same point: the span joins the first; Oslo is found again
    # (the copy the first edit kept), Rome is not
    again = [*history[:2], user("and in Oslo alone?")]
    assert guides(await ask(engine, again, ("Oslo",), "mild")) == ["Paris", "Oslo"]
    again.append(user("and in Lima?"))
    assert guides(await ask(engine, again, ("Lima",), "warm")) == ["Paris", "Oslo", "Lima"]
    doc = await engine.get_session("s")
    summary = doc.session.summary
    assert summary is not None and [(w.from_index, w.to_index) for w in summary.withdrawn] == [
        (3, 7)
    ]
    await engine.close()


async def test_a_prompt_that_quotes_the_document_found_again_points_to_it() -> None:
    """A RAG prompt quotes what it retrieved: the edit's prompt quotes the abandoned
    question's document, retrieved again; it is sent once, fenced, and the prompt points to
    the copy that is sent."""
    engine = make_engine()
    history = await two_turns(engine)
    # the engine finds the copy that is sent even without having seen it ingested again
    other = make_engine(engine.store)
    prompt = f"Context:\n{CITY_GUIDES['Oslo']}\n\nQuestion: and in Oslo, really?"
    edited = [*history[:2], user(prompt)]

    prepared = await other.prepare_call("s", [SYSTEM, *edited], rewind=True)

    assert guides(prepared) == ["Paris", "Oslo"]
    doc = await other.get_session("s")
    (oslo,) = [e for e in doc.evidences.values() if "Oslo" in e.content]
    asked = prepared.assembled_input.parts[-1].content
    assert document_pointer(oslo.evidence_id) in asked and CITY_GUIDES["Oslo"] not in asked
    assert not any(
        d.reason.startswith(REMOVED) and "ev:" in d.block_id
        for d in prepared.report.prune_decisions
    )
    await other.close()
    await engine.close()


async def test_another_process_leaves_them_out(opener: Callable[[], Store]) -> None:
    first = make_engine(opener())
    watcher = make_engine(opener())  # a process that keeps the session cached
    history = await two_turns(first)
    await watcher.prepare_call("s", [SYSTEM, *history], rewind=True)
    edited = [*history[:2], user("and in Rome?")]
    await ask(first, edited, ("Rome",), "mild as well")
    edited.append(user("and tomorrow?"))

    prepared = await watcher.prepare_call("s", [SYSTEM, *edited], rewind=True)
    assert guides(prepared) == ["Paris", "Rome"]
    # the abandoned document, retrieved again there, is stored anew and sent
    await retrieve(watcher, "Oslo")
    again = await watcher.prepare_call("s", [SYSTEM, *edited], rewind=True)
    assert guides(again) == ["Paris", "Rome", "Oslo"]
    doc = await first.get_session("s")
    assert sum("Oslo" in e.content for e in doc.evidences.values()) == 2
    for engine in (first, watcher):
        await engine.close()


async def test_a_cold_process_that_finds_it_stored_long_ago(
    opener: Callable[[], Store],
) -> None:
    first = make_engine(opener())
    history = await two_turns(first)
    edited = [*history[:2], user("and in Rome?")]
    await ask(first, edited, ("Rome",), "mild as well")
    for n in range(40):  # more messages and evidences than a cold call reads first
        edited.append(user(f"and note {n}?"))
        for part in ("a", "b"):
            source = EvidenceSource(kind=SourceKind.RAG, uri=f"kb://note-{n}{part}")
            await first.ingest_evidence("s", f"note {n}{part}", source, EvidenceType.RAG_DOC)
        await ask(first, edited, (), f"noted {n}")
    await first.close()
    edited.append(user("and in Oslo after all?"))

    cold = ContextEngine(opener(), config=RuntimeConfig(model_hint="gpt-4o"))  # its own ids
    oslo = await retrieve(cold, "Oslo")  # found in the store, taken back: stored anew
    assert cold._entries["s"].partial  # the newest records, and the store's lookup
    prepared = await cold.prepare_call("s", [SYSTEM, *edited], rewind=True)

    assert "Oslo" in guides(prepared)
    doc = await cold.get_session("s")
    assert [e.evidence_id for e in doc.evidences.values() if "Oslo" in e.content][-1] == (
        oslo.evidence_id
    )
    assert sum("Oslo" in e.content for e in doc.evidences.values()) == 2
    await cold.close()


# a budget the newest records a worker reads first cover
SMALL = RuntimeConfig(
    model_hint="gpt-4o", budget=BudgetConfig(max_input_tokens=3000, reserved_reply_tokens=500)
)
PAD = "with the details that a long answer gives, " * 6


async def long_conversation(opener: Callable[[], Store]) -> list[Message]:
    """Two turns about Paris and Oslo and 40 more, by a process that ends."""
    first = make_engine(opener(), config=SMALL)
    history = await two_turns(first)
    for n in range(40):  # more messages than a worker reads first
        history.append(user(f"and note {n}? {PAD}"))
        await ask(first, history, (), f"noted {n}: {PAD}")
    await first.close()
    return history


async def ask_rome(engine: ContextEngine, history: list[Message], notes: int = 0) -> None:
    """The question about Rome (its guide retrieved, and ``notes`` more documents)."""
    history.append(user("and in Rome?"))
    for n in range(notes):
        source = EvidenceSource(kind=SourceKind.RAG, uri=f"kb://rome-{n}")
        await engine.ingest_evidence("s", f"Rome note {n}", source, EvidenceType.RAG_DOC)
    await ask(engine, history, ("Rome",), "mild as well")


@pytest.mark.parametrize("warm", [True, False])
async def test_a_worker_goes_back_on_the_newest_records_it_read(
    opener: Callable[[], Store], warm: bool
) -> None:
    """A worker that read only the session's newest records takes an edited turn back on
    them (cold: the edit is its first call, the turn another process's; warm: it asked that
    turn itself): the Rome guide and the abandoned turn are not sent, Lima's is, and it
    never read the whole session."""
    history = await long_conversation(opener)
    worker = ContextEngine(opener(), config=SMALL)  # its own ids
    if warm:
        await ask_rome(worker, history)
    else:
        other = ContextEngine(opener(), config=SMALL)
        await ask_rome(other, history)
        await other.close()
    edited = [*history[:-2], user("and in Lima?")]

    prepared = await ask(worker, edited, ("Lima",), "warm")

    assert worker._entries["s"].partial  # the newest records only
    assert guides(prepared) == ["Paris", "Oslo", "Lima"]
    sent = texts(prepared.assembled_input.parts)
    assert "and in Lima?" in sent and sent[-1] == "and in Lima?"
    assert history[-2].content not in sent and history[-1].content not in sent
    doc = await worker.get_session("s")
    assert doc.session.summary is not None
    (span,) = doc.session.summary.withdrawn
    assert span.to_index - span.from_index == 2  # the edited question and its answer
    assert [doc.session.messages[i].content for i in (span.from_index, span.to_index - 1)] == [
        history[-2].content,
        history[-1].content,
    ]
    await worker.close()


async def test_a_process_holding_a_long_session_goes_back_on_its_newest_records(
    opener: Callable[[], Store],
) -> None:
    """The process that wrote all of a long session (over a thousand messages) goes back on
    the session's newest records, read afresh, rather than rebuild what it derived from every
    message: the same input, and the session's next calls go on from those records."""
    engine = make_engine(opener(), config=SMALL)
    history = await two_turns(engine)
    filler = [
        m for n in range(600) for m in (user(f"and note {n}? {PAD}"), reply(f"noted {n}: {PAD}"))
    ]
    await engine.record_messages("s", filler)
    history += filler
    await ask_rome(engine, history)
    assert not engine._entries["s"].partial  # it holds every message it wrote
    edited = [*history[:-2], user("and in Lima?")]

    prepared = await ask(engine, edited, ("Lima",), "warm")

    assert engine._entries["s"].partial  # the newest records, read afresh
    assert guides(prepared) == ["Paris", "Oslo", "Lima"]
    sent = texts(prepared.assembled_input.parts)
    assert sent[-1] == "and in Lima?" and "and in Rome?" not in sent
    edited.append(user("and tomorrow?"))
    again = await ask(engine, edited, (), "sunny")
    assert texts(again.assembled_input.parts)[-3:] == ["and in Lima?", "warm", "and tomorrow?"]
    doc = await engine.get_session("s")
    assert doc.session.summary is not None
    (span,) = doc.session.summary.withdrawn
    assert [m.content for m in doc.session.messages[span.from_index : span.to_index]] == [
        "and in Rome?",
        "mild as well",
    ]
    await engine.close()


async def test_going_back_reads_the_whole_session_when_its_documents_reach_further(
    opener: Callable[[], Store],
) -> None:
    """The turn taken back retrieved more documents than a worker reads first: the worker
    reads the whole session to find them all, and none of them is sent."""
    history = await long_conversation(opener)
    other = ContextEngine(opener(), config=SMALL)
    await ask_rome(other, history, notes=70)
    await other.close()
    worker = ContextEngine(opener(), config=SMALL)
    edited = [*history[:-2], user("and in Lima?")]

    prepared = await ask(worker, edited, ("Lima",), "warm")

    assert not worker._entries["s"].partial  # read whole
    assert guides(prepared) == ["Paris", "Oslo", "Lima"]
    sent = "\n".join(texts(prepared.assembled_input.parts))
    assert "Rome note" not in sent
    await worker.close()


async def test_facts_of_a_document_taken_back_conflict_with_nothing() -> None:
    engine = make_engine()
    history = [user("where is order A-1?")]
    source = EvidenceSource(kind=SourceKind.RAG, uri="kb://orders")
    await engine.ingest_evidence(
        "s", '{"order_id": "A-1", "status": "packed"}', source, EvidenceType.RAG_DOC
    )
    await ask(engine, history, (), "packed")
    history.append(user("and now?"))
    await engine.ingest_evidence(
        "s", '{"order_id": "A-1", "status": "lost"}', source, EvidenceType.RAG_DOC
    )
    await ask(engine, history, (), "lost")
    edited = [*history[:2], user("when will it ship?")]

    prepared = await ask(engine, edited, (), "soon")

    sent = "\n".join(p.content for p in prepared.assembled_input.parts)
    assert "packed" in sent and "lost" not in sent
    assert prepared.report.conflicts == []
    await engine.close()


@pytest.mark.parametrize("kept", ["its prompts", "its bare questions"])
async def test_an_app_that_keeps_its_turns_in_another_form(kept: str) -> None:
    """The app's history holds the prompts it sent, each quoting its documents, or only its
    (short) questions; the session holds the prompts, with pointers. Going back is
    recognised all the same, and each turn is stored once."""
    engine = make_engine()

    def prompt(city: str, question: str) -> Message:
        return user(f"Context:\n{CITY_GUIDES[city]}\n\nQuestion: {question}")

    async def turn(history: list[Message], city: str, question: str) -> PrepareResult:
        answer = f"mild in {city}"
        prepared = await ask(engine, [*history, prompt(city, question)], (city,), answer)
        history += [prompt(city, question) if kept == "its prompts" else user(question)]
        history.append(reply(answer))
        return prepared

    first: list[Message] = []
    await turn(first, "Paris", "Paris?")
    await turn(list(first), "Oslo", "Oslo?")
    prepared = await turn(list(first), "Rome", "Rome?")

    asked = texts(prepared.assembled_input.parts)
    assert len(asked) == 3 and asked[1] == "mild in Paris" and asked[2].endswith("Rome?")
    assert guides(prepared) == ["Paris", "Rome"]
    doc = await engine.get_session("s")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert [u.rsplit(" ", 1)[-1] for u in users] == ["Paris?", "Oslo?", "Rome?"]
    await engine.close()


async def test_ce_show_counts_the_documents_taken_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.db"
    engine = make_engine(SQLiteStore(path))
    history = await two_turns(engine)
    await ask(engine, [*history[:2], user("and in Rome?")], ("Rome",), "mild as well")
    await engine.close()
    show = ["--store", f"sqlite:///{path}", "show", "s"]
    assert await asyncio.to_thread(main, show) == 0  # the CLI runs its own event loop
    assert "messages 3..4 and 1 evidence that came with them" in capsys.readouterr().out


async def test_a_cold_process_that_found_it_again_before_going_back(
    opener: Callable[[], Store],
) -> None:
    """A worker that has not read the session ingests a document it holds (found: not stored
    again), then the app goes back before the turn that document came with, and its prompt
    does not quote it: read whole for the going back, the session still knows it was found
    again for the new question, and sends it."""
    first = make_engine(opener())
    history = [user("weather in Paris?")]
    await ask(first, history, ("Paris",), "mild")
    for n in range(40):  # more messages than a cold call reads first
        history.append(user(f"and note {n}?"))
        await ask(first, history, (), f"noted {n}")
    history.append(user("and in Oslo?"))
    await ask(first, history, ("Oslo",), "mild too")
    await first.close()
    edited = [*history[:-2], user("and in Oslo, tomorrow?")]

    cold = ContextEngine(opener(), config=RuntimeConfig(model_hint="gpt-4o"))  # its own ids
    oslo = await retrieve(cold, "Oslo")
    assert cold._entries["s"].partial
    prepared = await cold.prepare_call("s", [SYSTEM, *edited], rewind=True)

    assert "Oslo" in guides(prepared)
    doc = await cold.get_session("s")
    assert [e.evidence_id for e in doc.evidences.values() if "Oslo" in e.content] == [
        oslo.evidence_id
    ]
    summary = doc.session.summary
    assert summary is not None and summary.withdrawn[-1].kept_evidences == [oslo.evidence_id]
    await cold.close()
