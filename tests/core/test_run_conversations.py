"""RunConversations: the model calls of a scope nothing names, placed by what they continue;
marking: a patched function runs with a context variable set."""

from __future__ import annotations

from collections.abc import Hashable

from hypothesis import given
from hypothesis import strategies as st

from ce.core.integration import RunConversations, Scope


def key(message: tuple[str, str]) -> Hashable | None:
    return None if message[0] == "system" else message


RUN = Scope("run:r1", "run")


def test_a_named_session_is_one_conversation_whatever_its_calls_pass() -> None:
    runs = RunConversations()
    for source in ("explicit", "engine", "framework", "install"):
        named = Scope("alice", source)  # type: ignore[arg-type]
        assert runs.place(named, [("user", "a")], key, "c1") is named
        assert runs.place(named, [("user", "b")], key, "c2") is named


def test_an_agent_loop_stays_in_the_run_and_unrelated_calls_get_their_own() -> None:
    runs = RunConversations()
    first = [("system", "You help."), ("user", "Q?")]
    assert runs.place(RUN, first, key, "c1") is RUN
    loop = [*first, ("assistant", "[call lookup]"), ("tool", "result")]
    assert runs.place(RUN, loop, key, "c2") is RUN
    # a map call sharing only the system prompt is a conversation of its own
    mapped = runs.place(RUN, [("system", "You help."), ("user", "Summarize A")], key, "c3")
    assert mapped.session_id == "run:r1/c3" and mapped.parent_session_id == "run:r1"
    # its continuation goes with it; the run's own conversation stays the run's
    again = runs.place(
        RUN, [("user", "Summarize A"), ("assistant", "A."), ("user", "Shorter")], key, "c4"
    )
    assert again == mapped
    assert runs.place(RUN, [*loop, ("assistant", "Done."), ("user", "Q2?")], key, "c5") is RUN


def test_a_scope_that_is_anothers_gives_even_the_first_conversation_a_child() -> None:
    runs = RunConversations()
    nested = Scope("alice/call_x", "nested", "alice")
    first = runs.place(nested, [("user", "rewrite q")], key, "c1", first_in_scope=False)
    assert first.session_id == "alice/call_x/c1"
    continued = [("user", "rewrite q"), ("assistant", "q'"), ("user", "again")]
    assert runs.place(nested, continued, key, "c2", first_in_scope=False) == first
    other = runs.place(nested, [("user", "other")], key, "c3", first_in_scope=False)
    assert other.session_id == "alice/call_x/c3"


def test_a_call_repeating_a_conversation_or_skipping_its_reply_is_one_of_its_own() -> None:
    """A classifier's call, then the answer's on the same question: the second adds nothing
    to the first (or, its reply noted, does not pass it), so it is a conversation of its own;
    a tool loop's next call passes the reply and continues."""
    runs = RunConversations()
    question = [("system", "Classify."), ("user", "Q?")]
    assert runs.place(RUN, question, key, "c1") is RUN
    runs.replied("run:r1", ("assistant", "safe"))
    # passes the question and more, but not the reply: the answer after the classifier
    answer = runs.place(RUN, [("system", "Answer."), ("user", "Q?"), ("user", "Docs")], key, "c2")
    assert answer.session_id == "run:r1/c2"
    # the same question again, nothing after it: a second model asked the same
    assert runs.place(RUN, question, key, "c3").session_id == "run:r1/c3"
    loop = [*question, ("assistant", "safe"), ("tool", "result")]
    assert runs.place(RUN, loop, key, "c4") is RUN
    runs.replied("alice", ("assistant", "x"))  # a session no conversation is placed in


def test_a_call_of_system_messages_only_names_no_conversation() -> None:
    runs = RunConversations()
    assert runs.place(RUN, [("system", "x")], key, "c1") is RUN
    assert runs.place(RUN, [("user", "Q?")], key, "c2") is RUN  # the first with a turn


def test_the_newest_sessions_are_kept() -> None:
    runs = RunConversations(sessions=2)
    scopes = [Scope(f"run:{i}", "run") for i in range(3)]
    for scope in scopes:
        runs.place(scope, [("user", "a")], key, "c1")
    # run:0 was forgotten: its next call opens its conversation again
    assert runs.place(scopes[0], [("user", "b")], key, "c2") is scopes[0]
    assert runs.place(scopes[2], [("user", "b")], key, "c2").session_id == "run:2/c2"


@given(st.lists(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=5), max_size=12))
def test_every_call_continues_the_conversation_it_is_placed_in(calls: list[list[str]]) -> None:
    """Against a model of the rule: a conversation knows the messages of its first call and,
    of each call placed in it, those newer than the newest one it knew (read newest first, so
    a continuing call costs what it adds); a call goes to the first conversation whose
    newest message it passes is followed by something new, else to a new scope (the run
    itself for the run's first)."""
    runs = RunConversations()
    known: list[tuple[str, set[str]]] = []  # (session, the texts it knows), in order
    for n, texts in enumerate(calls):
        placed = runs.place(RUN, [("user", t) for t in texts], key, f"c{n}")
        for session, held in known:
            newer: list[str] = []
            newest = next((t for t in reversed(texts) if t in held), None)
            for text in reversed(texts):
                if text == newest:
                    break
                newer.append(text)
            if newest is None or not newer:
                continue
            held.update(newer)
            assert placed.session_id == session
            break
        else:
            assert placed.session_id == ("run:r1" if not known else f"run:r1/c{n}")
            known.append((placed.session_id, set(texts)))


def test_marking_sets_the_variable_for_the_call_only_sync_and_async() -> None:
    import asyncio
    from contextvars import ContextVar

    from ce.core.integration import PatchLedger, marking

    where: ContextVar[str | None] = ContextVar("where", default=None)

    class Memory:
        def get(self) -> str | None:
            return where.get()

        async def aput(self) -> str | None:
            return where.get()

    ledger = PatchLedger()
    ledger.wrap(Memory, "get", marking(where, "memory"))
    ledger.wrap(Memory, "aput", marking(where, "memory"))
    assert Memory().get() == "memory" and where.get() is None
    assert asyncio.run(Memory().aput()) == "memory" and where.get() is None
    ledger.undo()
    assert Memory().get() is None
