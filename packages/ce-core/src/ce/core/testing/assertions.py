"""Assertions on assembled inputs, shared by the core tests and every plugin's tests."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from ce.core.integration import HistoryMemo
from ce.core.schema import MessagePart, Role

__all__ = ["assert_restored_history_continues", "assert_tool_pairs_intact", "fenced", "unfenced"]

_FENCE = re.compile(
    r"\A<evidence(?P<attrs>(?: [a-z_]+=\"[^\"]*\")*)>\n(?P<body>.*)\n</evidence>\Z", re.S
)
_ATTR = re.compile(r'([a-z_]+)="([^"]*)"')


def fenced(content: Any) -> dict[str, str] | None:
    """The attributes of the ``<evidence>`` fence ``content`` is wrapped in whole (a tool
    result as the engine renders it: ``id``, ``tool``, ``status``), ``None`` when it is
    not fenced."""
    match = _FENCE.match(content) if isinstance(content, str) else None
    return dict(_ATTR.findall(match["attrs"])) if match else None


def unfenced(content: Any) -> Any:
    """The text inside the ``<evidence>`` fence ``content`` is wrapped in whole (the tool's
    own output), else ``content`` as it is."""
    match = _FENCE.match(content) if isinstance(content, str) else None
    return match["body"] if match else content


def assert_tool_pairs_intact(parts: Sequence[MessagePart]) -> None:
    """Fail unless every tool result directly follows the assistant message that made its
    call, and every call in the input has exactly one result, in call order."""
    i = 0
    while i < len(parts):
        part = parts[i]
        assert part.role is not Role.TOOL, f"tool result without its call at position {i}"
        if part.role is Role.ASSISTANT and part.tool_calls:
            ids = [c.tool_call_id for c in part.tool_calls]
            following = parts[i + 1 : i + 1 + len(ids)]
            assert [p.tool_call_id for p in following] == ids, (
                f"calls {ids} at position {i} are answered by {[p.tool_call_id for p in following]}"
            )
            assert all(p.role is Role.TOOL for p in following)
            i += len(ids)
        i += 1


def assert_restored_history_continues(
    app: Sequence[Any],
    restored: Sequence[Any],
    to_openai: Callable[[Sequence[Any]], list[dict[str, Any]]],
    opaque: Callable[[Any], bool],
    fingerprint_of: Callable[[Any], tuple[Any, ...]] | None = None,
) -> None:
    """A plugin's history of ``app``, then of ``restored`` (``app``'s messages as the
    framework restores them from their stored form, new objects, followed by new messages):
    only the new messages are converted again, and the history's neutral messages are those
    of converting ``restored`` afresh."""
    converted: list[int] = []

    def counting(messages: Sequence[Any]) -> list[dict[str, Any]]:
        converted.append(len(messages))
        return to_openai(messages)

    memo = HistoryMemo()
    assert memo.convert("s", app, counting, opaque, fingerprint_of=fingerprint_of) is not None
    assert all(a is not b for a, b in zip(app, restored, strict=False)), "not new objects"
    history = memo.convert("s", restored, counting, opaque, fingerprint_of=fingerprint_of)
    assert history is not None
    assert converted == [len(app), len(restored) - len(app)], converted
    fresh = HistoryMemo().convert("t", restored, to_openai, opaque, fingerprint_of=fingerprint_of)
    assert fresh is not None
    assert [m.model_dump() for m in history.messages] == [m.model_dump() for m in fresh.messages]
    assert all(a is b for a, b in zip(history.app, restored, strict=True))
