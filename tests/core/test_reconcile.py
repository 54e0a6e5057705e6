"""The kit's reconciler: which of the app's messages each message of the engine's input
stands for (unchanged, its text rewritten, or new)."""

from __future__ import annotations

from ce.core.integration import Reconciled, reconcile_openai


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
