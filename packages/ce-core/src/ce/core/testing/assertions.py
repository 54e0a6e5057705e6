"""Assertions on assembled inputs, shared by the core tests and every plugin's tests."""

from __future__ import annotations

from collections.abc import Sequence

from ce.core.schema import MessagePart, Role

__all__ = ["assert_tool_pairs_intact"]


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
