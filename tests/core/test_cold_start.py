"""A process that has not seen a session reads its newest records, not the whole history.

Every test compares a cold call that reads the session's newest part from an SQLite file with
the same call on the whole session (a MemoryStore holding the same records): the model input,
the kept and degraded blocks, the conflicts and the stored turn record must be the same.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ce.core.engine._core as engine_core
from ce.core import tokens
from ce.core.config import BudgetConfig, ConflictConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.schema import (
    BlockType,
    ContextBlock,
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    Message,
    ModelInvocation,
    ModelUsage,
    PrepareResult,
    Priority,
    Ref,
    Role,
    SessionDocument,
    SourceKind,
    ToolCallRequest,
)
from ce.core.schema._document import may_state_facts
from ce.core.state import AgentState, ModelOutput, ToolResult
from ce.core.stores import MemoryStore, SessionChanges, SQLiteStore, Store
from ce.core.stores import sqlite as sqlite_module
from ce.core.testing.histories import as_passed

DATA = Path(__file__).parent / "data"
INV = ModelInvocation(provider="openai", model="gpt-4o")
WORDS = ["alpha", "beta", "gamma", "délta", "东京", "42", "x=1;", "order"]


@dataclass
class Step:
    user: str
    calls: list[int]  # result lengths of one round of parallel calls (none: no tool use)
    evidences: list[tuple[str, float | None, bool]]  # (kind, confidence, linked to a call)
    answer: str


COLD_EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
"""The property tests' settings: each example writes and reads a SQLite file."""


def _text(draw: st.DrawFn, most: int) -> str:
    n = draw(st.integers(1, most))
    return " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=n, max_size=n)))


@st.composite
def histories(draw: st.DrawFn) -> list[Step]:
    kinds = st.sampled_from(["doc", "json", "entity"])
    evidence = st.tuples(kinds, st.none() | st.floats(0, 1), st.booleans())
    return [
        Step(
            _text(draw, 40),
            draw(st.lists(st.sampled_from([5, 60, 600]), max_size=2)),
            draw(st.lists(evidence, max_size=3)),
            _text(draw, 60),
        )
        for _ in range(draw(st.integers(1, 24)))
    ]


def _evidence(key: str, kind: str, confidence: float | None, link: str | None) -> Evidence:
    status = ("shipped", "pending", "lost")[len(key) % 3]
    content = {
        "doc": f"document {key} " * 30,
        "json": json.dumps({"order_id": "A-1", "status": status, "note": key}),
        "entity": f"status of A-1 per {key}",
    }[kind]
    metadata = (
        {"entity": "order_id=A-1", "field": "status", "value": status} if kind == "entity" else {}
    )
    return Evidence(
        evidence_id=f"ev-{key}",
        type=EvidenceType.TOOL_RESULT if kind == "json" and link else EvidenceType.RAG_DOC,
        source=EvidenceSource(kind=SourceKind.RAG, uri=f"kb://{key}"),
        content=content,
        confidence=confidence,
        metadata=metadata,
        links=EvidenceLinks(tool_call_id=link),
    )


def commits(
    history: list[Step], *, refer_to_first: bool, summary_upto: int
) -> list[SessionChanges]:
    """The session written step by step (one commit per step, as an app writes turns)."""
    state = AgentState("s", clock=SteppingClock(), id_generator=SequentialIdGenerator("h"))
    state.set_system_instruction("You answer questions about orders.")
    out = [state.take_changes()]
    counter = 0
    for n, step in enumerate(history):
        state.append_model_input(step.user)
        last_call = None
        if step.calls:
            calls = []
            for _ in step.calls:
                counter += 1
                calls.append(
                    ToolCallRequest(tool_call_id=f"c{counter}", name="lookup", raw_arguments="{}")
                )
            state.append_model_output(ModelOutput(tool_calls=calls, invocation=INV))
            state.append_tool_results(
                [
                    ToolResult(tool_call_id=c.tool_call_id, name="lookup", content="r" * size)
                    for c, size in zip(calls, step.calls, strict=True)
                ]
            )
            last_call = calls[-1].tool_call_id
        for kind, confidence, linked in step.evidences:
            counter += 1
            link = last_call if linked else None
            state.add_evidence(_evidence(f"{counter}", kind, confidence, link))
        state.append_model_output(ModelOutput(text=step.answer, invocation=INV))
        if n == 0 and refer_to_first and state.live_view().evidences:
            first = next(iter(state.live_view().evidences))
            state.put_context_block(
                ContextBlock(
                    block_id="pinned",
                    block_type=BlockType.MEMORY,
                    priority=Priority.HIGH,
                    refs=[Ref(evidence_id=first)],
                )
            )
        if n == summary_upto:
            messages = len(state.live_view().session.messages)
            state.set_summary(
                "Earlier: questions about order A-1.", from_index=0, to_index=messages - 1
            )
        out.append(state.take_changes())
    return out


