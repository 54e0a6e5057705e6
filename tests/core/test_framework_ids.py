"""Framework data never disables the engine: ids the engine would reject (a reused tool-call
id, a result for an unknown or answered call, a message id reused with other content) are
normalised and reported, and the session goes on working. And fail-open never means
unredacted: when the engine cannot serve a call, the framework's own messages still go
through the redactor."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ce.core.config import BudgetConfig, RedactionConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.errors import StoreError
from ce.core.events import Event
from ce.core.integration import (
    INTEGRATION_FAILED,
    REDACTION_FAILED,
    ModelCall,
    Plugin,
    ToolRun,
    assembled_to_openai,
    guarded_sync,
    message_from_openai,
    prepare_openai,
    prepare_openai_sync,
    record_sync,
)
from ce.core.schema import Message, ModelInvocation, Role, ToolCallRequest
from ce.core.stores import MemoryStore
from ce.core.testing import deterministic_engine
from ce.core.testing.assertions import unfenced

CANARY_MAIL = "carol.canary@example.com"
INV = ModelInvocation(provider="openai", model="gpt-4o")


class IdsPlugin(Plugin):
    name = "ids"

    def _install(self, **options: Any) -> None:
        return None


def _install(engine: ContextEngine, **kwargs: Any) -> IdsPlugin:
    plugin = IdsPlugin()
    if plugin.installed:
        plugin.uninstall()
    plugin.failures.clear()
    return plugin.install(engine, **kwargs)


def _degraded(engine: ContextEngine) -> list[Event]:
    seen: list[Event] = []
    engine.events.on("Degraded", seen.append)
    return seen


def _call(call_id: str, name: str = "lookup", args: str = '{"q": "x"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _assert_pairs(sent: list[dict[str, Any]]) -> None:
    """Every tool message answers a call of the assistant message before it, and every call
    is answered (OpenAI order)."""
    open_calls: set[str] = set()
    for message in sent:
        if message["role"] == "assistant":
            assert not open_calls, f"unanswered calls {open_calls} before {message}"
            open_calls = {c["id"] for c in message.get("tool_calls") or []}
        elif message["role"] == "tool":
            assert message["tool_call_id"] in open_calls, message
            open_calls.discard(message["tool_call_id"])
        else:
            assert not open_calls, f"unanswered calls {open_calls} before {message}"


def _turn(question: str, call_id: str, result: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [_call(call_id)]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def test_a_tool_call_id_reused_in_a_later_turn_keeps_the_session_working() -> None:
    engine = deterministic_engine()
    plugin = _install(engine)
    degraded = _degraded(engine)
    history = [{"role": "system", "content": "You look things up."}]
    history += _turn("first question", "call_0", "first result")
    assert prepare_openai_sync(plugin, "s", history) is not None
    history.append({"role": "assistant", "content": "first answer"})
    history += _turn(f"second question, mail {CANARY_MAIL}", "call_0", "second result")
    sent = prepare_openai_sync(plugin, "s", history)
    assert sent is not None
    assert not plugin.failures
    _assert_pairs(sent)
    texts = [unfenced(m.get("content")) for m in sent]  # tool output arrives fenced
    assert "first result" in texts and "second result" in texts
    assert not any(CANARY_MAIL in json.dumps(m) for m in sent)
    ids = [c["id"] for m in sent for c in m.get("tool_calls") or []]
    assert len(ids) == len(set(ids)) == 2  # unique in the request, pairs intact
    assert [e.payload["reason"] for e in degraded].count("tool_call_id_reused") == 1
    # the framework passes the same history again: nothing is recorded twice
    history.append({"role": "assistant", "content": "second answer"})
    history.append({"role": "user", "content": "third question"})
    before = len(engine.sync.get_session("s").session.messages)
    again = prepare_openai_sync(plugin, "s", history)
    assert again is not None and not plugin.failures
    doc = engine.sync.get_session("s")
    assert len(doc.session.messages) == before + 2
    assert [e.payload["reason"] for e in degraded].count("tool_call_id_reused") == 1
    # a fresh engine on the same store rebuilds the mapping and records nothing twice
    fresh = ContextEngine(engine.store, config=engine.config)
    plugin.uninstall()
    plugin = _install(fresh)
    assert prepare_openai_sync(plugin, "s", history) is not None
    assert len(fresh.sync.get_session("s").session.messages) == before + 2
    plugin.uninstall()


def test_reused_id_through_the_recorder_paths() -> None:
    """The reply recorded at the end of the model call, the tool run recorded by the tool
    hook, then the next call: the second run of ``call_0`` is stored, recorded and paired."""
    engine = deterministic_engine()
    plugin = _install(engine)
    invocation = {"provider": "openai", "model": "gpt-4o"}
    for turn, result in ((1, "sunny"), (2, "rainy")):
        question = {"role": "user", "content": f"weather {turn}?"}
        assert prepare_openai_sync(plugin, "s", [question]) is not None
        reply = message_from_openai(
            {"role": "assistant", "content": "", "tool_calls": [_call("call_0")]}
        ).model_copy(update={"invocation": ModelInvocation(**invocation)})
        call = ModelCall(call_id=f"m{turn}", **invocation)
        record_sync(plugin, "s", "reply", lambda r, c=call, m=reply: r.record_model_call(c, m))
        run = ToolRun("call_0", "lookup", {"q": "x"}, result, None, 1.0, 2.0)
        record_sync(plugin, "s", "tool", lambda r, t=run: r.record_tool_run(t))
        pending = [question, {"role": "assistant", "content": "", "tool_calls": [_call("call_0")]}]
        pending.append({"role": "tool", "tool_call_id": "call_0", "content": result})
        sent = prepare_openai_sync(plugin, "s", pending)
        assert sent is not None
        _assert_pairs(sent)
        assert sent[-1]["content"].endswith(result) or result in sent[-1]["content"]
    assert not plugin.failures
    doc = engine.sync.get_session("s")
    records = doc.session.tool_state.tool_calls
    assert len(records) == 2 and len({r.tool_call_id for r in records}) == 2
    results = {e.links.tool_call_id: e.content for e in doc.evidences.values() if e.links}
    assert sorted(v for v in results.values() if v in ("sunny", "rainy")) == ["rainy", "sunny"]
    plugin.uninstall()


def test_a_reused_id_with_the_same_result_is_answered_when_only_the_new_turn_is_sent() -> None:
    """A framework that sends only the new turn (the session holds the rest) and a server
    that names every turn's call ``call_0``: the same tool, the same result text. The new
    result answers the new call (it is not taken for the stored result of the old one), so
    the model sees its call answered and does not ask again."""
    engine = deterministic_engine()
    plugin = _install(engine)
    assert prepare_openai_sync(plugin, "s", _turn("first question", "call_0", "same")) is not None
    engine.sync.commit_assistant_message(
        "s", Message(role=Role.ASSISTANT, content="first answer", invocation=INV)
    )
    assert prepare_openai_sync(plugin, "s", [{"role": "user", "content": "again?"}])
    # the model's reply is recorded as it arrives (the reused id is stored renamed) ...
    engine.sync.commit_assistant_message(
        "s",
        Message(
            role=Role.ASSISTANT,
            content="",
            tool_calls=[ToolCallRequest(tool_call_id="call_0", name="lookup", raw_arguments="{}")],
            invocation=INV,
        ),
    )
    # ... and the framework's next call sends the new turn with the same result text
    sent = prepare_openai_sync(plugin, "s", _turn("again?", "call_0", "same"))
    assert sent is not None and not plugin.failures
    _assert_pairs(sent)
    assert [m["role"] for m in sent[-2:]] == ["assistant", "tool"]  # the new call, answered
    assert unfenced(sent[-1]["content"]) == "same"
    doc = engine.sync.get_session("s")
    assert not engine.sync.run(engine.prepare_call("s", [])).report.errors
    tools = [m for m in doc.session.messages if m.role is Role.TOOL]
    assert len(tools) == 2 and tools[0].tool_call_id != tools[1].tool_call_id
    plugin.uninstall()


def test_the_same_call_in_a_repeated_task_reaches_the_model_when_only_the_turn_is_sent() -> None:
    """A crew kicked off again on a named session: each request carries only the task's own
    messages (its prompt, then its tool round), the model makes the very same call under the
    same id with the same result, and its tool-call reply is not recorded before the
    framework sends the round back. The round is the new task's (the session's newest
    question opened it and holds no such call yet): it reaches the model, answered, and is
    stored once; the model is not asked again and again for a call it already made."""
    engine = deterministic_engine()
    plugin = _install(engine)
    system = {"role": "system", "content": "You are the researcher."}
    task = {"role": "user", "content": "Current Task: the weather in Paris?"}
    for kickoff in range(3):
        assert prepare_openai_sync(plugin, "s", [system, task]) is not None
        sent = prepare_openai_sync(
            plugin, "s", [system, *_turn(task["content"], "call_w", "sunny")]
        )
        assert sent is not None and not plugin.failures
        _assert_pairs(sent)
        assert [m["role"] for m in sent[-3:]] == ["user", "assistant", "tool"], kickoff
        assert unfenced(sent[-1]["content"]) == "sunny"
        engine.sync.commit_assistant_message(
            "s", Message(role=Role.ASSISTANT, content="Sunny.", invocation=INV)
        )
    doc = engine.sync.get_session("s")
    assert doc is not None
    calls = [m for m in doc.session.messages if m.tool_calls]
    assert len(calls) == 3 and len({m.tool_calls[0].tool_call_id for m in calls}) == 3
    assert len([m for m in doc.session.messages if m.role is Role.TOOL]) == 3
    plugin.uninstall()


def test_unknown_and_answered_results_and_repeated_ids_in_one_reply() -> None:
    engine = deterministic_engine()
    plugin = _install(engine)
    degraded = _degraded(engine)
    pending = [
        {"role": "user", "content": "go"},
        {"role": "tool", "tool_call_id": "ghost", "content": "orphan"},
        {"role": "assistant", "content": "", "tool_calls": [_call("c1"), _call("c1", "other")]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c1", "content": "two"},
        {"role": "tool", "tool_call_id": "c1", "content": "three"},
    ]
    sent = prepare_openai_sync(plugin, "s", pending)
    assert sent is not None and not plugin.failures
    _assert_pairs(sent)
    assert "orphan" not in json.dumps(sent) and "three" not in json.dumps(sent)
    assert {"one", "two"} <= {unfenced(m.get("content")) for m in sent}
    reasons = {e.payload["reason"] for e in degraded}
    assert {"orphan_tool_result", "tool_call_id_reused"} <= reasons
    plugin.uninstall()


def _prepare(plugin: Plugin, session_id: str, history: list[dict[str, Any]]) -> Any:
    """What a plugin does before a model call, keeping the framework's message ids (an
    ``id`` key here): the pending messages to ``prepare_call``, guarded, as OpenAI dicts."""
    pending = [
        message_from_openai({k: v for k, v in m.items() if k != "id"}).model_copy(
            update={"message_id": m.get("id")}
        )
        for m in history
    ]
    engine = plugin.engine
    result = guarded_sync(
        plugin,
        lambda: engine.sync.prepare_call(session_id, pending, plugin.config),
        session_id=session_id,
        what="prepare_call",
    )
    return None if result is None else assembled_to_openai(result.assembled_input)


def test_a_message_id_reused_with_other_content_is_recorded_and_reported() -> None:
    engine = deterministic_engine()
    plugin = _install(engine)
    degraded = _degraded(engine)
    first = [{"role": "user", "content": "alpha", "id": "m1"}]
    assert _prepare(plugin, "s", first) is not None
    second = [*first, {"role": "user", "content": "beta", "id": "m1"}]
    sent = _prepare(plugin, "s", second)
    assert sent is not None and not plugin.failures
    assert [m["content"] for m in sent if m["role"] == "user"] == ["alpha", "beta"]
    assert [e.payload["reason"] for e in degraded].count("duplicate_message_id") == 1
    # passed again, or read by a fresh engine: recorded once
    assert _prepare(plugin, "s", second) == sent
    plugin.uninstall()
    plugin = _install(ContextEngine(engine.store, config=engine.config))
    assert _prepare(plugin, "s", second) == sent
    assert len(engine.sync.get_session("s").session.messages) == 2
    assert [e.payload["reason"] for e in degraded].count("duplicate_message_id") == 1
    plugin.uninstall()


class BrokenStore(MemoryStore):
    """A store every read and write of which fails (a database that went away)."""

    async def read_since(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError("the database went away")

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError("the database went away")


def _mail_request() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"Mail {CANARY_MAIL} about it"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("c1", args=json.dumps({"to": CANARY_MAIL}))],
        },
        {"role": "tool", "tool_call_id": "c1", "content": f"sent to {CANARY_MAIL}"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"cc {CANARY_MAIL}"},
                {"type": "image_url", "image_url": {"url": "data:x"}},
            ],
        },
    ]


def test_fail_open_still_redacts_sync_and_async() -> None:
    engine = ContextEngine(BrokenStore(), config=RuntimeConfig(model_hint="gpt-4o"))
    plugin = _install(engine)
    degraded = _degraded(engine)
    request = _mail_request()
    sent = prepare_openai_sync(plugin, "s", request)
    assert sent is not None
    assert CANARY_MAIL not in json.dumps(sent)
    assert "[REDACTED:email]" in sent[1]["content"]
    assert sent[4]["content"][1] == request[4]["content"][1]  # the image part unchanged
    assert [m["role"] for m in sent] == [m["role"] for m in request]
    assert sent[2]["tool_calls"][0]["id"] == "c1"
    assert request[1]["content"] == f"Mail {CANARY_MAIL} about it"  # the caller's list intact
    assert plugin.failures[INTEGRATION_FAILED] == 1
    assert [e.payload["reason"] for e in degraded] == [INTEGRATION_FAILED]

    import asyncio

    sent = asyncio.run(prepare_openai(plugin, "s", request))
    assert sent is not None and CANARY_MAIL not in json.dumps(sent)
    assert plugin.failures[INTEGRATION_FAILED] == 2
    plugin.uninstall()


def test_fail_open_when_redaction_fails_too_is_counted_and_reported(caplog: Any) -> None:
    engine = ContextEngine(BrokenStore(), config=RuntimeConfig(model_hint="gpt-4o"))

    def broken(config: Any = None) -> Any:
        raise RuntimeError("the redactor is broken")

    engine.redactor_for = broken  # type: ignore[method-assign]
    plugin = _install(engine)
    degraded = _degraded(engine)
    with caplog.at_level("WARNING", logger="ce.core.integration"):
        assert prepare_openai_sync(plugin, "s", _mail_request()) is None  # send your own
    assert plugin.failures[REDACTION_FAILED] == 1
    assert [e.payload["reason"] for e in degraded] == [INTEGRATION_FAILED, REDACTION_FAILED]
    assert any("redaction failed" in r.getMessage() for r in caplog.records)
    plugin.uninstall()
    # with redaction off the framework's own messages go as they are
    off = RuntimeConfig(model_hint="gpt-4o", redaction=RedactionConfig(enabled=False))
    engine = ContextEngine(BrokenStore(), config=off)
    plugin = _install(engine)
    assert prepare_openai_sync(plugin, "s", _mail_request()) is None
    assert not plugin.failures[REDACTION_FAILED]
    plugin.uninstall()


# -- property: random framework event sequences never disable the engine -------------------

_IDS = st.sampled_from(["call_0", "call_1", "c", "x"])
_EVENT = st.one_of(
    st.tuples(st.just("user"), st.sampled_from(["hi", "again", f"mail {CANARY_MAIL}"])),
    st.tuples(st.just("calls"), st.lists(_IDS, min_size=1, max_size=3)),
    st.tuples(st.just("result"), _IDS),
    st.tuples(st.just("answer"), st.sampled_from(["ok", "done"])),
    st.tuples(st.just("record_reply"), st.lists(_IDS, max_size=2)),
    st.tuples(st.just("record_tool"), _IDS),
    st.tuples(st.just("dup_id"), st.sampled_from(["m1", "m2"])),
)


@settings(max_examples=60)
@given(events=st.lists(_EVENT, min_size=1, max_size=14), budget=st.sampled_from([700, 4000]))
def test_random_framework_events_never_raise_nor_fail_open(
    events: list[tuple[str, Any]], budget: int
) -> None:
    config = RuntimeConfig(
        model_hint="gpt-4o", budget=BudgetConfig(max_input_tokens=budget, reserved_reply_tokens=100)
    )
    engine = deterministic_engine(config)
    plugin = _install(engine)
    history: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for kind, value in events:
        if kind == "user":
            history.append({"role": "user", "content": value})
        elif kind == "calls":
            history.append(
                {"role": "assistant", "content": "", "tool_calls": [_call(i) for i in value]}
            )
        elif kind == "result":
            history.append({"role": "tool", "tool_call_id": value, "content": f"r-{value}"})
        elif kind == "answer":
            history.append({"role": "assistant", "content": value})
        elif kind == "record_reply":
            reply = message_from_openai(
                {"role": "assistant", "content": "", "tool_calls": [_call(i) for i in value]}
                if value
                else {"role": "assistant", "content": "said"}
            ).model_copy(update={"invocation": ModelInvocation(provider="p", model="m")})
            call = ModelCall(call_id=f"u{len(history)}", provider="p", model="m")
            record_sync(plugin, "s", "reply", lambda r, c=call, m=reply: r.record_model_call(c, m))
        elif kind == "record_tool":
            run = ToolRun(value, "lookup", {"q": "x"}, "rec", None, 1.0, 2.0)
            record_sync(plugin, "s", "tool", lambda r, t=run: r.record_tool_run(t))
        else:
            history.append({"role": "user", "content": f"{value}-{len(history)}", "id": value})
        if history[-1]["role"] == "system":
            continue
        sent = _prepare(plugin, "s", history)
        assert sent is not None
        assert not plugin.failures, plugin.failures
        _assert_pairs(sent)
        assert CANARY_MAIL not in json.dumps(sent)
    # and the session still serves a normal call afterwards
    history.append({"role": "user", "content": "last"})
    sent = _prepare(plugin, "s", history)
    assert sent is not None and not plugin.failures
    assert sent[-1] == {"role": "user", "content": "last"}
    assert engine.sync.get_session("s").session.messages[-1].role is Role.USER
    plugin.uninstall()


def test_a_question_asked_again_with_a_fresh_history_reaches_the_model() -> None:
    """A framework that passes only the new question (a fresh memory on a named session):
    the same text asked again is a new turn, not a message the session already holds; a
    retried call (the session already ends with it) is not recorded twice."""
    engine = deterministic_engine()
    plugin = _install(engine)
    system = {"role": "system", "content": "You answer."}
    question = {"role": "user", "content": "weather?"}
    for answer in ("sunny", "rainy"):
        sent = prepare_openai_sync(plugin, "s", [system, question])
        assert sent is not None and sent[-1] == question
        history = [m["content"] for m in sent]
        assert history.count("weather?") == (1 if answer == "sunny" else 2)
        reply = message_from_openai({"role": "assistant", "content": answer}).model_copy(
            update={"invocation": ModelInvocation(provider="p", model="m")}
        )
        engine.sync.commit_assistant_message("s", reply)
    # the whole history passed again plus the same question: one more turn, nothing twice
    full = [system, question, {"role": "assistant", "content": "sunny"}, question]
    full += [{"role": "assistant", "content": "rainy"}, question]
    sent = prepare_openai_sync(plugin, "s", full)
    assert sent is not None
    assert [m["content"] for m in sent[1:]] == [
        "weather?",
        "sunny",
        "weather?",
        "rainy",
        "weather?",
    ]
    # a retry of that call (no answer stored in between) records nothing more
    again = prepare_openai_sync(plugin, "s", [system, question])
    assert again == sent
    plugin.uninstall()
