"""The kit's reconciler: which of the app's messages each message of the engine's input
stands for (unchanged, its text rewritten, or new)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ce.core.formats import to_openai_messages
from ce.core.integration import (
    Reconciled,
    RewriteMemo,
    SentMessages,
    assembled_to_openai,
    openai_key,
    reconcile_openai,
)
from ce.core.schema import AssembledInput, MessagePart, Role, ToolCallRequest


def _call(args: str) -> dict[str, object]:
    return {"id": "c1", "type": "function", "function": {"name": "mail", "arguments": args}}


APP = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "mail bob@example.com"},
    {"role": "assistant", "content": "", "tool_calls": [_call('{"to": "bob@example.com"}')]},
    {"role": "tool", "tool_call_id": "c1", "content": "sent to bob@example.com"},
    {"role": "user", "content": "thanks"},
]


def test_unchanged_rewritten_and_new_messages() -> None:
    sent = [
        {"role": "system", "content": "Be brief.\n\n## Memory\nnote"},  # the engine's context
        {"role": "user", "content": "older history from the store"},
        {"role": "user", "content": "mail [REDACTED:email]"},
        {"role": "assistant", "content": "", "tool_calls": [_call('{"to": "[REDACTED:email]"}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "sent to [REDACTED:email]"},
        {"role": "user", "content": "thanks"},
    ]
    assert reconcile_openai(APP, sent) == [
        Reconciled(0, "Be brief.\n\n## Memory\nnote"),
        Reconciled(None),  # not the app's: built from the engine's dict
        Reconciled(None),
        # an assistant message whose calls the engine changed is never the app's object:
        # the redacted arguments must reach the model
        Reconciled(None),
        Reconciled(3, "sent to [REDACTED:email]"),
        Reconciled(4),
    ]


def test_an_opaque_message_never_goes_unchanged() -> None:
    assert reconcile_openai(APP[-1:], APP[-1:]) == [Reconciled(0)]
    assert reconcile_openai(APP[-1:], APP[-1:], opaque=[0]) == [Reconciled(0, "thanks")]


def test_a_rewritten_copy_keeps_the_apps_media_only_when_the_engine_kept_them() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    app = [
        {"role": "user", "content": [{"type": "text", "text": "old, mail bob@example.com"}, image]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "new, mail bob@example.com"}, image]},
    ]
    sent = [
        # an old message at a cheaper level: its image left out, its text says so
        {"role": "user", "content": "old, mail [REDACTED:email]\n[image omitted]"},
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "new, mail [REDACTED:email]"}, image],
        },
    ]
    assert reconcile_openai(app, sent) == [
        Reconciled(0, "old, mail [REDACTED:email]\n[image omitted]", media=False),
        Reconciled(1),
        Reconciled(2, "new, mail [REDACTED:email]", media=True),
    ]


def test_a_rewrite_is_copied_once_while_the_message_keeps_its_fields() -> None:
    @dataclass
    class Note:
        text: str
        meta: dict[str, str]

    @dataclass(slots=True)
    class Slotted:
        text: str

    memo = RewriteMemo(max_entries=2)
    made: list[str] = []

    def rewrite(message: Any, text: str) -> Any:
        def make() -> Any:
            made.append(text)
            return replace(message, text=text)

        return memo.copy(message, text, make)

    note = Note("raw", {"k": "v"})
    first = rewrite(note, "fenced")
    assert first == Note("fenced", {"k": "v"}) and rewrite(note, "fenced") is first
    assert rewrite(note, "other") is not first  # another rewrite, another copy
    note.meta = {"k": "new"}  # a field given a new value: copied again
    assert rewrite(note, "fenced") == Note("fenced", {"k": "new"})
    assert made == ["fenced", "other", "fenced"]
    for i in range(3):  # more than it holds: it forgets, and copies again
        rewrite(Note(str(i), {}), "x")
    assert rewrite(note, "fenced").meta == {"k": "new"} and made[-1] == "fenced"
    slotted = Slotted("raw")  # no instance dict: nothing to compare, copied every time
    assert rewrite(slotted, "fenced") is not rewrite(slotted, "fenced")


def test_the_sent_messages_carry_their_keys_and_are_the_callers_own() -> None:
    parts = [
        MessagePart(role=Role.SYSTEM, content="Be brief."),
        MessagePart(role=Role.USER, content="Look it up.", name="jo"),
        MessagePart(
            role=Role.ASSISTANT,
            content="",
            tool_calls=[ToolCallRequest(tool_call_id="c1", name="f", raw_arguments='{"q":1}')],
        ),
        MessagePart(role=Role.TOOL, content="found", tool_call_id="c1", name="f"),
    ]
    assembled = AssembledInput(parts=parts, total_tokens=10)
    first = assembled_to_openai(assembled)
    assert first == to_openai_messages(parts)
    assert isinstance(first, SentMessages)
    assert first.reconcile_keys == [openai_key(m) for m in first]
    first[1]["content"] = "changed by the caller"
    first[2]["tool_calls"][0]["function"]["name"] = "changed"
    again = assembled_to_openai(assembled)  # the same parts: from the memo, fresh dicts
    assert again == to_openai_messages(parts)
    assert again.reconcile_keys == [openai_key(m) for m in again]
    app = [dict(m) for m in again]
    assert reconcile_openai(app, again) == [Reconciled(i) for i in range(4)]
