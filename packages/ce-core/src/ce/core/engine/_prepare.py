"""Assembling a model input: the rolling summary, selection and assembly, the report and
the turn record, and the events of a prepared call."""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ce.core._drive import checkpoint, settle
from ce.core.config import RuntimeConfig
from ce.core.engine._blocks import BlockSummaries
from ce.core.engine._session import SessionEntry, TailTooShort, reply_key
from ce.core.engine._turn import Selection, select_and_assemble
from ce.core.engine._writes import UNFINISHED_RUN, WriteLog
from ce.core.errors import BudgetExceededError, SummarizerError
from ce.core.pipeline import should_summarize, summary_range_end
from ce.core.primitives import parse_iso
from ce.core.schema import (
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    Message,
    ModelUsage,
    ModelUsageStage,
    PrepareResult,
    Report,
    Role,
    RunStatus,
    SourceKind,
    Summary,
    TurnRecord,
)
from ce.core.tokens import tokenizer_name

__all__ = ["Preparer"]


class Preparer(BlockSummaries):
    """The prepare phase shared by ``prepare_turn`` and ``prepare_call``."""

    _snapshots: dict[int, tuple[RuntimeConfig, str, dict[str, Any]]]

    async def replies_held(self, session_id: str, texts: Iterable[str]) -> frozenset[str]:
        """Which of ``texts`` the session holds as the text of a reply (an assistant message
        without tool calls, in no turns the app took back; redacted as the session stores
        it), among the newest records a call reads: what an app that renders its
        conversation as text into a prompt can leave out of the prompt, the engine sending
        those turns as the session's messages. Another process may have recorded them.
        Writes nothing."""
        wanted = tuple(dict.fromkeys(t for t in texts if t))
        if not wanted:
            return frozenset()
        cfg = self._cfg(None)

        async def op(entry: SessionEntry, call: WriteLog) -> frozenset[str]:
            positions = entry.key_positions
            held = set()
            for text in wanted:
                position = positions.get(reply_key(self._stored_text(text, cfg)))
                if position is not None and not entry.withdrawn(position):
                    held.add(text)
            return frozenset(held)

        return await self._write(session_id, op, tail=True)

    async def _prepare(
        self,
        entry: SessionEntry,
        cfg: RuntimeConfig,
        call: WriteLog,
        kind: str,
        tool_schemas: list[dict[str, Any]] | None,
        own_run: tuple[str | None, list[str]] = (None, []),
        *,
        defer: bool = False,
    ) -> PrepareResult:
        """Select and assemble for the session's current state; ``own_run``: the stored ids
        of this call's question and of the tool calls its run made (see
        ``select_and_assemble``); ``defer``: leave what the call wrote for the session's
        next commit (see ``prepare_call``)."""
        started_ns = time.time_ns()  # for the events' observers (a tracing span's start)
        call.prepare = True
        if entry.partial and self._summarizer is not None and cfg.summary.enabled:
            raise TailTooShort(whole=True)  # summarizing reads the history from its start
        await self._maybe_summarize(entry, cfg, call)
        index = entry.index(cfg.model_hint, cfg.render.fence_tool_results)
        now = self.clock.now_iso()
        question, calls = own_run
        start = None if question is None else index.turn_of(question)
        pinned = [] if start is None else [start, *map(index.call_group, calls)]
        select = functools.partial(
            select_and_assemble,
            index,
            entry.doc,
            cfg,
            now=parse_iso(now),
            tool_schemas=tool_schemas,
            unread=entry.unread,
        )
        try:
            try:
                selection = await select(own_run=[g for g in pinned if g is not None])
            except BudgetExceededError:
                if not pinned:
                    raise
                # this run's blocks do not fit beside the newest question's: assembled as
                # any call is, from the session's newest question
                selection = await select()
        except BudgetExceededError as exc:
            await self._emit(
                "Error",
                entry.session_id,
                call.turn_id,
                reason="must_exceeded_budget",
                detail=str(exc),
            )
            raise
        if selection.short:
            raise TailTooShort()
        await checkpoint()
        call.errors.extend(index.drain_errors())
        call.degradations.extend(selection.degradations)
        call.degradations.extend(self._tokenizer_notes)
        self._tokenizer_notes.clear()
        report = self._report(call, selection)
        if entry.state.status in UNFINISHED_RUN:
            self._begin_run(entry.state)  # an unfinished run's question asked again: a new run
        self._transition(entry.state, RunStatus.MODEL_RUNNING)
        turn = None
        if cfg.observability.include_reports_in_store:
            config_id, snapshot = self._snapshot(cfg)
            first = config_id not in entry.config_ids  # the snapshot goes once per session
            entry.config_ids.add(config_id)
            turn = TurnRecord(
                turn_id=call.turn_id,
                kind="turn" if kind == "turn" else "call",
                at=now,
                message_count=entry.message_total,
                evidence_count=entry.evidence_total,
                summary=entry.doc.session.summary,
                config=snapshot if first else {},
                config_id=config_id,
                tool_schemas=list(tool_schemas or []),
                report=report,
                tokenizer=tokenizer_name(self._estimator_for(cfg.model_hint), cfg.model_hint),
            )
        version = await self._persist_or_carry(entry, call, turn, defer)
        await self._emit_turn_events(
            entry.session_id, call, selection, report, cfg, kind, started_ns
        )
        if cfg.summary.blocks and selection.degraded_blocks and self._llm_adapter is not None:
            self._schedule_block_summaries(
                entry,
                cfg,
                index.summarizable(selection.degraded_blocks, cfg.summary.block_min_tokens),
            )
        return PrepareResult(
            assembled_input=selection.assembled, report=report, session_version=version
        )

    def _snapshot(self, cfg: RuntimeConfig) -> tuple[str, dict[str, Any]]:
        """The config as stored with a turn and its id (a digest), computed once per config
        object."""
        held = self._snapshots.get(id(cfg))
        if held is None or held[0] is not cfg:
            snapshot = _config_snapshot(cfg)
            text = json.dumps(snapshot, sort_keys=True, separators=(",", ":"))
            digest = hashlib.sha256(text.encode()).hexdigest()[:24]
            if len(self._snapshots) >= 256:
                self._snapshots.clear()
            held = self._snapshots[id(cfg)] = (cfg, digest, snapshot)
        return held[1], held[2]

    def _report(self, call: WriteLog, selection: Selection) -> Report:
        return Report(
            turn_id=call.turn_id,
            new_evidence_ids=list(call.new_evidence_ids),
            new_block_ids=[
                f"msg:{m.message_id}" for m in call.new_messages if m.role is not Role.TOOL
            ],
            prune_decisions=selection.decisions,
            conflicts=selection.conflicts,
            redactions=list(call.redactions),
            token_budget=selection.budget,
            token_used=selection.assembled.total_tokens,
            degradations=[f"{reason}: {detail}" for reason, detail in call.degradations],
            errors=[f"{reason}: {detail}" for reason, detail in call.errors],
        )

    async def _emit_turn_events(
        self,
        session_id: str,
        call: WriteLog,
        selection: Selection,
        report: Report,
        cfg: RuntimeConfig,
        kind: str,
        started_ns: int,
    ) -> None:
        turn = call.turn_id
        for reason, detail in call.errors:
            if reason != "version_conflict":  # emitted when it happened
                await self._emit(
                    "Error", session_id, turn, reason=reason, detail=detail, prepare=True
                )
        for conflict in selection.conflicts:
            await self._emit(
                "ConflictDetected",
                session_id,
                turn,
                field_path=conflict.field_path,
                evidence_ids=conflict.evidence_ids,
                resolution=conflict.resolution,
            )
        await self._emit("BlocksDerived", session_id, turn, candidates=selection.candidate_count)
        dropped = [d for d in selection.decisions if d.action == "dropped"]
        await self._emit(
            "PruneCompleted",
            session_id,
            turn,
            kept=sum(d.block_count for d in selection.decisions if d.action != "dropped"),
            dropped=sum(d.block_count for d in dropped),
            reasons=sorted({d.reason for d in dropped}),
        )
        await self._emit(
            "Assembled",
            session_id,
            turn,
            parts=len(selection.assembled.parts),
            total_tokens=selection.assembled.total_tokens,
            budget=selection.budget,
            kind="turn" if kind == "turn" else "call",
            model_hint=cfg.model_hint,
            started_ns=started_ns,
            report=report,
        )

    async def _maybe_summarize(
        self, entry: SessionEntry, cfg: RuntimeConfig, call: WriteLog
    ) -> None:
        if self._summarizer is None or not cfg.summary.enabled:
            return
        index = entry.index(cfg.model_hint, cfg.render.fence_tool_results)
        doc = entry.doc
        messages = doc.session.messages
        summary = doc.session.summary
        # after what an earlier summary covers, or what the app removed from its history
        start = summary.message_index_range.to_index + 1 if summary else 0
        tail = (
            index.groups[index.last_user_group].position
            if index.last_user_group is not None
            else len(messages)
        )
        stop = min(len(messages) - cfg.summary.preserve_recent_messages, tail)
        first = index.first_group_after(start - 1)
        last = index.first_group_after(stop - 1)
        if stop <= start or not should_summarize(
            stop - start, index.group_tokens(first, last), cfg.summary
        ):
            return
        end = summary_range_end(messages, start, stop)
        if end is None:
            return
        # the engine's own model call: no plugin may rewrite, record or re-enter it
        from ce.core.integration import suppressed

        shown, first_shown, last_shown = _without_withdrawn(messages, summary, start, end)
        if last_shown < first_shown:
            return  # every message of the range was taken back by the app
        try:
            with suppressed():
                draft = await settle(
                    self._summarizer.summarize(
                        shown,
                        summary if summary is not None and summary.source == "engine" else None,
                        cfg.summary,
                        start=first_shown,
                        to_index=last_shown,
                    )
                )
        except SummarizerError as exc:
            call.degradations.append(("summarize_failed", str(exc)))
            return
        absorbed = sorted(
            {ref.evidence_id for m in messages[start : end + 1] for ref in m.refs or ()}
            | {
                eid
                for record in doc.session.tool_state.tool_calls
                for eid in record.result_evidence_ids
            }
            & set(doc.evidences)
        )
        usage = entry.state.record_model_usage(
            ModelUsage(
                model_usage_id=self.ids.generate(),
                provider=draft.response.provider or "summarizer",
                model=draft.response.model,
                stage=ModelUsageStage.SUMMARIZE,
                prompt_tokens=draft.response.prompt_tokens,
                completion_tokens=draft.response.completion_tokens,
                total_tokens=draft.response.total_tokens,
                latency_ms=draft.response.latency_ms,
            )
        )
        text, _ = self._redact_text(draft.content, cfg, call)
        evidence = entry.state.add_evidence(
            Evidence(
                evidence_id=self.ids.generate(),
                type=EvidenceType.LLM_OUTPUT,
                source=EvidenceSource(kind=SourceKind.LLM, name="summarizer"),
                content=text,
                links=EvidenceLinks(model_usage_id=usage.model_usage_id),
                created_at=self.clock.now_iso(),
            )
        )
        entry.state.set_summary(
            text,
            from_index=summary.removed_by_app if summary is not None else 0,
            to_index=end,
            evidence_ids=[*absorbed, evidence.evidence_id],
        )
        call.new_evidence_ids.append(evidence.evidence_id)
        await self._emit(
            "SummaryGenerated",
            entry.session_id,
            call.turn_id,
            to_index=end,
            model_usage_id=usage.model_usage_id,
        )


def _config_snapshot(cfg: RuntimeConfig) -> dict[str, Any]:
    """The config as stored with a turn; literal redaction dictionaries are sensitive strings,
    so the snapshot keeps only that they were there."""
    data = cfg.model_dump(mode="json")
    rules = data.get("redaction", {}).get("rules")
    if rules and rules.get("dictionaries"):
        rules["dictionaries"] = [f"<{len(rules['dictionaries'])} redacted entries>"]
    return data


def _without_withdrawn(
    messages: Sequence[Message], summary: Summary | None, start: int, end: int
) -> tuple[Sequence[Message], int, int]:
    """``messages`` without those in turns the app took back (never summarized), and where
    ``messages[start:end+1]`` starts and ends in it."""
    if summary is None or not summary.withdrawn:
        return messages, start, end
    kept = [i for i in range(len(messages)) if not summary.withdraws(i)]
    return (
        [messages[i] for i in kept],
        bisect.bisect_left(kept, start),
        bisect.bisect_right(kept, end) - 1,
    )
