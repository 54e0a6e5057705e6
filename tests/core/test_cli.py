"""The ``ce`` command line, run in-process against SQLite stores filled through the store API."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from ce.core.cli import main
from ce.core.cli._replay import render_parts
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.schema import (
    SCHEMA_VERSION,
    Actor,
    AssembledInput,
    Author,
    AuthorKind,
    Evidence,
    EvidenceSource,
    EvidenceType,
    Message,
    MessagePart,
    Meta,
    ModelInvocation,
    ModelUsage,
    PrepareResult,
    ProviderKind,
    PruneDecision,
    RedactionRecord,
    Report,
    Role,
    RunState,
    RunStatus,
    SourceKind,
    ToolCall,
    ToolCallRequest,
    ToolCallStatus,
    ToolProvider,
    TurnRecord,
    json_schema_text,
)
from ce.core.stores import SessionChanges, open_store

T0 = "2026-03-01T10:00:00+01:00"  # shown in UTC


def _at(second: int) -> str:
    return f"2026-03-01T10:00:{second:02d}+00:00"


def _session_changes() -> SessionChanges:
    return SessionChanges(
        messages=[
            Message(role=Role.SYSTEM, content="You are terse.", message_id="m0", at=_at(0)),
            Message(
                role=Role.USER,
                content="What is the weather in Paris?\nAnd the time?",
                message_id="m1",
                at=_at(1),
                author=Author(kind=AuthorKind.USER, id="alice"),
            ),
            Message(
                role=Role.ASSISTANT,
                message_id="m2",
                at=_at(2),
                tool_calls=[
                    ToolCallRequest(tool_call_id="call-1", name="weather", raw_arguments="{}"),
                    ToolCallRequest(tool_call_id="call-2", name="clock", raw_arguments="{}"),
                ],
                invocation=ModelInvocation(provider="openai", model="gpt-4o"),
            ),
            Message(
                role=Role.TOOL,
                content="[b]sunny[/b], 21 C",
                message_id="m3",
                at=_at(3),
                tool_call_id="call-1",
                name="weather",
            ),
            Message(
                role=Role.TOOL,
                content="clock unavailable",
                message_id="m4",
                at=_at(4),
                tool_call_id="call-2",
                name="clock",
            ),
            Message(
                role=Role.ASSISTANT,
                content="Sunny, 21 C. The clock failed.",
                message_id="m5",
                at=_at(5),
                invocation=ModelInvocation(provider="openai", model="gpt-4o"),
            ),
        ],
        tool_calls=[
            ToolCall(
                tool_call_id="call-1",
                tool="weather",
                provider=ToolProvider(kind=ProviderKind.BUILTIN),
                status=ToolCallStatus.SUCCESS,
                duration_ms=1234,
            ),
            ToolCall(
                tool_call_id="call-2",
                tool="clock",
                provider=ToolProvider(kind=ProviderKind.BUILTIN),
                status=ToolCallStatus.TIMEOUT,
                duration_ms=5000,
            ),
            ToolCall(
                tool_call_id="call-9",
                tool="indexer",
                provider=ToolProvider(kind=ProviderKind.MCP),
                called_at=_at(6),
            ),
        ],
        model_usage=[
            ModelUsage(
                model_usage_id="usage-1",
                provider="openai",
                model="gpt-4o",
                prompt_tokens=812,
                completion_tokens=64,
                total_tokens=876,
                latency_ms=930,
            )
        ],
        evidences=[
            Evidence(
                evidence_id="ev-weather",
                type=EvidenceType.TOOL_RESULT,
                source=EvidenceSource(kind=SourceKind.TOOL, name="weather"),
                content="sunny",
            ),
            Evidence(
                evidence_id="ev-doc",
                type=EvidenceType.RAG_DOC,
                source=EvidenceSource(kind=SourceKind.RAG, uri="https://example.org/paris"),
                content="Paris is in France.",
            ),
        ],
        run=RunState(run_id="run-7", status=RunStatus.COMPLETED),
        meta=Meta(updated_at="2026-03-01T10:05:00+00:00", actor=Actor(user_id="alice")),
        turns=[_turn("turn-1", "turn", 2), _turn("turn-2", "call", 5)],
    )


def _turn(turn_id: str, kind: Any, message_count: int) -> TurnRecord:
    config = RuntimeConfig(model_hint="gpt-4o", budget=BudgetConfig(max_input_tokens=4000))
    return TurnRecord(
        turn_id=turn_id,
        kind=kind,
        at=_at(message_count),
        message_count=message_count,
        evidence_count=2,
        config=config.model_dump(mode="json"),
        report=Report(
            turn_id=turn_id,
            token_budget=2976,
            token_used=1480 + message_count,
            prune_decisions=[
                PruneDecision(
                    block_id="instruction", action="kept", reason="must keep", token_estimate=12
                ),
                PruneDecision(
                    block_id="msg:m0..msg:m3",
                    action="dropped",
                    reason="over budget",
                    token_estimate=4321,
                    block_count=4,
                ),
                PruneDecision(
                    block_id="evidence:ev-doc",
                    action="degraded",
                    reason="degraded to fit",
                    token_estimate=77,
                    level="gist",
                ),
            ],
            redactions=[
                RedactionRecord(
                    evidence_id="ev-weather", rules_applied=["email", "phone"], fields_redacted=3
                )
            ],
            degradations=["summary: adapter timed out"],
            errors=["selector lines:9-12 out of range"],
        ),
    )


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def _fill(url: str, sessions: dict[str, SessionChanges]) -> None:
    async def fill() -> None:
        store = open_store(url)
        for session_id, changes in sessions.items():
            await store.commit(session_id, changes)
        await store.close()

    asyncio.run(fill())


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("CE_STORE_URL", raising=False)


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    url = _url(tmp_path / "ce.db")
    _fill(
        url,
        {
            "s1": _session_changes(),
            "s2": SessionChanges(
                messages=[Message(role=Role.USER, content="hello", message_id="x1", at=T0)],
                meta=Meta(actor=Actor(user_id="bob")),
            ),
        },
    )
    return url


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _row(out: str, first_cell: str) -> list[str]:
    """The cells of the table row whose first cell is ``first_cell``."""
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│").split("│")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n{out}")


# -- sessions, show, report -------------------------------------------------------------------


def test_sessions_lists_counts_activity_and_version(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, "--store", store_url, "sessions")
    assert (code, err) == (0, "")
    # session, messages, tool calls, evidences, turns, last activity, version
    assert _row(out, "s1") == ["s1", "6", "3", "2", "2", "2026-03-01 10:05:00", "1"]
    assert _row(out, "s2") == ["s2", "1", "0", "0", "0", "2026-03-01 09:00:00", "1"]

    code, out, _ = _run(capsys, "sessions", "--user", "bob", "--store", store_url)
    assert code == 0 and "s2" in out and "s1" not in out
    code, out, _ = _run(capsys, "sessions", "--user", "carol", "--store", store_url)
    assert code == 0 and "no sessions of user 'carol'" in out


def test_show_prints_the_timeline(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--store", store_url, "show", "s1")
    assert (code, err) == (0, "")
    assert "session s1 · version 1 · run completed (run-7)" in out
    assert _row(out, "1")[1:4] == [
        "2026-03-01 10:00:01",
        "user · alice",
        "What is the weather in Paris? …",
    ]
    assert "→ weather [call-1]" in out and "→ clock [call-2]" in out
    assert _row(out, "3")[3:5] == ["[b]sunny[/b], 21 C", "← [call-1] success 1,234 ms"]
    assert _row(out, "4")[4] == "← [call-2] timeout 5,000 ms"
    # the block ids ce report names the messages by
    assert [_row(out, str(i))[-1] for i in range(5)] == [f"msg:m{i}" for i in range(5)]
    # a tool call that no message names
    assert _row(out, "call-9")[1:4] == ["indexer", "2026-03-01 10:00:06", "success"]
    assert _row(out, "usage-1")[1:7] == ["openai/gpt-4o", "other", "812", "64", "876", "930"]
    assert "evidences: 2 (1 rag_doc, 1 tool_result)" in out
    assert "turn records: 2 (newest turn-2)" in out


def test_show_lists_the_evidences_an_answer_cites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ce.core.engine import ContextEngine
    from ce.core.schema import EvidenceSource, EvidenceType, Message, Role, SourceKind
    from ce.core.stores import SQLiteStore

    async def build() -> str:
        engine = ContextEngine(SQLiteStore(tmp_path / "cites.db"))
        source = EvidenceSource(kind=SourceKind.RAG, uri="kb://refunds")
        evidence = await engine.ingest_evidence(
            "s", "Refunds: 30 days.", source, EvidenceType.RAG_DOC
        )
        await engine.prepare_turn("s", "Refund window?")
        answer = Message(role=Role.ASSISTANT, content=f"30 days [{evidence.evidence_id}].")
        await engine.commit_assistant_message("s", answer)
        await engine.close()
        return evidence.evidence_id

    evidence_id = asyncio.run(build())
    url = f"sqlite:///{tmp_path / 'cites.db'}"
    code, out, err = _run(capsys, "--store", url, "show", "s")
    assert (code, err) == (0, "")
    assert _row(out, "1")[4] == f"cites {evidence_id}"


def test_report_shows_the_newest_turn_by_default(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, "--store", store_url, "report", "s1")
    assert (code, err) == (0, "")
    assert f"turn turn-2 (call) at {_at(5)} · session s1" in out
    assert "budget 2,976 tokens · used 1,485 (50%)" in out
    assert "history 5 message(s), 2 evidence(s)" in out

    code, out, _ = _run(capsys, "--store", store_url, "report", "s1", "turn-1")
    assert code == 0 and "turn turn-1 (turn)" in out and "used 1,482" in out
    # block, action, level, reason, tokens, blocks (only for a range), what it is
    assert _row(out, "instruction") == ["instruction", "kept", "-", "must keep", "12", "", ""]
    assert _row(out, "msg:m0..msg:m3")[:6] == [
        "msg:m0..msg:m3",
        "dropped",
        "-",
        "over budget",
        "4,321",
        "4",
    ]
    assert _row(out, "evidence:ev-doc")[1:5] == ["degraded", "gist", "degraded to fit", "77"]
    assert (
        "kept 1 block(s) / 12 tokens · dropped 4 block(s) / 4,321 tokens · "
        "degraded 1 block(s) / 77 tokens"
    ) in out
    assert "degradations (1):\n  - summary: adapter timed out" in out
    assert "errors (1):\n  - selector lines:9-12 out of range" in out
    assert "redactions: 3 field(s) in 1 evidence(s); rules: email, phone" in out
    assert "ev-weather: 3 field(s), email, phone" in out


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "nope"], "no session 'nope' in the store"),
        (["report", "nope"], "no session 'nope' in the store"),
        (["report", "nope", "turn-1"], "no session 'nope' in the store"),
        (["report", "s1", "turn-9"], "session 's1' has no turn 'turn-9'"),
        (["report", "s2"], "session 's2' has no turn records"),
        (["export", "nope"], "no session 'nope' in the store"),
        (["replay", "s1", "turn-9", "--budget", "100"], "session 's1' has no turn 'turn-9'"),
    ],
)
def test_unknown_sessions_and_turns_exit_2_with_one_line(
    store_url: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = _run(capsys, "--store", store_url, *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"ce: error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize("url", ["postgres://nowhere/db", "sqlite://relative.db", "redis://"])
def test_bad_store_url_exits_2(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--store", url, "sessions")
    assert (code, out) == (2, "")
    assert err.startswith("ce: error: ") and err.count("\n") == 1
    assert "Traceback" not in err


def test_store_defaults_to_the_environment_then_the_engine_default(
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CE_STORE_URL", store_url)
    code, out, _ = _run(capsys, "sessions")
    assert code == 0 and "s1" in out

    monkeypatch.delenv("CE_STORE_URL")
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "sessions")  # the engine's default store, not there yet
    assert code == 2 and "no store at '.ce/sessions.db'" in err
    assert not (tmp_path / ".ce").exists()  # reading created nothing


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["replay", "s1", "turn-1"]) == 2  # --budget is required
    assert main(["replay", "s1", "turn-1", "--budget", "-5"]) == 2
    assert "must be a positive integer" in capsys.readouterr().err
    assert main(["--help"]) == 0


# -- export, import, schema -------------------------------------------------------------------


def test_export_import_round_trip(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, exported, _ = _run(capsys, "--store", store_url, "export", "s1")
    assert code == 0
    data = json.loads(exported)
    assert sorted(data) == ["document", "turns"]
    assert data["document"]["session"]["session_id"] == "s1"
    assert [t["turn_id"] for t in data["turns"]] == ["turn-1", "turn-2"]

    file = tmp_path / "s1.json"
    code, out, _ = _run(capsys, "--store", store_url, "export", "s1", "-o", str(file))
    assert code == 0 and "exported session s1" in out
    assert json.loads(file.read_text(encoding="utf-8")) == data

    other = _url(tmp_path / "other.db")
    code, out, err = _run(capsys, "--store", other, "import", str(file))
    assert (code, err) == (0, "")
    assert "imported session s1: 6 message(s), 2 evidence(s), 2 turn record(s)" in out
    code, again, _ = _run(capsys, "--store", other, "export", "s1")
    assert code == 0 and json.loads(again) == data

    async def stored() -> tuple[Any, Any, list[TurnRecord]]:
        store = open_store(other)
        result = (
            await store.get_session("s1"),
            await store.get_version("s1"),
            await store.list_turns("s1"),
        )
        await store.close()
        return result

    doc, version, turns = asyncio.run(stored())
    assert version == 2  # put_session, then the commit of the turns
    assert turns == _session_changes().turns
    assert doc is not None and len(doc.session.messages) == 6


def test_import_refuses_to_overwrite_unless_replace(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "s2.json"
    assert main(["--store", store_url, "export", "s2", "-o", str(file)]) == 0
    capsys.readouterr()

    # s2's export imported over s1, which has other messages and turn records
    code, out, err = _run(capsys, "--store", store_url, "import", str(file), "--session", "s1")
    assert (code, out) == (2, "")
    assert err == (
        "ce: error: session 's1' already exists (version 1); "
        "pass --replace to overwrite it or --session to import it under another id\n"
    )
    code, out, _ = _run(
        capsys, "--store", store_url, "import", str(file), "--session", "s1", "--replace"
    )
    assert code == 0 and "imported session s1: 1 message(s)" in out
    code, out, _ = _run(capsys, "--store", store_url, "export", "s1")
    replaced = json.loads(out)
    assert replaced["turns"] == []  # the replaced session's turn records are gone
    assert [m["message_id"] for m in replaced["document"]["session"]["messages"]] == ["x1"]

    code, out, _ = _run(capsys, "--store", store_url, "import", str(file), "--session", "s3")
    assert code == 0 and "imported session s3" in out


def _export_with(tmp_path: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "document": {
            "schema_version": SCHEMA_VERSION,
            "session": {"session_id": "new", "messages": [{"role": "user", "content": "hi"}]},
        },
        "turns": [_turn("turn-1", "turn", 1).model_dump(mode="json")],
    }
    data.update(changes)
    path = tmp_path / "import.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_import_of_an_invalid_file_names_the_field(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_role = {
        "schema_version": SCHEMA_VERSION,
        "session": {"session_id": "new", "messages": [{"role": "narrator"}]},
    }
    bad_turn = _turn("turn-1", "turn", 1).model_dump(mode="json") | {"kind": "meal"}
    twice = {"role": "user", "message_id": "same"}
    duplicates = {
        "schema_version": SCHEMA_VERSION,
        "session": {"session_id": "new", "messages": [twice, twice]},
    }
    cases: list[tuple[dict[str, Any], str]] = [
        ({"document": bad_role}, "document.session.messages.0.role"),
        ({"document": duplicates}, "document.session.messages.1.message_id: duplicate id"),
        ({"turns": [bad_turn]}, "turns.0.kind"),
        ({"turns": {}}, "turns: must be a list"),
        ({"extra": 1}, "extra: unknown key of an export"),
    ]
    for changes, expected in cases:
        path = _export_with(tmp_path, **changes)
        code, out, err = _run(capsys, "--store", store_url, "import", str(path))
        assert (code, out) == (2, ""), err
        assert err.startswith(f"ce: error: {path}: invalid document: ")
        assert expected in err and err.count("\n") == 1

    path = tmp_path / "broken.json"
    path.write_text("{not json")
    code, _, err = _run(capsys, "--store", store_url, "import", str(path))
    assert code == 2 and "not valid JSON" in err
    code, _, err = _run(capsys, "--store", store_url, "import", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read" in err

    code, out, _ = _run(capsys, "--store", store_url, "sessions")
    assert "new" not in out  # nothing was stored


def test_import_takes_a_bare_document(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bare.json"
    path.write_text(
        json.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "session": {"session_id": "bare", "messages": [{"role": "user"}]},
            }
        )
    )
    code, out, _ = _run(capsys, "--store", store_url, "import", str(path))
    assert code == 0 and "imported session bare: 1 message(s), 0 evidence(s), 0 turn" in out


def test_schema_prints_the_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "schema")
    assert (code, out) == (0, json_schema_text())


def test_cli_imports_without_rich(
    store_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in sys.modules if n == "rich" or n.startswith(("rich.", "ce.core.cli"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rich", None)  # "import rich" now raises ImportError
    cli = importlib.import_module("ce.core.cli")
    assert cli.main(["--store", store_url, "sessions"]) == 2  # one line, no traceback
    err = capsys.readouterr().err
    assert err == "ce: error: this ce command needs rich: pip install 'ce-core[cli]'\n"
    assert cli.main(["schema"]) == 0
    assert capsys.readouterr().out == json_schema_text()
    assert cli.main(["--store", store_url, "export", "s2"]) == 0
    assert json.loads(capsys.readouterr().out)["document"]["session"]["session_id"] == "s2"


# -- replay -----------------------------------------------------------------------------------


def _result(parts: list[MessagePart], decisions: list[PruneDecision], budget: int) -> Any:
    tokens = sum(len(p.content) for p in parts)
    return PrepareResult(
        assembled_input=AssembledInput(parts=parts, total_tokens=tokens),
        report=Report(turn_id="turn-1", prune_decisions=decisions, token_budget=budget),
    )


def test_render_parts_shows_roles_tool_ids_and_contents() -> None:
    parts = [
        MessagePart(role=Role.USER, content="line one\nline two"),
        MessagePart(
            role=Role.ASSISTANT,
            content="",
            tool_calls=[ToolCallRequest(tool_call_id="c1", name="f", raw_arguments='{"a":1}')],
        ),
        MessagePart(role=Role.TOOL, content="boom", tool_call_id="c1", name="f", is_error=True),
    ]
    assert render_parts(parts) == [
        "### user",
        "    line one",
        "    line two",
        "### assistant",
        '    -> f({"a":1}) [c1]',
        "### tool [c1] name=f (error)",
        "    boom",
    ]


def test_replay_diffs_the_inputs_of_the_two_configs(
    store_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI's side of replay, against a stand-in engine that records what it was asked."""
    calls: list[tuple[str, str, RuntimeConfig]] = []
    system = MessagePart(role=Role.SYSTEM, content="You are terse.")
    old = MessagePart(role=Role.USER, content="What is the weather in Paris?")
    kept = MessagePart(role=Role.ASSISTANT, content="Sunny, 21 C.")

    class FakeEngine:
        def __init__(self, *, store: Any) -> None:
            self.store = store

        async def replay_turn(self, session_id: str, turn_id: str, config: RuntimeConfig) -> Any:
            calls.append((session_id, turn_id, config))
            budget = config.budget.max_input_tokens
            if budget >= 4000:
                return _result([system, old, kept], [], budget)
            dropped = PruneDecision(
                block_id="msg:m1", action="dropped", reason="over budget", token_estimate=9
            )
            return _result([system, kept], [dropped], budget)

    fake = types.ModuleType("ce.core.engine")
    fake.ContextEngine = FakeEngine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ce.core.engine", fake)

    code, out, err = _run(
        capsys, "--store", store_url, "replay", "s1", "turn-1", "--budget", "1500", "--model", "x"
    )
    assert (code, err) == (0, "")
    [(s1, t1, before), (s2, t2, after)] = calls
    assert (s1, t1, s2, t2) == ("s1", "turn-1", "s1", "turn-1")
    assert before == RuntimeConfig.model_validate(_turn("turn-1", "turn", 2).config)
    assert after == before.model_copy(
        update={"budget": BudgetConfig(max_input_tokens=1500), "model_hint": "x"}
    )
    assert "--- turn-1 @ 4,000 tokens (stored), model gpt-4o" in out
    assert "+++ turn-1 @ 1,500 tokens, model x" in out
    assert "-### user\n-    What is the weather in Paris?\n" in out
    assert "+### " not in out
    assert "turn-1 @ 1,500 tokens, model x: 26 tokens of 1,500, 2 message(s) · dropped 1" in out

    # a reply reserve the budget cannot take is a clear error, before the engine runs
    calls.clear()
    code, out, err = _run(
        capsys, "--store", store_url, "replay", "s1", "turn-1", "--budget", "9", "--reserve", "20"
    )
    assert (code, out, calls) == (2, "", [])
    assert "--budget 9 --reserve 20" in err
    assert "reserved_reply_tokens must be smaller than max_input_tokens" in err
    # a budget under the stored reserve: the reserve becomes a quarter of it
    code, out, err = _run(capsys, "--store", store_url, "replay", "s1", "turn-1", "--budget", "800")
    assert (code, err) == (0, "")
    assert calls[-1][2].budget.reserved_reply_tokens == 200
    code, out, err = _run(
        capsys, "--store", store_url, "replay", "s1", "turn-1", "--budget", "800", "--reserve", "0"
    )
    assert (code, err) == (0, "") and calls[-1][2].budget.reserved_reply_tokens == 0