@contextmanager
def newest_first(messages: int, evidences: int) -> Iterator[None]:
    """Cold calls read this many newest messages and evidences first."""
    saved = engine_core.TAIL_MESSAGES, engine_core.TAIL_EVIDENCES
    engine_core.TAIL_MESSAGES, engine_core.TAIL_EVIDENCES = messages, evidences
    try:
        yield
    finally:
        engine_core.TAIL_MESSAGES, engine_core.TAIL_EVIDENCES = saved


def _config(budget: int, policy: str = "keep_both_and_warn") -> RuntimeConfig:
    return RuntimeConfig(
        model_hint="gpt-4o",
        budget=BudgetConfig(max_input_tokens=budget + 100, reserved_reply_tokens=100),
        conflicts=ConflictConfig(policy=policy),  # type: ignore[arg-type]
    )


def _engine(store: Store, config: RuntimeConfig) -> ContextEngine:
    """An engine on ``store`` whose clock and ids are the same in every run."""
    return ContextEngine(
        store, config=config, clock=SteppingClock(), id_generator=SequentialIdGenerator("n")
    )


async def _prepare(
    store: Store, config: RuntimeConfig, question: str
) -> tuple[PrepareResult, ContextEngine]:
    engine = _engine(store, config)
    return await engine.prepare_turn("s", question), engine


def _kept(result: PrepareResult) -> list[tuple[object, ...]]:
    """The kept and degraded decisions, the new question's block id left out (a call done
    again on a longer part of the session gives its message another id)."""
    return [
        (d.action, d.reason, d.token_estimate, d.block_count, d.level, d.saved_tokens)
        if d.block_id.startswith("msg:n")
        else (d.block_id, d.action, d.reason, d.token_estimate, d.block_count, d.level)
        for d in result.report.prune_decisions
        if d.action != "dropped"
    ]


async def _write(store: Store, changes: list[SessionChanges]) -> MemoryStore:
    """Commit ``changes`` to ``store`` and to a MemoryStore (that holds the whole session
    for every read), which is returned."""
    whole_store = MemoryStore()
    for change in changes:
        await whole_store.commit("s", change)
        await store.commit("s", change)
    return whole_store


async def _both(
    tmp_path: Path, changes: list[SessionChanges], config: RuntimeConfig, question: str
) -> tuple[PrepareResult, PrepareResult, ContextEngine, SQLiteStore]:
    cold_store = SQLiteStore(tmp_path / "cold.db")
    whole_store = await _write(cold_store, changes)
    whole, _ = await _prepare(whole_store, config, question)
    cold, engine = await _prepare(cold_store, config, question)
    return whole, cold, engine, cold_store


def _assert_same(whole: PrepareResult, cold: PrepareResult) -> None:
    assert cold.assembled_input == whole.assembled_input
    assert _kept(cold) == _kept(whole)
    assert cold.report.conflicts == whole.report.conflicts
    assert cold.report.token_used == whole.report.token_used


@COLD_EXAMPLES
@given(
    history=histories(),
    budget=st.integers(300, 9000),
    sizes=st.tuples(st.integers(1, 12), st.integers(0, 12)),
    policy=st.sampled_from(["keep_both_and_warn", "prefer_tool_over_rag", "prefer_latest_by_at"]),
    refer_to_first=st.booleans(),
    summary_upto=st.integers(-1, 6),
)
def test_a_cold_call_on_the_newest_records_assembles_what_the_whole_session_gives(
    tmp_path_factory: pytest.TempPathFactory,
    history: list[Step],
    budget: int,
    sizes: tuple[int, int],
    policy: str,
    refer_to_first: bool,
    summary_upto: int,
) -> None:
    tmp_path = tmp_path_factory.mktemp("cold")
    changes = commits(history, refer_to_first=refer_to_first, summary_upto=summary_upto)
    config = _config(budget, policy)

    async def run() -> None:
        with newest_first(*sizes):
            whole, cold, engine, store = await _both(tmp_path, changes, config, "and now?")
        try:
            _assert_same(whole, cold)
            turns = await store.list_turns("s")
            doc = await store.get_session("s")
            assert doc is not None
            assert turns[-1].message_count == len(doc.session.messages)
            assert turns[-1].evidence_count == len(doc.evidences)
            # what a cold call did not read is reported, never silently gone
            unread = [d for d in cold.report.prune_decisions if d.block_id.startswith("history:")]
            assert sum(d.block_count for d in unread) == engine._entries["s"].unread.messages
        finally:
            await engine.close()
            await store.close()

    asyncio.run(run())


