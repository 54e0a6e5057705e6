"""``ce view``'s JSON API and server over the stored demo sessions (real SQLite store, real
engine, real HTTP on a loopback port)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from view_demo import EMAIL, SESSION, XSS_SESSION, XSS_TEXT, build
from view_support import fetch

from ce.core.cli import main
from ce.core.stores import SessionChanges, open_store
from ce.core.view import turn_json

Api = Callable[[str], Any]


def _by_uri(items: list[dict[str, Any]], uri: str) -> dict[str, Any]:
    [found] = [i for i in items if i.get("source", {}).get("uri") == uri]
    return found


def test_sessions_list_counts_authors_and_activity(api: Api) -> None:
    sessions = {s["session_id"]: s for s in api("/api/sessions")["sessions"]}
    assert set(sessions) == {SESSION, XSS_SESSION}
    trip = sessions[SESSION]
    assert (trip["messages"], trip["tool_calls"], trip["evidences"]) == (13, 4, 9)
    assert (trip["model_calls"], trip["turns"]) == (5, 5)
    assert trip["authors"] == ["alice", "planner", "researcher"]
    assert trip["last_activity"].startswith("2026-03-02T09:00:")
    assert trip["version"] > 0


def test_session_timeline_messages_tools_evidences_and_model_calls(api: Api) -> None:
    session = api(f"/api/sessions/{SESSION}")
    timeline = session["timeline"]
    messages = [i for i in timeline if i["item"] == "message"]
    assert [m["index"] for m in messages] == list(range(13))
    authors = [(m["role"], (m["author"] or {}).get("id")) for m in messages]
    assert authors[:3] == [("system", None), ("user", "alice"), ("assistant", "planner")]
    assert authors[5] == ("assistant", "researcher")

    # the planner's parallel tool calls, each with its run's status and duration
    requests = {r["name"]: r for r in messages[7]["tool_calls"]}
    assert requests["weather"]["call"]["status"] == "success"
    assert requests["weather"]["call"]["duration_ms"] == 120
    assert requests["alerts"]["call"]["status"] == "timeout"
    assert requests["alerts"]["call"]["duration_ms"] == 2500
    assert messages[9]["tool_result"]["status"] == "timeout"

    # model calls: every prepared input sits right before the reply it led to, with tokens
    calls = [i for i in timeline if i["item"] == "model_call"]
    assert [(c["turn"], c["kind"]) for c in calls] == [
        (1, "turn"),
        (2, "call"),
        (3, "turn"),
        (4, "call"),
        (5, "turn"),
    ]
    for call in calls:
        after = timeline[timeline.index(call) + 1]
        assert (after["item"], after["index"]) == ("message", call["reply_index"])
        assert after["role"] == "assistant"
        assert 0 < call["token_used"] <= call["token_budget"] == 620
    last = calls[-1]["actions"]
    assert (last["kept"]["blocks"], last["degraded"]["blocks"], last["dropped"]["blocks"]) == (
        10,
        1,
        1,
    )
    # the reply's usage: latency and tokens (named after the call, or paired in order)
    assert messages[5]["usage"]["model_usage_id"] == "answer-1"
    assert (messages[5]["usage"]["latency_ms"], messages[5]["usage"]["prompt_tokens"]) == (
        1240,
        780,
    )
    assert messages[2]["usage"]["stage"] == "tool_call"
    assert messages[2]["usage"]["first_token_latency_ms"] == 310
    assert [u["message_index"] for u in session["model_usage"]] == [2, 5, 7, 10, 12]

    # retrievals: by the kb_search tool (with its call) and by the app before the last turn
    evidences = [i for i in timeline if i["item"] == "evidence"]
    paris = _by_uri(evidences, "kb://paris")
    assert (paris["type"], paris["score"], paris["tool_call_id"]) == ("rag_doc", 0.82, "call-kb-1")
    assert paris["tool_call"]["tool"] == "kb_search"
    friday = _by_uri(evidences, "kb://friday")
    assert friday["tool_call"] is None
    assert timeline.index(messages[10]) < timeline.index(friday) < timeline.index(messages[11])


def test_redacted_email_is_shown_as_its_marker_and_stored_nowhere(api: Api) -> None:
    session = api(f"/api/sessions/{SESSION}")
    assert EMAIL not in json.dumps(session)
    user = session["timeline"][1]
    assert "Mail [REDACTED:email]." in user["content"]
    assert user["redactions"] == 1
    first = api(f"/api/sessions/{SESSION}/turns/1")
    [redaction] = first["redactions"]
    assert redaction["evidence_id"] == first["decisions"][1]["block_id"]  # the user message
    assert (redaction["rules_applied"], redaction["fields_redacted"]) == (["email"], 1)
    tool = next(e for e in session["evidences"] if e["tool_call_id"] == "call-weather-2")
    assert '"contact": "[REDACTED:email]"' in tool["content"] and tool["redactions"] == 1


def test_model_call_input_decisions_and_evidence_provenance(api: Api) -> None:
    turn = api(f"/api/sessions/{SESSION}/turns/-1")
    assert turn["turn"]["turn"] == 5 and turn["turns"] == 5
    assert (turn["turn"]["max_input_tokens"], turn["turn"]["reserved_reply_tokens"]) == (820, 200)
    decisions = {d["block_id"]: d for d in turn["decisions"]}
    degraded = [d for d in decisions.values() if d["action"] == "degraded"]
    dropped = [d for d in decisions.values() if d["action"] == "dropped"]
    assert [d["evidence"]["source"]["uri"] for d in degraded] == ["kb://packing"]
    assert degraded[0]["level"] == "gist" and degraded[0]["saved_tokens"] > 0
    assert degraded[0]["evidence"]["doc_id"] == "packing-guide"
    assert [d["evidence"]["source"]["uri"] for d in dropped] == ["kb://rail"]
    assert dropped[0]["reason"].startswith("budget exhausted") and dropped[0]["level"] is None
    assert decisions["instruction"]["reason"] == "must keep"
    assert turn["totals"]["degraded"] == {"blocks": 1, "tokens": degraded[0]["tokens"]}

    # the input: reassembled, and it made exactly the stored decisions
    given = turn["input"]
    assert given["available"] and given["matches_report"] and given["problem"] == ""
    assert given["total_tokens"] == turn["turn"]["token_used"]
    text = "\n".join(p["content"] for p in given["parts"])
    assert "Friday forecast" in text  # kept
    assert "Night trains" not in text  # dropped
    assert "[11 more sentences omitted]" in text  # degraded to its gist
    assert text.count("[REDACTED:email]") == given["redactions"] == 2
    assert EMAIL not in text
    assert [p["role"] for p in given["parts"]][-1] == "user"
    # evidences carried inside tool results, with the call that produced them
    carried = {e["tool_call_id"]: e for e in given["evidences"] if e["type"] == "tool_result"}
    assert carried["call-alerts-2"]["tool_call"]["status"] == "timeout"
    assert carried["call-weather-2"]["message"] == 9
    assert turn["reply"]["author"]["id"] == "researcher"
    assert turn["reply"]["usage"]["latency_ms"] == 1240


def test_replay_under_another_budget_diffs_inputs_and_decisions(api: Api) -> None:
    replay = api(f"/api/sessions/{SESSION}/turns/5/replay?budget=450")
    assert replay["labels"][0].endswith("@ 820 tokens (stored)")
    assert replay["labels"][1].endswith("@ 450 tokens")
    assert replay["before"]["total_tokens"] == 597
    assert replay["after"]["total_tokens"] <= replay["after"]["token_budget"] < 450
    changed = {c["label"].split(":")[0] + c["before"]: c["after"] for c in replay["changed"]}
    assert changed["rag_doc rag" + "kept @live"] == "dropped"  # the Friday forecast
    assert not replay["identical"]
    removed = [line["text"] for line in replay["diff"] if line["op"] == "-"]
    assert any("Friday forecast" in line for line in removed)
    assert replay["diff"][0]["op"] == "h" and replay["diff"][2]["op"] == "@"

    same = api(f"/api/sessions/{SESSION}/turns/5/replay?budget=820")
    assert same["identical"] and same["changed"] == [] and same["diff"] == []


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/api/sessions/nope", 404, "no session 'nope'"),
        (f"/api/sessions/{SESSION}/turns/99", 404, "has no turn '99'"),
        (f"/api/sessions/{SESSION}/turns/5/replay", 400, "needs ?budget=N"),
        (f"/api/sessions/{SESSION}/turns/5/replay?budget=abc", 400, "budget must be an integer"),
        (f"/api/sessions/{SESSION}/turns/5/replay?budget=12", 400, "cannot hold the blocks"),
        ("/api/nothing", 404, "no such API path"),
        ("/static/../../etc/passwd", 404, "no such page"),
    ],
)
def test_errors_are_json_with_a_reason(viewer_url: str, path: str, status: int, says: str) -> None:
    code, body, _ = fetch(viewer_url.rstrip("/") + path)
    assert code == status and says in body["error"]


def test_page_files_are_served_with_a_strict_policy(viewer_url: str) -> None:
    code, page, head = fetch(viewer_url)
    assert code == 200 and '<script src="/static/viewer.js"' in page
    assert "script-src 'self'" in head["Content-Security-Policy"]
    assert head["X-Content-Type-Options"] == "nosniff"
    code, script, head = fetch(viewer_url + "static/viewer.js")
    assert code == 200 and head["Content-Type"].startswith("text/javascript")
    assert ".innerHTML" not in script  # content only ever becomes text nodes
    # a page elsewhere reaching this port through its own host name (DNS rebinding) is refused
    code, _, _ = fetch(viewer_url + "api/sessions", {"Host": "attacker.example:80"})
    assert code == 403


def test_markup_in_a_session_comes_back_verbatim(api: Api) -> None:
    session = api(f"/api/sessions/{XSS_SESSION}")
    assert session["timeline"][0]["content"] == XSS_TEXT


def test_reading_never_writes(demo_store_url: str, api: Api) -> None:
    async def versions() -> list[int]:
        store = open_store(demo_store_url)
        try:
            return [await store.get_version(s) for s in (SESSION, XSS_SESSION)]
        finally:
            await store.close()

    before = asyncio.run(versions())
    api(f"/api/sessions/{SESSION}/turns/3")
    api(f"/api/sessions/{SESSION}/turns/5/replay?budget=300")
    assert asyncio.run(versions()) == before


def test_ce_view_never_creates_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "absent" / "sessions.db"
    assert main(["view", "--store", f"sqlite:///{missing}", "--port", "0"]) == 2
    assert "no store at" in capsys.readouterr().err
    assert not missing.parent.exists()


def test_ce_view_on_a_taken_port_says_so(
    demo_store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["view", "--store", demo_store_url, "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot serve on 127.0.0.1:{port}" in err and "--port 0" in err


async def test_the_page_says_when_the_input_cannot_be_the_one_sent(tmp_path: Path) -> None:
    """A stored report the reassembly does not reproduce, and a turn whose config is not
    stored: the input is flagged, or missing with the reason, never silently wrong."""
    url = f"sqlite:///{tmp_path / 'ce.db'}"
    await build(url)
    store = open_store(url)
    try:
        [*_, last] = await store.list_turns(SESSION)
        report = last.report.model_copy(
            update={
                "turn_id": "tampered",
                "prune_decisions": [
                    d.model_copy(update={"token_estimate": d.token_estimate + 1})
                    for d in last.report.prune_decisions
                ],
            }
        )
        tampered = last.model_copy(update={"turn_id": "tampered", "report": report})
        orphan = last.model_copy(update={"turn_id": "orphan", "config": {}, "config_id": "nowhere"})
        await store.commit(SESSION, SessionChanges(turns=[tampered, orphan]))

        flagged = await turn_json(store, SESSION, "tampered")
        assert flagged["input"]["available"] and not flagged["input"]["matches_report"]
        assert flagged["input"]["parts"]  # still shown, under the warning
        missing = await turn_json(store, SESSION, "orphan")
        assert not missing["input"]["available"] and missing["input"]["parts"] == []
        assert "config" in missing["input"]["problem"]
        assert missing["decisions"]  # the stored report is shown all the same
        exact = await turn_json(store, SESSION, last.turn_id)
        assert exact["input"]["matches_report"]
    finally:
        await store.close()


def test_ce_view_serves_until_interrupted(demo_store_url: str) -> None:
    """The command itself, in its own process: it prints the page's URL, serves the API,
    and Ctrl-C stops it with exit code 130 and no traceback."""
    command = [sys.executable, "-m", "ce.core.cli", "view", "--store", demo_store_url]
    process = subprocess.Popen(
        [*command, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith(f"ce view: {demo_store_url} at http://127.0.0.1:")
        page = line.split(" at ", 1)[1].split()[0]
        status, body, _ = fetch(page + "api/sessions")
        assert status == 200 and len(body["sessions"]) == 2
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130 and "Traceback" not in err


# ``ce view`` in a child process whose Ctrl-C lands on another thread than the main one (the
# kernel hands a process its SIGINT on any thread that does not block it: on a busy machine,
# now and then the server's): a helper thread waits for a byte on stdin, then signals itself.
_SIGINT_ON_ANOTHER_THREAD = """
import signal, sys, threading
from ce.core.cli import main

def interrupt() -> None:
    sys.stdin.read(1)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)

threading.Thread(target=interrupt, daemon=True).start()
sys.exit(main(["view", "--store", sys.argv[1], "--port", "0"]))
"""


def test_ce_view_stops_on_a_ctrl_c_that_reaches_another_thread(demo_store_url: str) -> None:
    """Python runs a signal's handler on the main thread once that thread runs: a SIGINT the
    kernel delivered to another thread of ``ce view`` was left waiting while the main thread
    slept in the event loop's select, and the command never stopped."""
    process = subprocess.Popen(
        [sys.executable, "-c", _SIGINT_ON_ANOTHER_THREAD, demo_store_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert process.stdout is not None and process.stdin is not None
        assert process.stdout.readline().startswith(f"ce view: {demo_store_url} at ")
        process.stdin.write("x")
        process.stdin.flush()
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130 and "Traceback" not in err