def test_replay_with_the_engine(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    engine = pytest.importorskip("ce.core.engine")
    if not hasattr(engine, "ContextEngine"):
        pytest.skip("ce.core.engine has no ContextEngine yet")
    code, out, err = _run(
        capsys, "--store", store_url, "replay", "s1", "turn-2", "--budget", "1500"
    )
    assert (code, err) == (0, "")
    assert "turn-2 @ 4,000 tokens (stored):" in out
    assert "turn-2 @ 1,500 tokens:" in out
    # any budget above the reserve works (it used to fail for every budget <= 1024) ...
    code, out, err = _run(capsys, "--store", store_url, "replay", "s1", "turn-2", "--budget", "600")
    assert (code, err) == (0, "") and "turn-2 @ 600 tokens:" in out
    # ... and one that cannot hold the must blocks says so
    code, out, err = _run(capsys, "--store", store_url, "replay", "s1", "turn-2", "--budget", "12")
    assert code == 2 and "cannot hold the blocks a call must keep" in err


def test_reading_a_store_that_does_not_exist_never_creates_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = tmp_path / "typo.db"
    for command in (["sessions"], ["show", "s1"], ["report", "s1"], ["export", "s1"]):
        assert main(["--store", f"sqlite:///{typo}", *command]) == 2
        assert "no store at" in capsys.readouterr().err
    assert main(["--store", f"file://{tmp_path / 'nodir'}", "sessions"]) == 2
    assert not typo.exists() and not (tmp_path / "nodir").exists()


def test_turns_are_listed_and_named_by_index_or_prefix(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, "--store", store_url, "turns", "s1")
    assert (code, err) == (0, "")
    assert _row(out, "1")[:3] == ["1", "turn-1", "turn"]
    assert _row(out, "2")[:3] == ["2", "turn-2", "call"]
    # report and replay take the index (1 the oldest, -1 the newest) or a unique prefix
    for name, expected in (("1", "turn-1"), ("-1", "turn-2"), ("turn-2", "turn-2")):
        code, out, err = _run(capsys, "--store", store_url, "report", "s1", name)
        assert (code, err) == (0, "") and f"turn {expected} " in out
    code, _, err = _run(capsys, "--store", store_url, "report", "s1", "turn-")
    assert code == 2 and "ambiguous" in err
    code, _, err = _run(capsys, "--store", store_url, "report", "s1", "7")
    assert code == 2 and "2 turn(s)" in err


def test_report_says_what_each_block_is(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--store", store_url, "report", "s1", "turn-1")
    assert (code, err) == (0, "")
    label = _row(out, "msg:m0..msg:m3")[6]
    assert label.startswith("system: You are terse.")


def test_show_sums_model_usage_per_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def usage(usage_id: str, task_id: str | None, prompt: int) -> ModelUsage:
        return ModelUsage(
            model_usage_id=usage_id,
            provider="openai",
            model="gpt-4o",
            prompt_tokens=prompt,
            completion_tokens=5,
            total_tokens=prompt + 5,
            task_id=task_id,
        )

    url = _url(tmp_path / "ce.db")
    records = [usage("u1", "k1:research", 30), usage("u2", "k1:research", 40)]
    records += [usage("u3", "k1:write", 50), usage("u4", None, 7)]
    _fill(url, {"s-tasks": SessionChanges(model_usage=records)})
    code, out, err = _run(capsys, "--store", url, "show", "s-tasks")
    assert (code, err) == (0, "")
    assert "model usage per task" in out
    assert _row(out, "k1:research")[1:] == ["2", "70", "10", "80"]
    assert _row(out, "k1:write")[1:] == ["1", "50", "5", "55"]


def test_report_sums_the_sessions_model_usage_per_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def usage(usage_id: str, task_id: str | None, prompt: int) -> ModelUsage:
        return ModelUsage(
            model_usage_id=usage_id,
            provider="openai",
            model="gpt-4o",
            prompt_tokens=prompt,
            completion_tokens=5,
            total_tokens=prompt + 5,
            task_id=task_id,
        )

    url = _url(tmp_path / "ce.db")
    records = [usage("u1", "k1:research", 30), usage("u2", "k1:write", 50)]
    turn = _turn("t1", "call", 0)
    _fill(url, {"s-tasks": SessionChanges(model_usage=records, turns=[turn])})
    code, out, err = _run(capsys, "--store", url, "report", "s-tasks")
    assert (code, err) == (0, "")
    assert "model usage per task" in out
    assert _row(out, "k1:research")[1:] == ["1", "30", "5", "35"]
    assert _row(out, "k1:write")[1:] == ["1", "50", "5", "55"]


def test_show_has_no_per_task_table_without_task_ids(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "--store", store_url, "show", "s1")
    assert code == 0 and "model usage per task" not in out


def test_replay_checks_the_stored_call_and_names_a_different_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ce.core.engine import ContextEngine
    from ce.core.tokens import CharBasedEstimator, TiktokenEstimator, tokenizer_name

    if tokenizer_name(TiktokenEstimator(), "gpt-4o") != "tiktoken:o200k_base":
        pytest.skip("tiktoken's o200k_base is not available here (TIKTOKEN_CACHE_DIR)")
    url = f"sqlite:///{tmp_path / 'ce.db'}"
    config = RuntimeConfig(model_hint="gpt-4o", budget=BudgetConfig(max_input_tokens=4000))

    async def record(estimator: Any, session_id: str) -> str:
        engine = ContextEngine(open_store(url), config=config, token_estimator=estimator)
        await engine.set_system_instruction(session_id, "You are terse.")
        # Chinese text: the character estimate (1.2 a character) is far from o200k_base's
        prepared = await engine.prepare_turn(
            session_id, "巴黎今天的天气怎么样？请告诉我温度和降雨概率。"
        )
        await engine.close()
        return prepared.report.turn_id

    exact = asyncio.run(record(TiktokenEstimator(), "exact"))
    code, out, err = _run(capsys, "--store", url, "replay", "exact", "1", "--budget", "2000")
    assert (code, err) == (0, "")
    assert f"{exact} as recorded: " in out
    assert "note:" not in out  # same tokenizer, same call

    asyncio.run(record(CharBasedEstimator(), "chars"))
    code, out, err = _run(capsys, "--store", url, "replay", "chars", "1", "--budget", "2000")
    assert (code, err) == (0, "")
    text = " ".join(out.split())
    assert "the call was counted with chars; this machine counts with tiktoken:o200k_base" in text
    assert "were recorded; the '(stored)' side below is the rebuilt call" in text
