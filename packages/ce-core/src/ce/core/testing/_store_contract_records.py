"""The part of :class:`~ce.core.testing.StoreContract` about each kind of record (evidence,
blocks, tool runs, usage, tasks, turns), catching up, listing, isolation and deletion;
with the helpers both parts use."""

from __future__ import annotations

import pytest

from ce.core.errors import SchemaValidationError, VersionConflictError
from ce.core.primitives import parse_iso
from ce.core.schema import (
    BlockType,
    EvidenceType,
    Message,
    MessageIndexRange,
    Priority,
    Role,
    RunState,
    RunStatus,
    SessionDocument,
    SourceKind,
    Summary,
    TaskStatus,
)
from ce.core.state import AgentState
from ce.core.stores.base import (
    BlockFilter,
    EvidenceFilter,
    SessionChanges,
    SessionUpdate,
    Store,
)
from ce.core.testing import records

__all__ = ["RecordContract", "caught_up", "document_of", "message_ids_of"]


async def document_of(store: Store, session_id: str) -> SessionDocument:
    doc = await store.get_session(session_id)
    assert doc is not None, f"session {session_id!r} is missing"
    return doc


def caught_up(
    session_id: str, copy: SessionDocument | None, update: SessionUpdate
) -> SessionDocument:
    """What a reader holding ``copy`` of the session has after applying ``update``."""
    if copy is None or update.complete:
        state = AgentState(session_id)
    else:
        state = AgentState.from_document(copy)
    state.absorb(update.changes)
    return state.document


async def message_ids_of(store: Store, session_id: str) -> list[str | None]:
    return [m.message_id for m in (await document_of(store, session_id)).session.messages]