def _long_history(turns: int) -> list[Step]:
    return [
        Step(
            f"question {i} about order A-1 " + "alpha " * (i % 7),
            [40] if i % 5 == 0 else [],
            [("json" if i % 9 == 0 else "doc", (i % 4) / 4, i % 3 == 0)],
            f"answer {i} " + "beta " * (i % 11),
        )
        for i in range(turns)
    ]


async def test_a_cold_turn_on_a_long_session_reads_only_its_newest_records(tmp_path: Path) -> None:
    changes = commits(_long_history(400), refer_to_first=True, summary_upto=-1)
    whole, cold, engine, store = await _both(tmp_path, changes, _config(2000), "and now?")
    _assert_same(whole, cold)
    entry = engine._entries["s"]
    held = entry.doc
    assert len(held.session.messages) <= 2 * engine_core.TAIL_MESSAGES  # of 1,000+
    stored = await store.get_session("s")
    assert stored is not None
    assert entry.unread.messages + len(held.session.messages) == len(stored.session.messages)
    assert len(held.evidences) < 2 * engine_core.TAIL_EVIDENCES + 20  # of 400
    assert cold.report.prune_decisions[0].block_id.startswith("history:0..")
    # the next turns go on from there: a reply, then another question, as on the whole session
    reply = Message(role=Role.ASSISTANT, content="It shipped.", invocation=INV)
    await engine.commit_assistant_message("s", reply)
    again = await engine.prepare_turn("s", "and then?")
    whole_engine = ContextEngine(
        MemoryStore(),
        config=_config(2000),
        clock=SteppingClock(),
        id_generator=SequentialIdGenerator("w"),
    )
    for change in [*changes]:
        await whole_engine.store.commit("s", change)
    await whole_engine.prepare_turn("s", "and now?")
    await whole_engine.commit_assistant_message("s", reply)
    expected = await whole_engine.prepare_turn("s", "and then?")
    assert again.assembled_input == expected.assembled_input
    assert entry is engine._entries["s"] and entry.partial  # still the newest records only
    await engine.close()
    await store.close()


async def test_a_call_that_needs_the_whole_session_reads_it(tmp_path: Path) -> None:
    changes = commits(_long_history(120), refer_to_first=False, summary_upto=-1)
    _, _, engine, store = await _both(tmp_path, changes, _config(2000), "and now?")
    assert engine._entries["s"].partial
    # evidence of a tool call: the call's id is checked against every stored one, so the
    # session is read whole (evidence of no call is looked up by its key: see
    # test_a_cold_worker_records_replies_on_the_newest_records)
    evidence = await engine.ingest_evidence(
        "s",
        "a new document",
        EvidenceSource(kind=SourceKind.RAG),
        EvidenceType.RAG_DOC,
        links=EvidenceLinks(tool_call_id="c1"),
    )
    entry = engine._entries["s"]
    assert not entry.partial
    doc = await store.get_session("s")
    assert doc is not None and entry.doc == doc and evidence.evidence_id in doc.evidences
    await engine.close()
    await store.close()


async def test_a_budget_that_keeps_more_than_the_first_read_reads_more(tmp_path: Path) -> None:
    changes = commits(_long_history(150), refer_to_first=False, summary_upto=-1)
    with newest_first(4, 2):
        whole, cold, engine, store = await _both(tmp_path, changes, _config(20000), "and now?")
    _assert_same(whole, cold)
    assert engine._tail_sizes["s"] is not None and engine._tail_sizes["s"][0] > 4
    await engine.close()
    await store.close()


