"""CrewAI's values as neutral ones: an LLM call's messages and tools, the tool calls a native
reply asks for, a task as a task record, an agent's role as an author."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ce.core.schema import Author, AuthorKind, Role, Task, TaskStatus
from ce.crewai._scopes import Run

__all__ = [
    "agent_author",
    "authors_of",
    "pending_messages",
    "reply_tool_calls",
    "task_record",
    "tool_schemas",
]


def pending_messages(messages: Any) -> list[dict[str, Any]]:
    """An LLM call's ``messages`` (a string or OpenAI-style dicts) as OpenAI-style dicts."""
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [dict(m) for m in messages]


def tool_schemas(tools: Any) -> list[dict[str, Any]] | None:
    """The OpenAI function schemas among an LLM call's ``tools``."""
    if not tools:
        return None
    schemas = [t for t in tools if isinstance(t, Mapping) and "function" in t]
    return [dict(t) for t in schemas] or None


def agent_author(role: str | None) -> Author | None:
    """The author of what the agent with ``role`` writes."""
    return Author(kind=AuthorKind.AGENT, id=role) if role else None


def authors_of(messages: list[dict[str, Any]], role: str | None) -> list[Author | None] | None:
    """Who wrote each pending message: the calling agent its assistant messages (tool
    requests of its own loop), nobody else. A message the session holds already keeps the
    author it was stored with."""
    author = agent_author(role)
    if author is None:
        return None
    return [author if m.get("role") == Role.ASSISTANT.value else None for m in messages]


def reply_tool_calls(reply: Any) -> list[tuple[str, str, Any]]:
    """``(call id, tool name, arguments)`` of each tool call a native reply asks for (the
    arguments as the reply has them: JSON text or a dict)."""
    if not isinstance(reply, list):
        return []
    calls: list[tuple[str, str, Any]] = []
    for call in reply:
        if isinstance(call, Mapping):
            call_id, function = call.get("id"), call.get("function")
        else:
            call_id, function = getattr(call, "id", None), getattr(call, "function", None)
        if isinstance(function, Mapping):
            name, args = function.get("name"), function.get("arguments")
        else:
            name, args = getattr(function, "name", None), getattr(function, "arguments", None)
        if isinstance(call_id, str) and isinstance(name, str):
            calls.append((call_id, name, args))
    return calls


def task_record(
    run: Run, task: Any, status: TaskStatus, description: str | None = None, **extra: Any
) -> Task:
    """A crew task of ``run`` as the session's task record (its dependencies included);
    named by its name, else by ``description`` (default: the task's own)."""
    depends = list(run.depends.get(str(task.id), []))
    if description is None:
        description = str(getattr(task, "description", ""))
    name = getattr(task, "name", None) or description[:80]
    return Task(
        task_id=run.task_id(str(task.id)),
        name=name,
        status=status,
        depends_on=depends,
        **extra,
    )
