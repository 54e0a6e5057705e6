"""The contract every :class:`~ce.core.stores.Store` implementation must pass.

Subclass :class:`StoreContract` in a test module (the class name must start with ``Test``)
and provide two fixtures::

    class TestMyStore(StoreContract):
        @pytest.fixture
        async def store(self, tmp_path):          # a fresh, empty store
            store = MyStore(tmp_path / "x")
            yield store
            await store.close()

        @pytest.fixture
        def fail_midway(self, monkeypatch):       # see StoreContract.fail_midway
            def arm(store): ...
            return arm

The tests need ``pytest-asyncio`` with ``asyncio_mode = "auto"``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from ce.core.errors import SchemaValidationError, VersionConflictError
from ce.core.schema import (
    SCHEMA_VERSION,
    AudioPart,
    FilePart,
    ImagePart,
    Message,
    MessageIndexRange,
    Role,
    RunState,
    RunStatus,
    Session,
    SessionDocument,
    Summary,
    TextPart,
)
from ce.core.stores.base import (
    SessionChanges,
    SliceStore,
    Store,
)
from ce.core.testing import records
from ce.core.testing._store_contract_records import (
    RecordContract,
    document_of,
    message_ids_of,
)
from ce.core.testing._store_contract_tails import TailContract

__all__ = ["InjectedFailure", "StoreContract"]


class InjectedFailure(Exception):
    """Raised by a ``fail_midway`` injection in the middle of a write."""


class StoreContract(RecordContract, TailContract):
    """Behaviour every store must show; subclasses provide ``store`` and ``fail_midway``.

    ``store`` yields a fresh, empty store. ``fail_midway`` returns a function that, given that
    store, arranges for its next write to raise :class:`InjectedFailure` after it has written
    part of the records of a commit holding messages, tool calls, evidences, blocks and turn
    records (for example after the messages, before the evidences); later writes must work
    normally.
    """

    # -- reads of what does not exist -----------------------------------------------------------

    async def test_missing_session_reads_as_absent(self, store: Store) -> None:
        assert await store.get_session("missing") is None
        assert await store.get_version("missing") == 0
        assert await store.get_evidence("missing", "ev") is None
        assert await store.list_evidences("missing") == []
        assert await store.list_context_blocks("missing") == []
        assert await store.list_turns("missing") == []
        assert await store.get_turn("missing", "turn") is None
        assert await store.list_sessions() == []
        assert await store.delete_session("missing") is False
        assert await store.delete_evidence("missing", "ev") is False
        assert await store.audit_log() == []

    async def test_empty_session_id_is_rejected(self, store: Store) -> None:
        with pytest.raises(SchemaValidationError):
            await store.append_messages("", [records.message("m1")])
        assert await store.list_sessions() == []

    # -- round trips ----------------------------------------------------------------------------

    async def test_rich_document_round_trips(self, store: Store) -> None:
        changes = records.rich_changes()
        result = await store.commit("s1", changes)
        assert (result.success, result.version) == (True, 1)
        assert await store.get_session("s1") == records.expected_document("s1", changes)
        assert await store.list_turns("s1") == changes.turns
        assert await store.get_version("s1") == 1

    async def test_message_parts_round_trip(self, store: Store) -> None:
        """A message's images, files and audio are kept in order; a text-only message still
        has none (sessions stored before parts existed read the same)."""
        parts: list[Any] = [
            ImagePart(url="https://example.com/a.png", detail="low", width=640, height=480),
            TextPart(),
            ImagePart(url="data:image/png;base64,iVBORw0KGgo="),
            FilePart(data="data:application/pdf;base64,JVBERi0xLjQK", filename="a.pdf"),
            FilePart(file_id="file-abc"),
            AudioPart(data="UklGRg==", format="wav"),
        ]
        pictured = Message(role=Role.USER, content="look", message_id="m1", parts=parts)
        plain = Message(role=Role.USER, content="plain", message_id="m2")
        await store.append_messages("s1", [pictured, plain])
        doc = await store.get_session("s1")
        assert doc is not None
        assert doc.session.messages[0].parts == parts
        assert doc.session.messages[1].parts is None
        update = await store.read_since("s1", 0)
        assert update is not None and update.changes.messages[0].parts == parts

    async def test_put_session_replaces_the_whole_document(self, store: Store) -> None:
        await store.commit(
            "s1", SessionChanges(messages=[records.message("old")], turns=[records.turn("t1")])
        )
        rich = records.expected_document("s1", records.rich_changes())
        assert (await store.put_session("s1", rich, expected_version=1)).version == 2
        assert await store.get_session("s1") == rich
        assert await store.list_sessions(user_id="user-1") == ["s1"]
        # the replaced document's turn records go with it
        assert await store.list_turns("s1") == []
        assert await store.get_turn("s1", "t1") is None

        small = SessionDocument(
            schema_version=SCHEMA_VERSION,
            session=Session(session_id="s1", messages=[records.message("imported")]),
        )
        assert (await store.put_session("s1", small)).version == 3
        assert await store.get_session("s1") == small
        assert await store.list_evidences("s1") == []
        assert await store.list_context_blocks("s1") == []
        assert await store.list_sessions(user_id="user-1") == []

        # appends continue after the imported records and stay idempotent against them
        result = await store.append_messages(
            "s1", [records.message("imported"), records.message("next")]
        )
        assert result.version == 4
        assert await message_ids_of(store, "s1") == ["imported", "next"]

    async def test_put_session_fills_missing_message_ids(self, store: Store) -> None:
        doc = SessionDocument(
            schema_version=SCHEMA_VERSION,
            session=Session(
                session_id="s1",
                messages=[Message(role=Role.USER, content="a"), Message(role=Role.USER)],
            ),
        )
        await store.put_session("s1", doc)
        ids = await message_ids_of(store, "s1")
        assert all(ids) and len(set(ids)) == 2

    async def test_put_session_rejects_invalid_documents(self, store: Store) -> None:
        await store.append_messages("s1", [records.message("m1")])
        before = await document_of(store, "s1")
        other_id = records.expected_document("s2", SessionChanges())
        duplicates = records.expected_document(
            "s1", SessionChanges(messages=[records.message("a")] * 2)
        )
        old_schema = records.expected_document("s1", SessionChanges()).model_copy(
            update={"schema_version": "0.9"}
        )
        for doc in (other_id, duplicates, old_schema):
            with pytest.raises(SchemaValidationError):
                await store.put_session("s1", doc)
        assert await store.get_session("s1") == before
        assert await store.get_version("s1") == 1

    # -- appends, versions, idempotency ---------------------------------------------------------

    async def test_append_order_is_preserved(self, store: Store) -> None:
        expected = []
        for i in range(6):
            batch = [
                records.message(f"m{i}-a"),
                records.message(f"m{i}-b"),
                records.message(f"m{i}-c"),
            ]
            await store.append_messages("s1", batch)
            expected += [m.message_id for m in batch]
        assert await message_ids_of(store, "s1") == expected
        assert await store.get_version("s1") == 6

    async def test_appends_are_idempotent_by_id(self, store: Store) -> None:
        changes = SessionChanges(
            messages=[records.message("m1"), records.message("m2")],
            tool_calls=[records.tool_call("c1")],
            model_usage=[records.usage("u1")],
            evidences=[records.evidence("e1")],
        )
        assert (await store.commit("s1", changes)).version == 1
        before = await document_of(store, "s1")
        assert (await store.commit("s1", changes)).version == 1
        # a stored id wins over a new record carrying the same id
        rewritten = SessionChanges(
            messages=[records.message("m1", content="rewritten")],
            evidences=[records.evidence("e1", content="rewritten")],
        )
        assert (await store.commit("s1", rewritten)).version == 1
        assert await store.get_session("s1") == before

        mixed = SessionChanges(
            messages=[records.message("m2"), records.message("m3"), records.message("m3")],
            tool_calls=[records.tool_call("c1"), records.tool_call("c2")],
            model_usage=[records.usage("u1"), records.usage("u2")],
            evidences=[records.evidence("e2"), records.evidence("e1")],
        )
        assert (await store.commit("s1", mixed)).version == 2
        doc = await document_of(store, "s1")
        assert [m.message_id for m in doc.session.messages] == ["m1", "m2", "m3"]
        assert [c.tool_call_id for c in doc.session.tool_state.tool_calls] == ["c1", "c2"]
        assert [u.model_usage_id for u in doc.session.model_usage] == ["u1", "u2"]
        assert list(doc.evidences) == ["e1", "e2"]
        assert doc.evidences["e1"].content == "evidence e1"

    async def test_version_counts_commits_that_change_something(self, store: Store) -> None:
        assert (await store.commit("s1", SessionChanges())).version == 0
        assert await store.get_session("s1") is None
        assert await store.list_sessions() == []
        assert (await store.append_messages("s1", [records.message("m1")])).version == 1
        assert (await store.put_context_blocks("s1", [records.block("b1")])).version == 2
        assert (await store.upsert_tasks("s1", [records.task("t1")])).version == 3
        assert await store.put_evidence("s1", records.evidence("e1")) == "e1"
        assert await store.get_version("s1") == 4
        assert (await store.commit("s1", SessionChanges())).version == 4
        assert (await store.append_messages("s1", [records.message("m1")])).version == 4
        assert (await store.put_context_blocks("s1", [records.block("b1")])).version == 4
        assert (await store.upsert_tasks("s1", [records.task("t1")])).version == 4
        assert (await store.commit("s1", SessionChanges(run=RunState()))).version == 4
        assert await store.get_version("s1") == 4

    async def test_summary_run_and_meta_are_replaced(self, store: Store) -> None:
        first = records.rich_changes()
        await store.commit("s1", first)
        summary = Summary(
            content="newer",
            updated_at="2026-01-02T00:00:00+00:00",
            message_index_range=MessageIndexRange(from_index=0, to_index=3),
        )
        run = RunState(run_id="run-2", status=RunStatus.FAILED, last_error="boom")
        meta = records.meta("user-2")
        replace = SessionChanges(summary=summary, run=run, meta=meta)
        assert (await store.commit("s1", replace)).version == 2
        doc = await document_of(store, "s1")
        assert (doc.session.summary, doc.session.run, doc.meta) == (summary, run, meta)
        assert (await store.commit("s1", replace)).version == 2
        assert await store.list_sessions(user_id="user-1") == []
        assert await store.list_sessions(user_id="user-2") == ["s1"]

    async def test_who_made_the_summary_round_trips(self, store: Store) -> None:
        """An app's cut (``Summary.source="app"``) is read back as such whole, by a reader
        catching up and by a reader of the newest records; an engine summary reads back
        as the engine's."""
        await store.commit("s1", records.rich_changes())
        seen = await store.read_since("s1")
        assert seen is not None
        cut = Summary(
            content="",
            updated_at="2026-01-02T00:00:00+00:00",
            message_index_range=MessageIndexRange(from_index=0, to_index=1),
            source="app",
        )
        await store.commit("s1", SessionChanges(summary=cut))
        assert (await document_of(store, "s1")).session.summary == cut
        update = await store.read_since("s1", seen.version, seen.epoch)
        assert update is not None and update.changes.summary == cut
        if isinstance(store, SliceStore):
            part = await store.read_tail("s1", messages=1, evidences=1)
            assert part is not None and part.changes.summary == cut
        engine = cut.model_copy(update={"content": "later", "source": "engine"})
        await store.commit("s1", SessionChanges(summary=engine))
        held = (await document_of(store, "s1")).session.summary
        assert held == engine and held is not None and held.source == "engine"

    # -- optimistic concurrency -----------------------------------------------------------------

    async def test_expected_version_conflicts_write_nothing(self, store: Store) -> None:
        with pytest.raises(VersionConflictError) as info:
            await store.append_tool_calls("s1", [records.tool_call("c1")], expected_version=1)
        assert (info.value.expected, info.value.actual) == (1, 0)
        assert await store.get_session("s1") is None

        assert (
            await store.commit("s1", SessionChanges(messages=[records.message("m1")]), 0)
        ).version == 1
        before = await document_of(store, "s1")
        writes: list[Callable[[], Any]] = [
            lambda: store.commit("s1", records.rich_changes(), expected_version=0),
            lambda: store.patch_session(
                "s1", {"messages": [records.message("m2")]}, expected_version=2
            ),
            lambda: store.append_tool_calls("s1", [records.tool_call("c1")], expected_version=0),
            lambda: store.append_model_usage("s1", [records.usage("u1")], expected_version=0),
            lambda: store.upsert_tasks("s1", [records.task("t1")], expected_version=0),
            lambda: store.put_session(
                "s1", records.expected_document("s1", records.rich_changes()), expected_version=0
            ),
        ]
        for write in writes:
            with pytest.raises(VersionConflictError) as info:
                await write()
            assert (info.value.session_id, info.value.actual) == ("s1", 1)
        assert await store.get_session("s1") == before
        assert await store.get_version("s1") == 1

        result = await store.append_model_usage("s1", [records.usage("u1")], expected_version=1)
        assert result.version == 2

    async def test_only_one_of_racing_optimistic_writers_wins(self, store: Store) -> None:
        async def write(n: int) -> bool:
            try:
                await store.commit("s1", SessionChanges(messages=[records.message(f"m{n}")]), 0)
            except VersionConflictError:
                return False
            return True

        results = await asyncio.gather(*(write(n) for n in range(8)))
        assert sum(results) == 1
        assert await store.get_version("s1") == 1
        assert len(await message_ids_of(store, "s1")) == 1

    async def test_retrying_optimistic_writers_lose_nothing(self, store: Store) -> None:
        async def write(n: int) -> None:
            while True:
                version = await store.get_version("s1")
                try:
                    await store.append_tool_calls("s1", [records.tool_call(f"c{n}")], version)
                    return
                except VersionConflictError:
                    continue

        await asyncio.gather(*(write(n) for n in range(10)))
        doc = await document_of(store, "s1")
        assert sorted(c.tool_call_id for c in doc.session.tool_state.tool_calls) == sorted(
            f"c{n}" for n in range(10)
        )
        assert await store.get_version("s1") == 10

    # -- atomicity ------------------------------------------------------------------------------

    async def test_invalid_record_stores_nothing(self, store: Store) -> None:
        await store.append_messages("s1", [records.message("m1")])
        before = await document_of(store, "s1")

        mutated = records.message("bad")
        mutated.role = "narrator"  # type: ignore[assignment]  # models do not validate assignment
        with pytest.raises(SchemaValidationError) as info:
            await store.commit(
                "s1",
                SessionChanges(
                    messages=[records.message("m2"), mutated],
                    evidences=[records.evidence("e1")],
                    meta=records.meta("u"),
                ),
            )
        assert [path for path, _ in info.value.errors] == ["messages.1.role"]

        unserializable = records.evidence("e2")
        unserializable.metadata = {"handle": object()}
        not_a_model: Any = {"evidence_id": "e3"}
        for changes in (
            SessionChanges(messages=[records.message("m3")], evidences=[unserializable]),
            SessionChanges(messages=[records.message("m4")], evidences=[not_a_model]),
        ):
            with pytest.raises(SchemaValidationError):
                await store.commit("s1", changes)

        bad_turn = records.turn("t2")
        bad_turn.kind = "meal"  # type: ignore[assignment]
        with pytest.raises(SchemaValidationError) as info:
            await store.commit(
                "s1",
                SessionChanges(
                    messages=[records.message("m5")], turns=[records.turn("t1"), bad_turn]
                ),
            )
        assert [path for path, _ in info.value.errors] == ["turns.1.kind"]
        assert await store.get_session("s1") == before
        assert await store.list_turns("s1") == []
        assert await store.get_version("s1") == 1

    async def test_failure_midway_stores_nothing(
        self, store: Store, fail_midway: Callable[[Store], None]
    ) -> None:
        await store.commit(
            "s1",
            SessionChanges(messages=[records.message("m1")], evidences=[records.evidence("e0")]),
        )
        before = await document_of(store, "s1")
        changes = records.rich_changes()
        changes.context_blocks.append(records.block("block-new"))

        fail_midway(store)
        with pytest.raises(InjectedFailure):
            await store.commit("s1", changes)
        assert await store.get_session("s1") == before
        assert await store.list_turns("s1") == []
        assert await store.get_version("s1") == 1

        # the store is usable afterwards and the retried commit goes through whole
        assert (await store.commit("s1", changes)).version == 2
        doc = await document_of(store, "s1")
        assert len(doc.session.messages) == 1 + len(changes.messages)
        assert list(doc.evidences) == ["e0", "ev-doc", "ev-tool"]
        assert doc.session.summary == changes.summary
        assert await store.list_turns("s1") == changes.turns

    # -- concurrency ----------------------------------------------------------------------------

    @staticmethod
    async def _append_each(store: Store, writer: str, count: int) -> None:
        for i in range(count):
            await store.append_messages("s1", [records.message(f"{writer}-{i:03d}")])

    @staticmethod
    def _assert_all_kept(ids: list[str | None], writers: list[str], count: int) -> None:
        assert len(ids) == len(set(ids)) == len(writers) * count
        for writer in writers:
            mine = [i for i in ids if i and i.startswith(f"{writer}-")]
            assert mine == [f"{writer}-{i:03d}" for i in range(count)]

    async def test_concurrent_tasks_lose_nothing(self, store: Store) -> None:
        writers = [f"task{n}" for n in range(20)]
        await asyncio.gather(*(self._append_each(store, w, 10) for w in writers))
        self._assert_all_kept(await message_ids_of(store, "s1"), writers, 10)
        assert await store.get_version("s1") == 200

    async def test_concurrent_threads_with_their_own_loops_lose_nothing(self, store: Store) -> None:
        writers = [f"thread{n}" for n in range(4)]
        errors: list[BaseException] = []

        def run(writer: str) -> None:
            try:
                asyncio.run(self._append_each(store, writer, 25))
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(w,)) for w in writers]
        for thread in threads:
            thread.start()
        # meanwhile the test's own loop writes too
        await self._append_each(store, "loop", 25)
        for thread in threads:
            thread.join()
        assert errors == []
        self._assert_all_kept(await message_ids_of(store, "s1"), [*writers, "loop"], 25)
        assert await store.get_version("s1") == 125

    # -- the convenience methods ---------------------------------------------------------------