@pytest.mark.parametrize("layout", [3, 4])
def test_a_file_of_an_earlier_layout_is_upgraded_and_read_newest_first(
    tmp_path: Path, layout: int
) -> None:
    """``layout3.db`` and ``layout4.db`` were written by earlier layouts of ce-core (``PRAGMA
    user_version`` 3: before partial reads; 4: before token counts were kept): a session of
    60 turns with tool calls and results, retrieved documents linked to calls, JSON facts that
    conflict, a model-written summary of a message and a block pinning the first evidence (see
    ``data/make_layout.py``)."""
    name = f"layout{layout}"
    db = tmp_path / f"{name}.db"
    shutil.copyfile(DATA / f"{name}.db", db)
    with sqlite3.connect(db) as conn:
        (before,) = conn.execute("PRAGMA user_version").fetchone()
    conn.close()
    assert before == layout

    async def run() -> None:
        store = SQLiteStore(db)
        with sqlite3.connect(db) as conn:
            (after,) = conn.execute("PRAGMA user_version").fetchone()
            system = conn.execute("SELECT COUNT(*) FROM messages WHERE role = 'system'").fetchone()
            facts = conn.execute("SELECT COUNT(*) FROM evidences WHERE facts = 1").fetchone()
            links = conn.execute("SELECT COUNT(*) FROM evidences WHERE link IS NOT NULL").fetchone()
        conn.close()
        assert after == sqlite_module.USER_VERSION == 5
        doc = await store.get_session(name)
        assert doc is not None
        assert system == (sum(m.role is Role.SYSTEM for m in doc.session.messages),)
        assert facts == (sum(may_state_facts(e) for e in doc.evidences.values()),)
        assert (
            links[0]
            == sum(
                bool(e.links.tool_call_id or e.metadata.get("summary_of"))
                for e in doc.evidences.values()
            )
            > 0
        )
        whole_store = MemoryStore()
        await whole_store.put_session(name, doc)
        config = _config(600)
        with newest_first(8, 4):
            engine = _engine(store, config)
            cold = await engine.prepare_turn(name, "what is the status of A-1?")
        whole_engine = _engine(whole_store, config)
        whole = await whole_engine.prepare_turn(name, "what is the status of A-1?")
        _assert_same(whole, cold)
        assert cold.report.conflicts  # the old JSON facts still conflict with the new ones
        assert engine._entries[name].partial
        await engine.close()
        await store.close()
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT tokens FROM messages WHERE tokens IS NOT NULL").fetchall()
        conn.close()
        # the question's row keeps what the cold call tokenized (the upgraded rows had none)
        assert len(rows) == 1 and "tiktoken:o200k_base" in json.loads(rows[0][0])

    asyncio.run(run())


async def test_a_streamed_reply_on_the_newest_records_keeps_its_chunks(tmp_path: Path) -> None:
    changes = commits(_long_history(120), refer_to_first=False, summary_upto=-1)
    _, _, engine, store = await _both(tmp_path, changes, _config(2000), "and now?")
    assert engine._entries["s"].partial
    for i, chunk in enumerate(["It ", "shipped", "."]):
        await engine.commit_assistant_chunk("s", chunk, i)
    await engine.finalize_assistant_message("s", invocation=INV)
    doc = await store.get_session("s")
    assert doc is not None and doc.session.messages[-1].content == "It shipped."
    assert engine._entries["s"].partial  # the reply did not need the whole session
    await engine.close()
    await store.close()


async def test_a_cold_worker_on_either_store_assembles_from_the_newest_records(
    opener: Callable[[], Store],
) -> None:
    changes = commits(_long_history(200), refer_to_first=True, summary_upto=-1)
    writer = opener()
    whole_store = await _write(writer, changes)
    await writer.close()
    whole, _ = await _prepare(whole_store, _config(1500), "and now?")
    cold, engine = await _prepare(opener(), _config(1500), "and now?")
    _assert_same(whole, cold)
    assert engine._entries["s"].partial
    await engine.close()
    await engine.store.close()


