"""Request bodies read the way the graph tests compare them with plain LangGraph's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ce.core.testing.assertions import unfenced

Read = tuple[str, str | None, str]  # role, name, text (a tool call: its id)


def message_text(message: dict[str, Any]) -> str:
    """A request message's text (its text parts joined), a fenced tool result unfenced."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(unfenced(content or ""))


def read(request: dict[str, Any]) -> list[Read]:
    """A request's messages as (role, name, text), a tool call as its ids, a result unfenced."""
    out: list[Read] = []
    for m in request["messages"]:
        calls = [c["id"] for c in m.get("tool_calls") or ()]
        out.append((m["role"], m.get("name"), " ".join(calls) if calls else message_text(m)))
    return out


def reads(requests: Sequence[dict[str, Any]]) -> list[list[Read]]:
    """Every request read, in an order that does not depend on which call came first."""
    return sorted(map(read, requests), key=repr)
