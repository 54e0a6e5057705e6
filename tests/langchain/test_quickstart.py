"""examples/quickstart.py runs as the README says (in a scratch directory, offline), prints a
report per model call, stores the session under ./.ce/, and ``ce report`` agrees with it."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ce.core.stores import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
CALL = re.compile(r"^  model call (\d+): (\d+)/(\d+) tokens, turn (\S+)$")
DECISION = re.compile(
    r"^    (kept|degraded|dropped)\s+(\S+)\s+(?:x(\d+)\s+)?(\d+) tok(?: \(saved (\d+)\))?"
    r"(?: @(\w+))?$"
)


def _run(args: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "CE_STORE_URL"}
    env["COLUMNS"] = "250"  # the CLI's table stays one line per decision
    done = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _tokens(tokens: object, saved: object) -> str:
    """A decision's tokens and what degrading saved, as the example and `ce report` show them."""
    return f"{tokens} (saved {saved})" if saved else str(tokens)


def _reports(out: str) -> dict[str, tuple[str, list[tuple[str, ...]]]]:
    """turn id -> ("used/budget", [(action, block, tokens, level), ...]) as printed."""
    reports: dict[str, tuple[str, list[tuple[str, ...]]]] = {}
    decisions: list[tuple[str, ...]] = []
    for line in out.splitlines():
        if match := CALL.match(line):
            decisions = []
            reports[match[4]] = (f"{match[2]}/{match[3]}", decisions)
        elif match := DECISION.match(line):
            action, block, _, tokens, saved, level = match.groups()
            decisions.append((action, block, _tokens(tokens, saved), level or "-"))
    return reports


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    cwd = tmp_path_factory.mktemp("quickstart")
    for _ in range(2):  # a second run starts the session afresh
        out = _run([str(ROOT / "examples" / "quickstart.py")], cwd)
    return cwd, out


def test_quickstart_prints_a_report_per_model_call_as_it_happens(
    quickstart: tuple[Path, str],
) -> None:
    cwd, out = quickstart
    assert (cwd / ".ce" / "sessions.db").is_file()
    assert "session 'quickstart' stored in sqlite:///.ce/sessions.db" in out
    assert "ce report quickstart" in out
    assert "16 messages, 6 tool calls" in out and "6 model calls, 6 reports" in out
    assert "jane@example.com" in out  # the question as asked; the store has it redacted
    # per turn: the question, the reports of its model calls, then the answer
    assert out.index("== turn 1") < out.index("  model call 1:") < out.index("< Paris")
    assert out.index("< Paris") < out.index("== turn 2") < out.index("  model call 3:")
    assert out.index("  model call 4:") < out.index("< Oslo") < out.index("== turn 3")
    reports = _reports(out)
    assert len(reports) == 6
    actions = {d[0] for _, decisions in reports.values() for d in decisions}
    assert {"kept", "dropped"} <= actions  # the small budget drops the oldest history
    if "tokenizer_unavailable" not in out:  # with the exact tokenizer a block degrades too
        degraded = [d for _, ds in reports.values() for d in ds if d[0] == "degraded"]
        assert degraded and all(d[3] in ("summary", "gist") for d in degraded)


def test_the_store_holds_the_same_reports(quickstart: tuple[Path, str]) -> None:
    cwd, out = quickstart
    printed = _reports(out)

    async def stored() -> dict[str, tuple[str, list[tuple[str, ...]]]]:
        store = SQLiteStore(str(cwd / ".ce" / "sessions.db"))
        try:
            doc = await store.get_session("quickstart")
            assert doc is not None
            assert "jane@example.com" not in doc.model_dump_json()  # redacted before storing
            turns = await store.list_turns("quickstart")
        finally:
            await store.close()
        return {
            t.turn_id: (
                f"{t.report.token_used}/{t.report.token_budget}",
                [
                    (
                        d.action,
                        d.block_id,
                        _tokens(d.token_estimate, d.saved_tokens),
                        d.level or "-",
                    )
                    for d in t.report.prune_decisions
                ],
            )
            for t in turns
        }

    assert asyncio.run(stored()) == printed


def test_ce_report_shows_the_same_decisions(quickstart: tuple[Path, str]) -> None:
    pytest.importorskip("rich")  # the ce-core[cli] extra
    cwd, out = quickstart
    cli = "import sys; from ce.core.cli import main; sys.exit(main())"
    for turn_id, (used, decisions) in _reports(out).items():
        shown = _run(["-c", cli, "report", "quickstart", turn_id], cwd)
        assert f"turn {turn_id}" in shown
        tokens, budget = used.split("/")
        assert f"budget {budget} tokens · used {tokens} " in shown
        rows = [
            tuple(cell.strip() for cell in line.strip("│ ").split("│"))
            for line in shown.splitlines()
            if line.startswith("│")
        ]
        assert [(r[0], r[1], r[4], r[2]) for r in rows] == [
            (block, action, tokens, level) for action, block, tokens, level in decisions
        ]


def test_every_command_the_quickstart_prints_works_as_printed(
    quickstart: tuple[Path, str],
) -> None:
    cwd, out = quickstart
    printed = out.partition("see them again from the store")[2].splitlines()[1:]
    commands = [line.split() for line in printed if line.startswith("    ")]
    assert [c[1:] for c in commands] == [
        ["turns", "quickstart"],
        ["report", "quickstart"],
        ["report", "quickstart", "1"],
    ]
    env = {k: v for k, v in os.environ.items() if k != "CE_STORE_URL"}
    for command in commands:
        done = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert (done.returncode, done.stderr) == (0, ""), command
        assert "quickstart" in done.stdout