async def test_a_cold_worker_takes_the_token_counts_another_worker_stored(
    opener: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that has not seen a session tokenizes only what no worker counted before:
    the counts the first worker computed were stored with its question, and read back with
    the newest records; what it assembles is what a whole read of the session gives."""
    import tiktoken

    changes = commits(_long_history(120), refer_to_first=True, summary_upto=-1)
    writer = opener()
    await _write(writer, changes)  # stored without the engine: no counts yet
    await writer.close()
    encoded: list[str] = []
    encode = tiktoken.Encoding.encode_ordinary

    def counting(self: tiktoken.Encoding, text: str) -> list[int]:
        encoded.append(text)
        return encode(self, text)

    monkeypatch.setattr(tiktoken.Encoding, "encode_ordinary", counting)
    monkeypatch.setattr(tokens, "_MEMO", {})  # a new process: no counts read yet
    config = _config(3000)
    store = opener()
    _, engine = await _prepare(store, config, "and now?")
    await engine.close()
    doc = await store.get_session("s")
    await store.close()
    assert doc is not None and doc.session.messages[-1].content == "and now?"
    first_worker = len(encoded)
    assert first_worker > 40  # every text of what it could keep

    whole_store = MemoryStore()
    await whole_store.put_session("s", doc)
    whole, _ = await _prepare(whole_store, config, "and later?")
    encoded.clear()
    monkeypatch.setattr(tokens, "_MEMO", {})  # another new process
    store = opener()
    cold, engine = await _prepare(store, config, "and later?")
    await engine.close()
    await store.close()
    assert engine._entries["s"].partial
    _assert_same(whole, cold)
    assert "and later?" in encoded and len(encoded) <= 3, encoded


async def test_the_counts_of_a_deferred_call_are_stored_by_the_commit_that_takes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin's ``prepare_call(defer_commit=True)`` leaves its records to the recording of
    the reply: the counts it computed go with them."""
    monkeypatch.setattr(tokens, "_MEMO", {})
    store = SQLiteStore(tmp_path / "deferred.db")
    engine = _engine(store, _config(1500))
    question = "a question whose tokens are counted once, by the first process"
    passed = [Message(role=Role.USER, content=question)]
    await engine.prepare_call("s", passed, defer_commit=True)
    usage = ModelUsage(model_usage_id="u1", provider="openai", model="gpt-4o", total_tokens=9)
    reply = Message(role=Role.ASSISTANT, content="ok")
    await engine.record_model_call("s", usage, reply=reply)
    await engine.close()
    await store.close()
    with sqlite3.connect(tmp_path / "deferred.db") as conn:
        rows = conn.execute("SELECT body, tokens FROM messages WHERE tokens IS NOT NULL")
        stored = [(json.loads(body)["content"], json.loads(counts)) for body, counts in rows]
    conn.close()
    assert [content for content, _ in stored] == [question]
    assert tokens.text_digest(question) in stored[0][1]["tiktoken:o200k_base"]


DOC = EvidenceSource(kind=SourceKind.RAG, uri="kb://handbook")


async def _record_three_replies(store: Store, *, cold: bool) -> None:
    """A first reply (framework id ``fw-1``, output "Same answer.") and a retrieved document,
    a long history after them, then a new question and three replies: the same text again
    without an id, the first reply's id again, and one with a tool call (the last needs the
    whole session); before the last, the same document and a new one are ingested."""
    writer = _engine(store, _config(1500))
    source = EvidenceSource(kind=SourceKind.LLM, name="gpt-4o")
    same = ("Same answer.", source)

    def usage(key: str) -> ModelUsage:
        return ModelUsage(model_usage_id=key, provider="openai", model="gpt-4o", total_tokens=9)

    def reply(message_id: str | None = None, **fields: object) -> Message:
        return Message(role=Role.ASSISTANT, content="Same answer.", message_id=message_id, **fields)

    await writer.record_model_call("s", usage("u0"), reply=reply("fw-1"), output=same)
    await writer.ingest_evidence("s", "An old document.", DOC, EvidenceType.RAG_DOC)
    await writer.close()
    for change in commits(_long_history(150), refer_to_first=False, summary_upto=-1)[1:]:
        await store.commit("s", change)
    engine = _engine(store, _config(1500)) if cold else writer
    await engine.prepare_turn("s", "and now?")
    await engine.record_model_call("s", usage("u1"), reply=reply(), output=same)
    await engine.record_model_call("s", usage("u1"), output=same)  # recorded again
    await engine.record_model_call("s", usage("u2"), reply=reply("fw-1"), output=same)
    for text in ("An old document.", "A new document."):  # the first is stored already
        await engine.ingest_evidence("s", text, DOC, EvidenceType.RAG_DOC)
    if cold:
        assert engine._entries["s"].partial  # no whole read so far
    call = ToolCallRequest(tool_call_id="c-new", name="lookup", raw_arguments="{}")
    await engine.record_model_call("s", usage("u3"), reply=reply(None, tool_calls=[call]))
    if cold:
        assert not engine._entries["s"].partial  # the reply's call ids need every stored one
    await engine.close()


async def test_a_cold_worker_records_replies_on_the_newest_records(
    opener: Callable[[], Store],
) -> None:
    """``record_model_call`` and ``ingest_evidence`` on a process that has not read the
    session: the reply's id and the evidence's deduplication key are looked up in the store,
    so what is stored is what an engine holding the whole session stores."""
    cold_store = opener()
    await _record_three_replies(cold_store, cold=True)
    cold = await cold_store.get_session("s")
    await cold_store.close()
    whole_store = MemoryStore()
    await _record_three_replies(whole_store, cold=False)
    whole = await whole_store.get_session("s")
    assert cold is not None and whole is not None

    def messages(doc: SessionDocument) -> list[tuple[object, ...]]:
        return [
            (m.role, m.content, m.message_id if m.message_id == "fw-1" else None)
            for m in doc.session.messages
        ]

    def evidences(doc: SessionDocument) -> list[tuple[object, ...]]:
        return [(e.type, e.content, e.links.model_usage_id) for e in doc.evidences.values()]

    assert messages(cold) == messages(whole)
    assert evidences(cold) == evidences(whole)
    usages = [u.model_usage_id for u in cold.session.model_usage]
    assert usages == [u.model_usage_id for u in whole.session.model_usage]
    assert usages == ["u0", "u1", "u2", "u3"]
    docs = [e.content for e in cold.evidences.values() if e.source.uri == "kb://handbook"]
    assert docs == ["An old document.", "A new document."]  # the old one not stored twice
    outputs = [e for e in cold.evidences.values() if e.type is EvidenceType.LLM_OUTPUT]
    assert len(outputs) == 1 and outputs[0].links.model_usage_id == "u0"  # deduplicated
    assert [m.message_id for m in cold.session.messages].count("fw-1") == 1
    # the reply with the stored id was not written again
    assert [(m.content, bool(m.tool_calls)) for m in cold.session.messages[-3:]] == [
        ("and now?", False),
        ("Same answer.", False),
        ("Same answer.", True),
    ]


def test_the_blocking_engine_reads_the_newest_records_too(tmp_path: Path) -> None:
    changes = commits(_long_history(200), refer_to_first=False, summary_upto=-1)

    async def fill() -> PrepareResult:
        store = SQLiteStore(tmp_path / "cold.db")
        whole_store = await _write(store, changes)
        await store.close()
        whole, engine = await _prepare(whole_store, _config(1500), "and now?")
        await engine.close()
        return whole

    whole = asyncio.run(fill())
    store = SQLiteStore(tmp_path / "cold.db")
    engine = _engine(store, _config(1500))
    cold = engine.sync.prepare_turn("s", "and now?")
    _assert_same(whole, cold)
    assert engine._entries["s"].partial
    engine.sync.close()
    asyncio.run(store.close())


def _pending(shape: str, history: list[Message], trim: int) -> list[Message]:
    """What a framework passes to a cold worker's first call (``shape``) after ``history``."""
    question = Message(role=Role.USER, content="and now?")
    if shape == "trimmed":  # a framework that keeps a window of its own
        system, rest = history[:1], history[1:]
        return [*system, *rest[min(trim, len(rest)) :], question]
    if shape == "instruction":  # another agent's system prompt on the same session
        return [Message(role=Role.SYSTEM, content="You are terse."), *history[1:], question]
    if shape == "taken_id":  # a framework id the session stored long ago for other content
        return [*history, question.model_copy(update={"message_id": "h1"})]
    if shape == "fresh_id":
        return [*history, question.model_copy(update={"message_id": "q-new"})]
    if shape == "repeat":  # the first question asked again
        return [*history, history[1].model_copy()]
    if shape == "tool_call":  # a reply with a call id the session used before, not recorded
        call = ToolCallRequest(tool_call_id="c1", name="lookup", raw_arguments="{}")
        return [*history, question, Message(role=Role.ASSISTANT, content="", tool_calls=[call])]
    return [*history, question]


def _stored_messages(doc_messages: list[Message]) -> list[tuple[object, ...]]:
    """The session's messages without the ids an engine generated."""
    return [
        (
            m.role,
            m.content,
            m.tool_call_id,
            [c.tool_call_id for c in m.tool_calls or ()],
            sorted(m.meta),
        )
        for m in doc_messages
    ]


SHAPES = ["plain", "trimmed", "instruction", "taken_id", "fresh_id", "repeat", "tool_call"]


@COLD_EXAMPLES
@given(
    history=histories(),
    budget=st.integers(300, 9000),
    sizes=st.tuples(st.integers(1, 12), st.integers(0, 12)),
    shape=st.sampled_from(SHAPES),
    trim=st.integers(1, 6),
)
def test_a_cold_prepare_call_on_the_newest_records_does_what_the_whole_session_does(
    tmp_path_factory: pytest.TempPathFactory,
    history: list[Step],
    budget: int,
    sizes: tuple[int, int],
    shape: str,
    trim: int,
) -> None:
    """A framework's whole history, and more, passed to a worker that has not read the
    session: the input, the report and what is stored are those of a call on the whole
    session, whether the history lines up with the newest records or not."""
    tmp_path = tmp_path_factory.mktemp("coldcall")
    changes = commits(history, refer_to_first=False, summary_upto=-1)
    config = _config(budget)

    async def run() -> None:
        cold_store = SQLiteStore(tmp_path / "cold.db")
        whole_store = await _write(cold_store, changes)
        doc = await whole_store.get_session("s")
        assert doc is not None
        pending = _pending(shape, as_passed(doc.session.messages), trim)
        engines = [_engine(s, config) for s in (whole_store, cold_store)]
        with newest_first(*sizes):
            whole, cold = [await e.prepare_call("s", pending) for e in engines]
        try:
            _assert_same(whole, cold)
            assert cold.report.degradations == whole.report.degradations
            after = [await s.get_session("s") for s in (whole_store, cold_store)]
            assert after[0] is not None and after[1] is not None
            assert _stored_messages(after[1].session.messages) == _stored_messages(
                after[0].session.messages
            )
            if shape in ("plain", "fresh_id", "taken_id", "repeat", "instruction"):
                # the history lines up with the newest records: never read whole
                assert engines[1]._tail_sizes.get("s", ()) is not None
        finally:
            for engine in engines:
                await engine.close()
            await cold_store.close()

    asyncio.run(run())


async def test_a_cold_prepare_call_on_a_long_session_reads_only_its_newest_records(
    tmp_path: Path,
) -> None:
    changes = commits(_long_history(400), refer_to_first=True, summary_upto=-1)
    store = SQLiteStore(tmp_path / "cold.db")
    whole_store = await _write(store, changes)
    doc = await whole_store.get_session("s")
    assert doc is not None
    history = as_passed(doc.session.messages)
    engines = [_engine(s, _config(2000)) for s in (whole_store, store)]
    question = Message(role=Role.USER, content="and now?")
    whole, cold = [await e.prepare_call("s", [*history, question]) for e in engines]
    _assert_same(whole, cold)
    entry = engines[1]._entries["s"]
    assert entry.partial and len(entry.doc.session.messages) <= 2 * engine_core.TAIL_MESSAGES
    # the model answers; the framework passes its history with the answer and a new question
    answer = Message(role=Role.ASSISTANT, content="It shipped.", invocation=INV)
    again = [*history, question, answer, Message(role=Role.USER, content="and then?")]
    for engine in engines:
        await engine.commit_assistant_message("s", answer)
    whole, cold = [await e.prepare_call("s", again) for e in engines]
    _assert_same(whole, cold)
    assert engines[1]._entries["s"].partial
    stored = [await s.get_session("s") for s in (whole_store, store)]
    assert stored[0] is not None and stored[1] is not None
    assert _stored_messages(stored[1].session.messages) == _stored_messages(
        stored[0].session.messages
    )
    for engine in engines:
        await engine.close()
    await store.close()


async def test_a_cold_prepare_call_matches_the_forms_a_rag_app_keeps_of_its_turns(
    tmp_path: Path,
) -> None:
    """A RAG app's history keeps its turns in another form than the session: the prompt
    with the retrieved document inline (the session holds a pointer to its evidence), or the
    bare question (the session holds the prompt rendered around it). A cold worker matches
    them against its newest records, as a whole read does, and reads no more."""
    changes = commits(_long_history(150), refer_to_first=False, summary_upto=-1)
    store = SQLiteStore(tmp_path / "cold.db")
    whole_store = await _write(store, changes)
    doc = await whole_store.get_session("s")
    assert doc is not None
    history = as_passed(doc.session.messages)
    document = "Orders ship from the Lyon warehouse within two days."
    inline = Message(role=Role.USER, content=f"Context: {document}\nQuestion: from where?")
    rendered = "Answer from the handbook only.\nQuestion: how long does shipping take?"
    bare = Message(role=Role.USER, content="how long does shipping take?")
    answers = [Message(role=Role.ASSISTANT, content=t, invocation=INV) for t in ("Lyon.", "2d")]
    usage = ModelUsage(model_usage_id="u1", provider="openai", model="gpt-4o", total_tokens=9)
    for target in (whole_store, store):  # one turn of each form, served by an engine
        writer = _engine(target, _config(1500))
        await writer.ingest_evidence("s", document, DOC, EvidenceType.RAG_DOC)
        await writer.prepare_call("s", [*history, inline])
        await writer.record_model_call("s", usage, reply=answers[0])
        turn = [*history, inline, answers[0], Message(role=Role.USER, content=rendered)]
        await writer.prepare_call("s", turn)
        await writer.commit_assistant_message("s", answers[1])
        await writer.close()
    stored = await store.get_session("s")
    assert stored is not None and f"Context: {document}" not in stored.session.messages[-4].content
    app = [*history, inline, answers[0], bare, answers[1], Message(role=Role.USER, content="ok?")]
    engines = [_engine(s, _config(1500)) for s in (whole_store, store)]
    whole, cold = [await e.prepare_call("s", app) for e in engines]
    _assert_same(whole, cold)
    assert engines[1]._entries["s"].partial  # matched on the newest records
    after = [await s.get_session("s") for s in (whole_store, store)]
    assert after[0] is not None and after[1] is not None
    assert _stored_messages(after[1].session.messages) == _stored_messages(
        after[0].session.messages
    )
    for engine in engines:
        await engine.close()
    await store.close()


async def test_a_cold_call_inside_a_long_tool_round_reads_back_to_its_question(
    tmp_path: Path,
) -> None:
    """The newest records hold tool results only: the question of the run they belong to is
    older, so the call reads more until it holds it (the run's tool chain stays pinned)."""
    state = AgentState("s", clock=SteppingClock(), id_generator=SequentialIdGenerator("h"))
    state.set_system_instruction("You look things up.")
    for turn in range(30):
        state.append_model_input(f"question {turn}")
        state.append_model_output(ModelOutput(text=f"answer {turn}", invocation=INV))
    state.append_model_input("look up everything")
    calls = [
        ToolCallRequest(tool_call_id=f"k{i}", name="lookup", raw_arguments="{}") for i in range(12)
    ]
    state.append_model_output(ModelOutput(tool_calls=calls, invocation=INV))
    state.append_tool_results(
        [ToolResult(tool_call_id=c.tool_call_id, name="lookup", content="r" * 40) for c in calls]
    )
    store = SQLiteStore(tmp_path / "cold.db")
    whole_store = await _write(store, [state.take_changes()])
    doc = await whole_store.get_session("s")
    assert doc is not None
    pending = as_passed(doc.session.messages)
    engines = [_engine(s, _config(600)) for s in (whole_store, store)]
    with newest_first(4, 0):
        whole, cold = [await e.prepare_call("s", pending) for e in engines]
    _assert_same(whole, cold)
    sizes = engines[1]._tail_sizes["s"]
    assert sizes is not None and sizes[0] >= 16  # grew until it held the run's question
    for engine in engines:
        await engine.close()
    await store.close()


@pytest.mark.parametrize("shape", ["plain", "taken_id", "trimmed"])
async def test_a_cold_prepare_call_on_either_store_does_what_the_whole_session_does(
    opener: Callable[[], Store], shape: str
) -> None:
    changes = commits(_long_history(200), refer_to_first=True, summary_upto=-1)
    writer = opener()
    whole_store = await _write(writer, changes)
    await writer.close()
    doc = await whole_store.get_session("s")
    assert doc is not None
    pending = _pending(shape, as_passed(doc.session.messages), 3)
    stores = [whole_store, opener()]
    engines = [_engine(s, _config(1500)) for s in stores]
    whole, cold = [await e.prepare_call("s", pending) for e in engines]
    _assert_same(whole, cold)
    assert cold.report.degradations == whole.report.degradations
    after = [await s.get_session("s") for s in stores]
    assert after[0] is not None and after[1] is not None
    assert _stored_messages(after[1].session.messages) == _stored_messages(
        after[0].session.messages
    )
    assert engines[1]._entries["s"].partial == (shape != "trimmed")
    for engine in engines:
        await engine.close()
    await stores[1].close()


def test_counts_of_two_calls_committed_together_are_both_kept() -> None:
    """A deferred call's counts ride with its records; the call whose commit takes them adds
    its own beside them (on a record without counts, else joined), never over them."""
    from ce.core.engine._carry import attach_counts

    question = Message(role=Role.USER, content="q", message_id="m1")
    changes = SessionChanges(messages=[question])
    first: dict[str, dict[str, int]] = {"tiktoken:o200k_base": {"d1": 1}}
    attach_counts(changes, first)
    assert first == {} and json.loads(changes.token_counts["m1"]) == {
        "tiktoken:o200k_base": {"d1": 1}
    }
    attach_counts(changes, {"tiktoken:o200k_base": {"d2": 2}, "tiktoken:cl100k_base": {"d3": 3}})
    assert json.loads(changes.token_counts["m1"]) == {
        "tiktoken:o200k_base": {"d1": 1, "d2": 2},
        "tiktoken:cl100k_base": {"d3": 3},
    }
    reply = Message(role=Role.ASSISTANT, content="r", message_id="m2")
    changes.messages.append(reply)
    attach_counts(changes, {"tiktoken:o200k_base": {"d4": 4}})
    assert json.loads(changes.token_counts["m2"]) == {"tiktoken:o200k_base": {"d4": 4}}
    attach_counts(SessionChanges(), {"tiktoken:o200k_base": {"d5": 5}})  # no record: none