class RecordContract:
    """Mixed into :class:`~ce.core.testing.StoreContract` (see there)."""

    async def test_append_messages_gives_every_message_an_id(self, store: Store) -> None:
        await store.append_messages("s1", [Message(role=Role.USER, content="a")] * 3)
        ids = await message_ids_of(store, "s1")
        assert all(ids) and len(set(ids)) == 3

    async def test_patch_session_validates_and_applies(self, store: Store) -> None:
        patch = {
            "messages": [{"role": "user", "content": "hi", "message_id": "m1"}],
            "turns": [records.turn("t1").model_dump(mode="json")],
            "tool_calls": [{"tool_call_id": "c1", "tool": "t", "provider": {"kind": "mcp"}}],
            "summary": {
                "content": "s",
                "updated_at": "2026-01-01T00:00:00+00:00",
                "message_index_range": {"from_index": 0, "to_index": 0},
            },
            "run": RunState(status=RunStatus.PREPARING),
            "meta": None,
        }
        assert (await store.patch_session("s1", patch)).version == 1
        doc = await document_of(store, "s1")
        assert doc.session.messages == [Message(role=Role.USER, content="hi", message_id="m1")]
        assert [c.tool_call_id for c in doc.session.tool_state.tool_calls] == ["c1"]
        assert doc.session.summary is not None and doc.session.summary.content == "s"
        assert doc.session.run.status is RunStatus.PREPARING
        assert await store.list_turns("s1") == [records.turn("t1")]

        with pytest.raises(SchemaValidationError) as info:
            await store.patch_session("s1", {"messages": [], "colour": "red"})
        assert info.value.errors == [("colour", "unknown patch key")]
        with pytest.raises(SchemaValidationError) as info:
            await store.patch_session(
                "s1", {"messages": [{"role": "user", "message_id": "m2"}, {"role": "bogus"}]}
            )
        assert [path for path, _ in info.value.errors] == ["messages.1.role"]
        assert await store.get_session("s1") == doc

    async def test_put_and_get_evidence(self, store: Store) -> None:
        evidence = records.evidence("e1", confidence=0.5, metadata={"uri": "https://x"})
        assert await store.put_evidence("s1", evidence) == "e1"
        assert await store.get_evidence("s1", "e1") == evidence
        assert await store.get_evidence("s1", "e2") is None
        assert await store.get_evidence("s2", "e1") is None

    async def test_list_evidences_filters(self, store: Store) -> None:
        evidences = [
            records.evidence("doc-old", created_at="2026-01-01T00:00:00Z", metadata={"lang": "en"}),
            records.evidence(
                "tool",
                EvidenceType.TOOL_RESULT,
                SourceKind.TOOL,
                created_at="2026-01-02T00:00:00+00:00",
                metadata={"lang": "fr", "n": 1},
            ),
            records.evidence("undated", EvidenceType.USER_INPUT, SourceKind.USER),
            records.evidence(
                "doc-new",
                created_at="2026-01-03T09:00:00+09:00",
                metadata={"lang": "en", "n": 1},
            ),
            records.evidence(
                "llm", EvidenceType.LLM_OUTPUT, SourceKind.LLM, created_at="2026-01-04"
            ),
        ]
        for evidence in evidences:
            await store.put_evidence("s1", evidence)

        async def ids(flt: EvidenceFilter | None) -> list[str]:
            return [e.evidence_id for e in await store.list_evidences("s1", flt)]

        assert await store.list_evidences("s1") == evidences
        assert await ids(EvidenceFilter(types=[EvidenceType.RAG_DOC])) == ["doc-old", "doc-new"]
        assert await ids(EvidenceFilter(source_kinds=[SourceKind.TOOL, SourceKind.LLM])) == [
            "tool",
            "llm",
        ]
        assert await ids(EvidenceFilter(since="2026-01-02T00:00:00+00:00")) == [
            "tool",
            "doc-new",
            "llm",
        ]
        assert await ids(EvidenceFilter(until="2026-01-02T12:00:00+00:00")) == [
            "doc-old",
            "tool",
        ]
        assert await ids(
            EvidenceFilter(since="2026-01-02T01:00:00+00:00", until="2026-01-03T00:00:00Z")
        ) == ["doc-new"]
        assert await ids(EvidenceFilter(tags={"lang": "en"})) == ["doc-old", "doc-new"]
        assert await ids(EvidenceFilter(tags={"lang": "en", "n": "1"})) == ["doc-new"]
        assert await ids(EvidenceFilter(limit=2)) == ["doc-old", "tool"]
        assert await ids(EvidenceFilter(types=[EvidenceType.RAG_DOC], limit=1)) == ["doc-old"]
        assert await ids(EvidenceFilter(types=[EvidenceType.SKILL_OUTPUT])) == []

    async def test_put_context_blocks_upserts_in_place(self, store: Store) -> None:
        blocks = [records.block("b1"), records.block("b2"), records.block("b3")]
        assert (await store.put_context_blocks("s1", blocks)).version == 1
        changed = records.block("b2", BlockType.MEMORY, Priority.HIGH, content="rewritten")
        result = await store.put_context_blocks("s1", [changed, records.block("b4")])
        assert result.version == 2
        expected = [blocks[0], changed, blocks[2], records.block("b4")]
        assert await store.list_context_blocks("s1") == expected
        assert (await document_of(store, "s1")).context_blocks == expected
        assert (await store.put_context_blocks("s1", [changed])).version == 2
        # within one call the last record of an id wins
        last = records.block("b5", content="second")
        assert (await store.put_context_blocks("s1", [records.block("b5"), last])).version == 3
        assert (await store.list_context_blocks("s1"))[-1] == last

    async def test_list_context_blocks_filters(self, store: Store) -> None:
        await store.put_context_blocks(
            "s1",
            [
                records.block("low", BlockType.CONVERSATION, Priority.LOW),
                records.block("must", BlockType.INSTRUCTION, Priority.MUST),
                records.block("medium", BlockType.EVIDENCE, Priority.MEDIUM),
                records.block("high", BlockType.EVIDENCE, Priority.HIGH),
            ],
        )

        async def ids(flt: BlockFilter) -> list[str]:
            return [b.block_id for b in await store.list_context_blocks("s1", flt)]

        assert await ids(BlockFilter(block_types=[BlockType.EVIDENCE])) == ["medium", "high"]
        assert await ids(BlockFilter(priorities=[Priority.LOW, Priority.MUST])) == ["low", "must"]
        assert await ids(BlockFilter(min_priority=Priority.HIGH)) == ["must", "high"]
        assert await ids(BlockFilter(min_priority=Priority.LOW)) == [
            "low",
            "must",
            "medium",
            "high",
        ]
        assert await ids(BlockFilter(limit=1)) == ["low"]
        assert await ids(BlockFilter(block_types=[BlockType.PLAN])) == []

    async def test_append_tool_calls_and_model_usage(self, store: Store) -> None:
        await store.append_tool_calls("s1", [records.tool_call("c1"), records.tool_call("c2")])
        await store.append_model_usage("s1", [records.usage("u1")])
        await store.append_tool_calls("s1", [records.tool_call("c2"), records.tool_call("c3")])
        await store.append_model_usage("s1", [records.usage("u1"), records.usage("u2")])
        doc = await document_of(store, "s1")
        assert doc.session.tool_state.tool_calls == [
            records.tool_call(c) for c in ("c1", "c2", "c3")
        ]
        assert doc.session.model_usage == [records.usage("u1"), records.usage("u2")]
        assert await store.get_version("s1") == 4

    async def test_upsert_tasks(self, store: Store) -> None:
        await store.upsert_tasks("s1", [records.task("t1"), records.task("t2")])
        done = records.task("t1", TaskStatus.COMPLETED)
        assert (await store.upsert_tasks("s1", [done, records.task("t3")])).version == 2
        doc = await document_of(store, "s1")
        assert doc.session.task_state.todo_list.tasks == [
            done,
            records.task("t2"),
            records.task("t3"),
        ]
        assert (await store.upsert_tasks("s1", [done])).version == 2

    # -- turn records ---------------------------------------------------------------------------

    async def test_turns_are_appended_in_order_and_idempotent(self, store: Store) -> None:
        first = SessionChanges(turns=[records.turn("t1"), records.turn("t2", "call")])
        assert (await store.commit("s1", first)).version == 1
        assert await store.list_sessions() == ["s1"]
        assert await store.list_turns("s1") == first.turns
        assert (await store.commit("s1", first)).version == 1

        # a stored turn_id wins over a new record carrying it; within one commit the first wins
        rewritten = records.turn("t1", message_count=99)
        changes = SessionChanges(turns=[rewritten, records.turn("t3"), records.turn("t3", "call")])
        assert (await store.commit("s1", changes)).version == 2
        assert await store.list_turns("s1") == [*first.turns, records.turn("t3")]
        assert (await store.commit("s1", SessionChanges(turns=[rewritten]))).version == 2

        for n in range(4, 13):
            await store.commit(
                "s1",
                SessionChanges(messages=[records.message(f"m{n}")], turns=[records.turn(f"t{n}")]),
            )
        assert [t.turn_id for t in await store.list_turns("s1")] == [f"t{n}" for n in range(1, 13)]
        assert await store.get_version("s1") == 11

    async def test_list_turns_limit_keeps_the_newest(self, store: Store) -> None:
        for n in range(5):
            await store.commit("s1", SessionChanges(turns=[records.turn(f"t{n}")]))

        async def ids(limit: int | None) -> list[str]:
            return [t.turn_id for t in await store.list_turns("s1", limit=limit)]

        assert await ids(None) == ["t0", "t1", "t2", "t3", "t4"]
        assert await ids(2) == ["t3", "t4"]
        assert await ids(1) == ["t4"]
        assert await ids(5) == await ids(50) == await ids(None)
        assert await ids(0) == []
        with pytest.raises(ValueError):
            await store.list_turns("s1", limit=-1)

    async def test_get_turn(self, store: Store) -> None:
        changes = records.rich_changes()
        await store.commit("s1", changes)
        await store.commit("s1", SessionChanges(turns=[records.turn("t2")]))
        assert await store.get_turn("s1", "turn-1") == changes.turns[0]
        assert await store.get_turn("s1", "t2") == records.turn("t2")
        assert await store.get_turn("s1", "t3") is None
        assert await store.get_turn("s2", "t2") is None

    async def test_turns_are_kept_beside_the_document(self, store: Store) -> None:
        changes = SessionChanges(messages=[records.message("m1")], turns=[records.turn("t1")])
        await store.commit("s1", changes)
        assert await store.get_session("s1") == records.expected_document("s1", changes)
        await store.commit("s2", SessionChanges(turns=[records.turn("t1")]))
        assert await store.get_session("s2") == records.expected_document("s2", SessionChanges())

    async def test_turns_of_sessions_are_isolated(self, store: Store) -> None:
        await store.commit("s1", SessionChanges(turns=[records.turn("t1"), records.turn("t2")]))
        other = records.turn("t1", kind="call", message_count=7)
        assert (await store.commit("s2", SessionChanges(turns=[other]))).version == 1
        assert await store.list_turns("s1") == [records.turn("t1"), records.turn("t2")]
        assert await store.list_turns("s2") == [other]
        assert await store.get_turn("s2", "t2") is None
        assert await store.delete_session("s1")
        assert await store.list_turns("s2") == [other]
        assert await store.get_turn("s2", "t1") == other

    async def test_turns_respect_expected_version(self, store: Store) -> None:
        await store.commit("s1", SessionChanges(turns=[records.turn("t1")]))
        with pytest.raises(VersionConflictError):
            await store.commit("s1", SessionChanges(turns=[records.turn("t2")]), 0)
        assert await store.list_turns("s1") == [records.turn("t1")]
        result = await store.commit("s1", SessionChanges(turns=[records.turn("t2")]), 1)
        assert result.version == 2

    # -- incremental reads ----------------------------------------------------------------------

    async def test_read_since_an_absent_session_is_none(self, store: Store) -> None:
        assert await store.read_since("missing") is None
        assert await store.read_since("missing", 3, "epoch") is None

    async def test_read_since_zero_reads_the_whole_session(self, store: Store) -> None:
        changes = records.rich_changes()
        await store.commit("s1", changes)
        update = await store.read_since("s1")
        assert update is not None and update.complete and update.version == 1
        assert update.changes.turns == []
        assert caught_up("s1", None, update) == records.expected_document("s1", changes)

    async def test_read_since_catches_a_reader_up(self, store: Store) -> None:
        await store.commit(
            "s1",
            SessionChanges(
                messages=[records.message("m1")],
                context_blocks=[records.block("b1"), records.block("b2")],
                tasks=[records.task("t1")],
                evidences=[records.evidence("e1")],
            ),
        )
        first = await store.read_since("s1")
        assert first is not None
        copy = caught_up("s1", None, first)
        unchanged = await store.read_since("s1", first.version, first.epoch)
        assert unchanged is not None and not unchanged.complete
        assert unchanged.version == first.version and unchanged.changes.messages == []

        result = await store.append_messages("s1", [records.message("m2"), records.message("m3")])
        # a store that reports epochs with its writes reports the one read_since names
        assert result.epoch in (None, first.epoch)
        await store.commit(
            "s1",
            SessionChanges(
                evidences=[records.evidence("e2")],
                context_blocks=[records.block("b1", content="b1 changed"), records.block("b3")],
                tasks=[records.task("t1", TaskStatus.COMPLETED), records.task("t2")],
                tool_calls=[records.tool_call("c1")],
                model_usage=[records.usage("u1")],
                summary=Summary(
                    content="so far",
                    updated_at="2026-01-02T00:00:00+00:00",
                    message_index_range=MessageIndexRange(from_index=0, to_index=1),
                ),
                meta=records.meta("alice"),
            ),
        )
        update = await store.read_since("s1", first.version, first.epoch)
        assert update is not None and update.version == await store.get_version("s1") == 3
        if not update.complete:
            assert update.epoch == first.epoch
            assert [m.message_id for m in update.changes.messages] == ["m2", "m3"]
            assert [b.block_id for b in update.changes.context_blocks] == ["b1", "b3"]
        assert caught_up("s1", copy, update) == await document_of(store, "s1")

    async def test_read_since_after_a_rewrite_reads_everything(self, store: Store) -> None:
        await store.commit(
            "s1",
            SessionChanges(
                messages=[records.message("m1")],
                evidences=[records.evidence("e1"), records.evidence("e2")],
            ),
        )
        before = await store.read_since("s1")
        assert before is not None
        copy = caught_up("s1", None, before)

        assert await store.delete_evidence("s1", "e1")
        update = await store.read_since("s1", before.version, before.epoch)
        assert update is not None and update.complete
        assert list(caught_up("s1", copy, update).evidences) == ["e2"]

        # deleted and created again up to the same version: a different history
        assert await store.delete_session("s1")
        for key in ("x1", "x2"):
            await store.append_messages("s1", [records.message(key)])
        assert await store.get_version("s1") == update.version
        again = await store.read_since("s1", update.version, update.epoch)
        assert again is not None
        reread = caught_up("s1", caught_up("s1", copy, update), again)
        assert reread == await document_of(store, "s1")
        assert [m.message_id for m in reread.session.messages] == ["x1", "x2"]

    # -- sessions -------------------------------------------------------------------------------

    async def test_list_sessions(self, store: Store) -> None:
        await store.commit("b", SessionChanges(meta=records.meta("alice")))
        await store.commit(
            "a", SessionChanges(messages=[records.message("m")], meta=records.meta("bob"))
        )
        await store.commit("c/ü é", SessionChanges(meta=records.meta("alice")))
        await store.append_messages("d", [records.message("m")])
        assert await store.list_sessions() == ["a", "b", "c/ü é", "d"]
        assert await store.list_sessions(user_id="alice") == ["b", "c/ü é"]
        assert await store.list_sessions(user_id="bob") == ["a"]
        assert await store.list_sessions(user_id="carol") == []
        await store.commit("a", SessionChanges(meta=records.meta("alice")))
        assert await store.list_sessions(user_id="alice") == ["a", "b", "c/ü é"]

    async def test_sessions_are_isolated(self, store: Store) -> None:
        shared = SessionChanges(
            messages=[records.message("m1")],
            evidences=[records.evidence("e1")],
            context_blocks=[records.block("b1")],
            tasks=[records.task("t1")],
        )
        await store.commit("s1", shared)
        assert (await store.commit("s2", shared)).version == 1
        await store.put_evidence("s1", records.evidence("only-s1"))
        assert await store.get_evidence("s2", "only-s1") is None
        assert await store.get_version("s2") == 1
        assert await store.delete_evidence("s1", "e1")
        assert await store.get_evidence("s2", "e1") == records.evidence("e1")
        assert await store.delete_session("s1")
        assert await store.get_session("s2") == records.expected_document("s2", shared)

    async def test_returned_and_committed_objects_are_not_shared(self, store: Store) -> None:
        def changes() -> SessionChanges:
            return SessionChanges(
                messages=[records.message("m1", meta={"k": [1]})],
                evidences=[records.evidence("e1")],
                context_blocks=[records.block("b1")],
                turns=[records.turn("t1")],
            )

        committed = changes()
        await store.commit("s1", committed)
        committed.messages[0].meta["k"].append(2)
        committed.evidences[0].content = "changed by the caller"
        committed.context_blocks[0].content = "changed by the caller"
        committed.turns[0].report.errors.append("changed by the caller")
        doc = await document_of(store, "s1")
        doc.session.messages[0].content = "changed"
        doc.evidences["e1"].metadata["x"] = "y"
        fetched = await store.get_evidence("s1", "e1")
        assert fetched is not None
        fetched.content = "changed"
        (await store.list_evidences("s1"))[0].content = "changed"
        (await store.list_context_blocks("s1"))[0].content = "changed"
        (await store.list_turns("s1"))[0].report.token_used = 0
        fetched_turn = await store.get_turn("s1", "t1")
        assert fetched_turn is not None
        fetched_turn.config["changed"] = True
        assert await store.get_session("s1") == records.expected_document("s1", changes())
        assert await store.list_turns("s1") == changes().turns

    # -- compliance -----------------------------------------------------------------------------

    async def test_delete_session_is_audited(self, store: Store) -> None:
        await store.commit("s1", records.rich_changes())
        await store.append_messages("s2", [records.message("m1")])
        assert await store.delete_session("s1") is True
        assert await store.get_session("s1") is None
        assert await store.get_version("s1") == 0
        assert await store.get_evidence("s1", "ev-doc") is None
        assert await store.list_evidences("s1") == []
        assert await store.list_context_blocks("s1") == []
        assert await store.list_turns("s1") == []
        assert await store.get_turn("s1", "turn-1") is None
        assert await store.list_sessions() == ["s2"]
        assert await store.list_sessions(user_id="user-1") == []
        assert await store.delete_session("s1") is False

        [record] = await store.audit_log()
        assert (record.action, record.session_id, record.target) == ("delete_session", "s1", "")
        parse_iso(record.at)
        # the session can start again from scratch
        assert (await store.append_messages("s1", [records.message("again")])).version == 1
        assert await message_ids_of(store, "s1") == ["again"]
        assert await store.list_turns("s1") == []

    async def test_delete_evidence_is_audited(self, store: Store) -> None:
        await store.commit("s1", records.rich_changes())
        assert await store.delete_evidence("s1", "ev-doc") is True
        assert await store.get_evidence("s1", "ev-doc") is None
        assert [e.evidence_id for e in await store.list_evidences("s1")] == ["ev-tool"]
        assert list((await document_of(store, "s1")).evidences) == ["ev-tool"]
        assert await store.list_turns("s1") == records.rich_changes().turns
        assert await store.get_version("s1") == 2
        assert await store.delete_evidence("s1", "ev-doc") is False
        assert await store.get_version("s1") == 2

        [record] = await store.audit_log("s1")
        assert (record.action, record.session_id, record.target) == (
            "delete_evidence",
            "s1",
            "ev-doc",
        )

    async def test_delete_user_deletes_their_sessions(self, store: Store) -> None:
        await store.commit(
            "a1", SessionChanges(messages=[records.message("m")], meta=records.meta("alice"))
        )
        await store.commit(
            "a2", SessionChanges(meta=records.meta("alice"), turns=[records.turn("t1")])
        )
        await store.commit(
            "b1", SessionChanges(meta=records.meta("bob"), turns=[records.turn("t1")])
        )
        await store.append_messages("anonymous", [records.message("m")])
        assert await store.delete_user("alice") == ["a1", "a2"]
        assert await store.list_sessions() == ["anonymous", "b1"]
        assert await store.list_turns("a2") == []
        assert await store.list_turns("b1") == [records.turn("t1")]
        assert await store.delete_user("alice") == []
        with pytest.raises(SchemaValidationError):
            await store.delete_user("")
        assert [(r.action, r.session_id) for r in await store.audit_log()] == [
            ("delete_session", "a1"),
            ("delete_session", "a2"),
        ]

    async def test_audit_log_filters_by_session_and_outlives_the_data(self, store: Store) -> None:
        for session_id in ("s1", "s2"):
            await store.put_evidence(session_id, records.evidence("e1"))
            await store.delete_evidence(session_id, "e1")
        await store.delete_session("s1")
        assert [(r.action, r.session_id) for r in await store.audit_log()] == [
            ("delete_evidence", "s1"),
            ("delete_evidence", "s2"),
            ("delete_session", "s1"),
        ]
        assert [r.action for r in await store.audit_log("s1")] == [
            "delete_evidence",
            "delete_session",
        ]
        assert await store.audit_log("s3") == []
