"""A framework's history converted once per session (``HistoryMemo``), and the reconciler
working through its indexes: the same answers as matching every message every call."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ce.core.integration import HistoryMemo, openai_key, reconcile_openai
from ce.core.integration._history import _RECREATED_MAX
from ce.core.integration._reconcile import Key
from ce.core.schema import Author, AuthorKind, Role

# -- an oracle: the reconciler's rules, applied by scanning every app message ---------------


def _oracle_unchanged(app_keys: Sequence[Key], sent_keys: Sequence[Key]) -> list[int | None]:
    match: list[int | None] = [None] * len(sent_keys)
    bound = len(app_keys)
    for i in range(len(sent_keys) - 1, -1, -1):
        for j in range(bound - 1, -1, -1):
            if app_keys[j] == sent_keys[i]:
                match[i] = bound = j
                break
    return match


def _oracle_rewritten(
    app_keys: Sequence[Key], sent_keys: Sequence[Key], match: Sequence[int | None]
) -> dict[int, int]:
    pairs: dict[int, int] = {}
    anchors = [(i, j) for i, j in enumerate(match) if j is not None]
    low_i = low_j = -1
    for high_i, high_j in [*anchors, (len(sent_keys), len(app_keys))]:
        sent_gap, app_gap = range(low_i + 1, high_i), range(low_j + 1, high_j)
        if sent_gap and app_gap:
            for role in ("system", "user"):
                sent_role = [i for i in sent_gap if sent_keys[i][0] == role]
                app_role = [j for j in app_gap if app_keys[j][0] == role]
                if sent_role and len(sent_role) == len(app_role):
                    pairs.update(zip(sent_role, app_role, strict=True))
                elif sent_role and app_role and role == "user" and high_i == len(sent_keys):
                    pairs[sent_role[-1]] = app_role[-1]
            results: dict[Hashable, int] = {
                app_keys[j][2]: j for j in app_gap if app_keys[j][0] == "tool"
            }
            for i in sent_gap:
                if sent_keys[i][0] == "tool" and sent_keys[i][2] in results:
                    pairs[i] = results.pop(sent_keys[i][2])
        low_i, low_j = high_i, high_j
    return pairs


def _oracle(
    app: Sequence[Mapping[str, Any]], sent: Sequence[Mapping[str, Any]], opaque: Sequence[int]
) -> list[tuple[int | None, bool]]:
    """(source, unchanged) of each sent message."""
    app_keys = [openai_key(m) for m in app]
    for hidden in opaque:
        role, _, call_id, name, calls = app_keys[hidden]
        app_keys[hidden] = (role, object(), call_id, name, calls)
    sent_keys = [openai_key(m) for m in sent]
    match = _oracle_unchanged(app_keys, sent_keys)
    rewritten = _oracle_rewritten(app_keys, sent_keys, match)
    return [
        (j, True) if j is not None else ((rewritten[i], False) if i in rewritten else (None, False))
        for i, j in enumerate(match)
    ]


# -- random conversations --------------------------------------------------------------------

_TEXTS = ["hi", "ok", "thanks", "mail bob", "[REDACTED]", "the engine's context"]


@st.composite
def _message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "user", "assistant", "tool", "user", "assistant"]))
    text = draw(st.sampled_from(_TEXTS))
    if role == "tool":
        return {
            "role": "tool",
            "tool_call_id": draw(st.sampled_from(["c1", "c2"])),
            "content": text,
        }
    if role == "assistant" and draw(st.booleans()):
        call_id = draw(st.sampled_from(["c1", "c2"]))
        call = {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    return {"role": role, "content": text}


@st.composite
def _conversation(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    app = draw(st.lists(_message(), max_size=14))
    sent: list[dict[str, Any]] = []
    for message in app:  # the engine keeps, rewrites or drops each; adds its own
        action = draw(st.sampled_from(["keep", "keep", "rewrite", "drop", "add"]))
        if action == "keep":
            sent.append(dict(message))
        elif action == "rewrite":
            sent.append({**message, "content": draw(st.sampled_from(_TEXTS))})
        elif action == "add":
            sent.append(draw(_message()))
            sent.append(dict(message))
    opaque = sorted(draw(st.sets(st.integers(0, max(len(app) - 1, 0)), max_size=2)))
    return app, sent, [j for j in opaque if j < len(app)]


def _origins(
    app: list[dict[str, Any]], sent: list[dict[str, Any]], **kwargs: Any
) -> list[tuple[int | None, bool]]:
    return [
        (o.source, o.source is not None and o.text is None)
        for o in reconcile_openai(app, sent, **kwargs)
    ]


@settings(max_examples=300, deadline=None)
@given(_conversation())
def test_the_reconciler_answers_as_a_scan_of_every_message(case: Any) -> None:
    app, sent, opaque = case
    assert _origins(app, sent, opaque=opaque) == _oracle(app, sent, opaque)


@settings(max_examples=200, deadline=None)
@given(_conversation(), st.integers(0, 14))
def test_a_continued_history_reconciles_as_a_fresh_one(case: Any, cut: int) -> None:
    app, sent, opaque = case
    hidden = set(opaque)
    memo = HistoryMemo()
    objects = [dict(m) for m in app]  # the framework's message objects
    ids = {id(m): j for j, m in enumerate(objects)}

    def to_openai(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [dict(m) for m in messages]

    def is_opaque(message: dict[str, Any]) -> bool:
        return ids[id(message)] in hidden

    memo.convert("s", objects[: min(cut, len(objects))], to_openai, is_opaque)
    history = memo.convert("s", objects, to_openai, is_opaque)
    assert history is not None
    assert history.keys[: len(app)] == [
        k if j not in hidden else history.keys[j] for j, k in enumerate(openai_key(m) for m in app)
    ]
    assert _origins(app, sent, history=history) == _oracle(app, sent, opaque)


def test_only_the_messages_after_the_previous_calls_are_converted() -> None:
    converted: list[str] = []

    def to_openai(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        converted.extend(str(m["content"]) for m in messages)
        return [dict(m) for m in messages]

    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    app: list[dict[str, Any]] = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    memo = HistoryMemo()
    first = memo.convert("s", app, to_openai, lambda m: False)
    app = [*app, {"role": "tool", "tool_call_id": "c1", "content": "r1"}]
    second = memo.convert("s", app, to_openai, lambda m: False)
    assert first is not None and second is not None
    assert converted == ["q1", "", "r1"]
    # the previous call's neutral messages are the very objects (the engine's prefix memo
    # relies on it); a result gets the name of its call, made in an earlier call
    assert second.messages[:2] == first.messages and second.messages[0] is first.messages[0]
    assert second.messages[2].role is Role.TOOL and second.messages[2].name == "lookup"
    # another list (not the previous one continued) is converted whole
    other = [{"role": "user", "content": "q1"}]
    memo.convert("s", other, to_openai, lambda m: False)
    assert converted[-1:] == ["q1"]
    # a conversion that is not one dict per message gives no history
    assert memo.convert("t", app, lambda ms: [], lambda m: False) is None


def test_an_opaque_message_is_never_matched_unchanged() -> None:
    app = [{"role": "user", "content": "hi"}]
    history = HistoryMemo().convert("s", app, lambda ms: [dict(m) for m in ms], lambda m: True)
    assert history is not None and history.opaque == [0]
    (origin,) = reconcile_openai(app, [dict(app[0])], history=history)
    assert (origin.source, origin.text) == (0, "hi")


def test_each_new_message_is_written_by_its_author() -> None:
    from ce.core.schema import Author, AuthorKind

    def by(message: dict[str, Any]) -> Author | None:
        name = message.get("agent")
        return Author(kind=AuthorKind.AGENT, id=name) if name else None

    def to_openai(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"role": m["role"], "content": m["content"]} for m in messages]

    app: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "agent": "writer"},
    ]
    memo = HistoryMemo()
    first = memo.convert("s", app, to_openai, lambda m: False, by)
    app.append({"role": "assistant", "content": "hello", "agent": "critic"})
    second = memo.convert("s", app, to_openai, lambda m: False, by)
    assert first is not None and second is not None
    assert [m.author.id if m.author else None for m in second.messages] == [
        None,
        "writer",
        "critic",
    ]
    assert second.messages[1] is first.messages[1]  # kept from the previous call


def test_a_message_read_as_the_one_before_it_is_a_repeat() -> None:
    def to_openai(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [dict(m) for m in messages]

    reply = {"role": "assistant", "content": "facts"}
    app: list[dict[str, Any]] = [{"role": "user", "content": "go"}, reply]
    memo = HistoryMemo()
    first = memo.convert("s", app, to_openai, lambda m: False)
    app += [dict(reply), {"role": "user", "content": "go"}, {"role": "user", "content": "go"}]
    second = memo.convert("s", app, to_openai, lambda m: False)  # across the two calls too
    assert first is not None and first.repeats == []
    assert second is not None and second.repeats == [2, 4]


# -- a message changed in place since it was converted ---------------------------------------


class _Part:
    def __init__(self, text: str) -> None:
        self.text = text


class _Msg:
    """A framework message: fields in ``__dict__``, its content a list of parts."""

    def __init__(self, role: str, *texts: str) -> None:
        self.role = role
        self.parts = [_Part(t) for t in texts]
        self.meta: dict[str, Any] = {}


class _Slotted:
    __slots__ = ("content", "role")

    def __init__(self, role: str, content: str) -> None:
        self.role, self.content = role, content


def _dicts(messages: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        text = m.content if isinstance(m, _Slotted) else "".join(p.text for p in m.parts)
        out.append({"role": m.role, "content": text})
    return out


def test_a_message_reads_as_converted_until_a_field_or_part_gets_another_value() -> None:
    memo = HistoryMemo()
    first, second = _Msg("user", "hi", "there"), _Slotted("assistant", "ok")
    history = memo.convert("s", [first, second], _dicts, lambda m: False)
    assert history is not None
    assert history.reads_as_converted(0, first) and history.reads_as_converted(1, second)
    assert not history.reads_as_converted(0, second)  # not the message at that position
    assert not history.reads_as_converted(1, _Slotted("assistant", "ok"))  # an equal copy
    second.content = "ok, done"
    assert not history.reads_as_converted(1, second)
    first.parts[1].text = "you"  # a part's field
    assert not history.reads_as_converted(0, first)
    first.parts[1].text = "there"  # back to the very value read: reads as converted again
    assert history.reads_as_converted(0, first)
    first.parts.append(_Part("!"))  # a part added to the same list
    assert not history.reads_as_converted(0, first)
    first.parts.pop()
    first.role = "system"
    assert not history.reads_as_converted(0, first)


def test_a_message_changed_in_place_is_unchanged_only_when_it_converts_the_same() -> None:
    memo = HistoryMemo()
    message = _Slotted("user", "hi")
    history = memo.convert("s", [message], _dicts, lambda m: False)
    assert history is not None
    never = []
    assert history.unchanged(0, message, lambda m: never.append(m))  # not converted again
    assert never == []
    message.content = "".join(["h", "i"])  # an equal value, another object
    assert history.unchanged(0, message, lambda m: never.append(m))  # reads as it did
    message.content = "hello"
    assert not history.unchanged(0, message, lambda m: _dicts([m])[0])
    assert not history.unchanged(0, message, lambda m: None)  # cannot go as it is
    message.content = "hi"
    message.role = "user"  # the same value: reads as converted
    assert history.unchanged(0, message, lambda m: None) and never == []


def test_a_continued_history_keeps_the_fingerprints_of_earlier_messages() -> None:
    memo = HistoryMemo()
    shared = _Msg("system", "be terse")
    app = [shared, _Msg("user", *(f"p{i}" for i in range(300)))]  # a long list of parts
    memo.convert("a", app, _dicts, lambda m: False)
    other = memo.convert("b", [shared, _Msg("user", "hello")], _dicts, lambda m: False)
    app.append(_Msg("assistant", "ok"))
    history = memo.convert("a", app, _dicts, lambda m: False)
    assert history is not None and other is not None
    assert all(history.reads_as_converted(i, m) for i, m in enumerate(app))
    shared.parts[0].text = "be verbose"
    assert not history.reads_as_converted(0, shared)
    assert not other.reads_as_converted(0, shared)


def test_an_agents_history_converted_anew_is_copied_for_its_authors_once() -> None:
    # a framework that builds its agents anew converts the same history on every call: each
    # message is copied for its author once, the shared conversion is never changed
    app = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    writers = {0: Author(kind=AuthorKind.USER, id="u1"), 1: Author(kind=AuthorKind.AGENT, id="a")}

    def convert(key: str) -> Any:
        history = HistoryMemo().convert(
            key,
            app,
            lambda ms: [dict(m) for m in ms],
            lambda m: False,
            lambda m: writers[app.index(m)],
        )
        assert history is not None
        return history.messages

    first, again = convert("s1"), convert("s2")
    assert [m.author for m in first] == [writers[0], writers[1]]
    assert all(a is b for a, b in zip(first, again, strict=True))  # the same copies
    writers[1] = Author(kind=AuthorKind.AGENT, id="b")
    other = convert("s3")
    assert other[0] is first[0] and other[1] is not first[1]
    assert other[1].author == writers[1] and first[1].author == Author(
        kind=AuthorKind.AGENT, id="a"
    )


def _recording(converted: list[str]) -> Any:
    """A ``to_openai`` for dict messages that notes the content of each one it converts."""

    def to_openai(messages: Sequence[Any]) -> list[dict[str, Any]]:
        converted.extend(m["content"] for m in messages)
        return [dict(m) for m in messages]

    return to_openai


def test_a_call_that_passes_a_few_messages_as_new_equal_objects_continues_the_history() -> None:
    # a prompt template builds its system message anew on every call, a memory keeps its own
    # copy of the question: the history goes on, converting only those and what is new
    converted: list[str] = []
    to_openai = _recording(converted)
    memo = HistoryMemo()
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    first = memo.convert("s", [{"role": "system", "content": "be terse"}, *turn], to_openai, _no)
    assert first is not None and converted == ["be terse", "hi", "hello"]
    converted.clear()
    system = {"role": "system", "content": "be terse"}  # an equal, new object
    app = [system, *turn, {"role": "user", "content": "and now?"}]
    history = memo.convert("s", app, to_openai, _no)
    # it reads as the message it stands for (fields of equal values): not converted
    assert history is not None and converted == ["and now?"]
    assert history.app[0] is system and history.reads_as_converted(0, system)
    assert [m.content for m in history.messages] == ["be terse", "hi", "hello", "and now?"]
    converted.clear()
    changed = [{"role": "system", "content": "be verbose"}, *app[1:]]  # another prompt
    history = memo.convert("s", changed, to_openai, _no)
    # the new object read once to compare it, then the history built anew: of its messages
    # only that one is converted (the others are the objects converted before, unchanged)
    assert history is not None
    assert converted == ["be verbose", "be verbose"]
    assert [m.content for m in history.messages] == ["be verbose", "hi", "hello", "and now?"]
    assert history.messages[0].content == "be verbose"


def test_a_call_that_passes_many_previous_messages_anew_continues_when_they_read_the_same() -> None:
    converted: list[str] = []
    to_openai = _recording(converted)
    memo = HistoryMemo()
    app = [{"role": "user", "content": f"q{i}"} for i in range(12)]
    memo.convert("s", app, to_openai, _no)
    converted.clear()
    again = [dict(m) for m in app]  # every message a new object (a history loaded anew)
    history = memo.convert("s", again, to_openai, _no)
    assert history is not None and converted == []
    assert all(a is b for a, b in zip(history.app, again, strict=True))
    # more than a few that read otherwise: built anew, each converted once
    converted.clear()
    changed = [{"role": "user", "content": f"r{i}"} for i in range(12)]
    history = memo.convert("s", changed, to_openai, _no)
    assert history is not None and converted == [f"r{i}" for i in range(12)]
    assert [m.content for m in history.messages] == [f"r{i}" for i in range(12)]


def _no(message: Any) -> bool:
    return False


def test_a_history_loaded_anew_on_every_call_continues_without_converting_it() -> None:
    # an app that loads its history from a database passes new, equal objects on every call:
    # they read as the previous call's messages (same class, equal field values), so only
    # what is new is converted, and the history holds the app's new objects
    converted: list[str] = []
    to_openai = _recording(converted)
    memo = HistoryMemo()

    def load(turns: int) -> list[dict[str, Any]]:
        out = [{"role": "system", "content": "be terse"}]
        for t in range(turns):
            out += [{"role": "user", "content": f"q{t}"}, {"role": "assistant", "content": f"a{t}"}]
        return out

    assert memo.convert("s", load(20), to_openai, _no) is not None
    memo_items = len(converted)
    assert memo_items == 41
    converted.clear()
    app = [*load(20), {"role": "user", "content": "q20"}]
    history = memo.convert("s", app, to_openai, _no)
    assert history is not None and converted == ["q20"]
    assert all(a is b for a, b in zip(history.app, app, strict=True))
    assert all(history.reads_as_converted(i, m) for i, m in enumerate(app))
    assert [m.content for m in history.messages][-2:] == ["a19", "q20"]
    # an older message that reads otherwise now: the history is not that one continued
    converted.clear()
    edited = [*load(20), {"role": "user", "content": "q20"}, {"role": "user", "content": "q21"}]
    edited[3]["content"] = "changed"
    history = memo.convert("s", edited, to_openai, _no)
    assert history is not None and "changed" in converted
    assert [m.content for m in history.messages][3] == "changed"

    # the same values in another class are another message
    class Other(dict):  # type: ignore[type-arg]
        pass

    converted.clear()
    other = [Other(m) for m in edited] + [{"role": "user", "content": "q22"}]
    history = memo.convert("s", other, to_openai, _no)
    assert history is not None and len(converted) > _RECREATED_MAX


def test_a_history_built_anew_converts_only_the_messages_it_has_not_met() -> None:
    # a session's history dropped (evicted, the plugin installed again) or a list that no
    # longer continues the previous call's (trimmed at its head): the messages converted
    # before, unchanged, are not converted again
    converted: list[str] = []
    to_openai = _recording(converted)
    memo = HistoryMemo()
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        ],
    }
    app: list[dict[str, Any]] = [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "hi"},
        call,
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
        {"role": "assistant", "content": "hello"},
    ]
    fresh = memo.convert("s", app, to_openai, _no)
    assert fresh is not None
    memo.forget()
    converted.clear()
    again = memo.convert("s", app, to_openai, _no)
    # a tool result without a name of its own takes it from its history: converted each time
    assert again is not None and converted == ["found"]
    assert [m.model_dump() for m in again.messages] == [m.model_dump() for m in fresh.messages]
    assert again.messages[3].name == "lookup"
    assert again.keys == fresh.keys and again.pending == fresh.pending
    converted.clear()
    trimmed = [app[0], app[4], {"role": "user", "content": "more?"}]
    history = memo.convert("s", trimmed, to_openai, _no)
    assert history is not None and converted == ["more?"]
    assert [m.content for m in history.messages] == ["be terse", "hello", "more?"]
    app[1]["content"] = "hey"  # changed in place: converted again
    converted.clear()
    history = memo.convert("t", app, to_openai, _no)
    assert history is not None and converted == ["hey", "found"]
    assert history.messages[1].content == "hey"
    other: list[str] = []  # another plugin's conversion converts for itself
    assert memo.convert("u", app, _recording(other), _no) is not None
    assert len(other) == len(app)


# -- the messages a plugin leaves out, asked of the new ones only ------------------------------


class _Note:
    """A framework message: kept unless it is a summary."""

    def __init__(self, summary: bool) -> None:
        self.summary = summary


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.booleans(), max_size=6), min_size=1, max_size=6),
    st.lists(st.integers(min_value=0, max_value=3), min_size=6, max_size=6),
)
def test_kept_messages_are_those_a_filter_of_the_whole_list_keeps(
    rounds: list[list[bool]], restarts: list[int]
) -> None:
    """Call after call of a continued history, a history started again (a new list with
    a summary at its head) and one cut short: the same messages as filtering every one."""
    memo = HistoryMemo()

    def keep(message: _Note) -> bool:
        return not message.summary

    app: list[_Note] = []
    for summaries, restart in zip(rounds, restarts, strict=False):
        if restart == 1:
            app = [_Note(True), *app[len(app) // 2 :]]  # summarized: a new list
        elif restart == 2:
            app = app[: len(app) // 2]  # the app dropped its newest messages
        app = [*app, *(_Note(s) for s in summaries)]
        kept = memo.kept("s", app, keep)
        assert kept == [m for m in app if keep(m)]
        assert all(a is b for a, b in zip(kept, [m for m in app if keep(m)], strict=True))


def test_only_the_new_messages_of_a_continued_history_are_checked() -> None:
    memo = HistoryMemo()
    asked: list[_Note] = []

    def keep(message: _Note) -> bool:
        asked.append(message)
        return not message.summary

    app = [_Note(False) for _ in range(50)]
    assert len(memo.kept("s", app, keep)) == 50
    asked.clear()
    app = [*app, _Note(True), _Note(False)]
    assert len(memo.kept("s", app, keep)) == 51
    assert asked == app[50:]
    # another session, and another filter, are checked whole
    asked.clear()
    memo.kept("t", app, keep)
    assert len(asked) == 52
    asked.clear()
    memo.kept("s", app, lambda m: keep(m))
    assert len(asked) == 52
    memo.forget()
    asked.clear()
    memo.kept("s", app, keep)
    assert len(asked) == 52
