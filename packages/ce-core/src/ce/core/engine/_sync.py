"""The blocking engine: ``engine.sync.<method>(...)`` runs the engine's work inline on the
calling thread."""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ce.core._drive import drive

if TYPE_CHECKING:
    from ce.core.config import RuntimeConfig
    from ce.core.engine._engine import ContextEngine
    from ce.core.pipeline import IngestOptions
    from ce.core.schema import (
        ContextBlock,
        Evidence,
        EvidenceLinks,
        EvidenceSource,
        EvidenceType,
        Message,
        ModelInvocation,
        ModelUsage,
        PrepareResult,
        PutResult,
        Ref,
        Report,
        SessionDocument,
        Task,
        ToolCall,
        TurnRecord,
    )
    from ce.core.state import ModelOutput, TaskUsage

__all__ = ["SyncEngine"]

_T = TypeVar("_T")


class SyncEngine:
    """The blocking twin of every public method of a :class:`ContextEngine`
    (``engine.sync.prepare_call(...)``), for synchronous code and synchronous framework hooks.

    A call runs inline on the calling thread: the same work as the coroutine method, with the
    store's I/O done directly (no event loop, no thread hand-off), so it works from plain
    threads and from code inside a running event loop alike, which it blocks for the call's
    duration. An async framework path should await the coroutine methods instead. Calls for
    one session are serialized with the engine's coroutine calls; a blocking call that would
    wait for a session lock held by its own thread (or by a task of the event loop it blocks)
    raises :class:`RuntimeError` instead of hanging.
    """

    def __init__(self, engine: ContextEngine) -> None:
        self._engine = engine

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run a coroutine of the engine (or one built only of engine coroutines, like an
        integration's recorder work) to completion inline on this thread."""
        return drive(coro)

    def close(self) -> None:
        """Nothing to release (kept for symmetry with the engine's ``close``)."""

    def flush(self, session_id: str | None = None) -> None:
        drive(self._engine.flush(session_id))

    # -- reads ------------------------------------------------------------------------------

    def get_session(self, session_id: str) -> SessionDocument:
        return drive(self._engine.get_session(session_id))

    def list_sessions(self, user_id: str | None = None) -> list[str]:
        return drive(self._engine.list_sessions(user_id))

    def list_turns(self, session_id: str, limit: int | None = None) -> list[TurnRecord]:
        return drive(self._engine.list_turns(session_id, limit))

    def get_report(self, session_id: str, turn_id: str | None = None) -> Report:
        return drive(self._engine.get_report(session_id, turn_id))

    def get_usage_by_task(self, session_id: str) -> dict[str, TaskUsage]:
        return drive(self._engine.get_usage_by_task(session_id))

    def replies_held(self, session_id: str, texts: Iterable[str]) -> frozenset[str]:
        return drive(self._engine.replies_held(session_id, texts))

    def replay_turn(
        self, session_id: str, turn_id: str, runtime_config: RuntimeConfig | None = None
    ) -> PrepareResult:
        return drive(self._engine.replay_turn(session_id, turn_id, runtime_config))

    # -- host state -------------------------------------------------------------------------

    def set_system_instruction(
        self, session_id: str, text: str, runtime_config: RuntimeConfig | None = None
    ) -> PutResult:
        return drive(self._engine.set_system_instruction(session_id, text, runtime_config))

    def update_notebook(
        self, session_id: str, content: str, runtime_config: RuntimeConfig | None = None
    ) -> PutResult:
        return drive(self._engine.update_notebook(session_id, content, runtime_config))

    def put_context_block(self, session_id: str, block: ContextBlock) -> PutResult:
        return drive(self._engine.put_context_block(session_id, block))

    def upsert_tasks(self, session_id: str, tasks: Sequence[Task]) -> PutResult:
        return drive(self._engine.upsert_tasks(session_id, tasks))

    # -- turns ------------------------------------------------------------------------------

    def prepare_turn(
        self,
        session_id: str,
        user_message: Message | str,
        runtime_config: RuntimeConfig | None = None,
    ) -> PrepareResult:
        return drive(self._engine.prepare_turn(session_id, user_message, runtime_config))

    def prepare_call(
        self,
        session_id: str,
        pending_messages: Sequence[Message],
        runtime_config: RuntimeConfig | None = None,
        tool_schemas: list[dict[str, Any]] | None = None,
        *,
        defer_commit: bool = False,
        rewind: bool = False,
    ) -> PrepareResult:
        return drive(
            self._engine.prepare_call(
                session_id,
                pending_messages,
                runtime_config,
                tool_schemas,
                defer_commit=defer_commit,
                rewind=rewind,
            )
        )

    def commit_assistant_message(
        self,
        session_id: str,
        assistant_message: Message | ModelOutput,
        refs: list[Ref] | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        return drive(
            self._engine.commit_assistant_message(
                session_id, assistant_message, refs, runtime_config
            )
        )

    def record_messages(
        self,
        session_id: str,
        messages: Sequence[Message],
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        return drive(self._engine.record_messages(session_id, messages, runtime_config))

    def cut_history(
        self,
        session_id: str,
        removed: Sequence[Message],
        *,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        return drive(self._engine.cut_history(session_id, removed, runtime_config=runtime_config))

    def clear_history(self, session_id: str) -> PutResult:
        return drive(self._engine.clear_history(session_id))

    def end_run(self, session_id: str, error: str, *, cancelled: bool = False) -> PutResult:
        return drive(self._engine.end_run(session_id, error, cancelled=cancelled))

    def commit_assistant_chunk(self, session_id: str, chunk: str, chunk_index: int) -> None:
        drive(self._engine.commit_assistant_chunk(session_id, chunk, chunk_index))

    def finalize_assistant_message(
        self,
        session_id: str,
        refs: list[Ref] | None = None,
        *,
        invocation: ModelInvocation | None = None,
        message_id: str | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        return drive(
            self._engine.finalize_assistant_message(
                session_id,
                refs,
                invocation=invocation,
                message_id=message_id,
                runtime_config=runtime_config,
            )
        )

    # -- tools, usage, evidence -------------------------------------------------------------

    def record_tool_call(
        self,
        session_id: str,
        tool_call: ToolCall,
        result_evidence_ids: list[str] | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        return drive(
            self._engine.record_tool_call(
                session_id, tool_call, result_evidence_ids, runtime_config
            )
        )

    def record_model_usage(
        self,
        session_id: str,
        model_usage: ModelUsage,
        llm_output_evidence_id: str | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        return drive(
            self._engine.record_model_usage(
                session_id, model_usage, llm_output_evidence_id, runtime_config
            )
        )

    def record_model_call(
        self,
        session_id: str,
        model_usage: ModelUsage,
        *,
        reply: Message | ModelOutput | None = None,
        output: tuple[str, EvidenceSource] | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> PutResult:
        return drive(
            self._engine.record_model_call(
                session_id, model_usage, reply=reply, output=output, runtime_config=runtime_config
            )
        )

    def ingest_evidence(
        self,
        session_id: str,
        content: str,
        source: EvidenceSource,
        evidence_type: EvidenceType,
        links: EvidenceLinks | None = None,
        metadata: dict[str, Any] | None = None,
        options: IngestOptions | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> Evidence:
        return drive(
            self._engine.ingest_evidence(
                session_id,
                content,
                source,
                evidence_type,
                links,
                metadata,
                options,
                runtime_config,
            )
        )
