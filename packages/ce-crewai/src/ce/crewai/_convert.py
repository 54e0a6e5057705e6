"""CrewAI's values as neutral ones: an LLM call's messages and tools, the tool calls a native
reply asks for, a task as a task record, an agent's role as an author; and the texts CrewAI
writes into its prompts (the context it hands a task, the demand for a final answer)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from ce.core.schema import Author, AuthorKind, Role, Task, TaskStatus
from ce.crewai._scopes import Run

__all__ = [
    "DIRECT_CALL",
    "agent_author",
    "authors_of",
    "caller",
    "context_divider",
    "context_marker",
    "final_answer",
    "forced_final_answer",
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


DIRECT_CALL = "LLM.call"
"""The name a model call of no agent writes under (a direct ``LLM.call`` / ``acall``, such as
a Flow's step): its replies are stored with it as author, so an agent that shares the session
reads them as another's turn (``[LLM.call wrote:]``), never as its own."""


def caller(role: str | None) -> str:
    """The name a model call by the agent with ``role`` writes under: the role, else (a call
    of no agent) :data:`DIRECT_CALL`."""
    return role or DIRECT_CALL


def agent_author(name: str) -> Author:
    """The author of what a call writing under ``name`` (see :func:`caller`) writes."""
    return Author(kind=AuthorKind.AGENT, id=name)


def authors_of(messages: list[dict[str, Any]], name: str) -> list[Author | None]:
    """Who wrote each pending message: the caller writing under ``name`` its assistant
    messages (tool requests of its own loop, a direct call's earlier replies), nobody else.
    A message the session holds already keeps the author it was stored with."""
    author = agent_author(name)
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


@functools.cache
def context_marker() -> str:
    """What CrewAI writes between a task's prompt and the context it hands the task (the
    outputs of earlier tasks, a guardrail's rejected attempt): the line ``This is the context
    you're working with:`` after a blank line, in its own prompts."""
    from crewai.utilities.i18n import I18N_DEFAULT

    template = str(I18N_DEFAULT.slice("task_with_context"))
    return template.split("{task}", 1)[-1].split("{context}", 1)[0]


@functools.cache
def context_divider() -> str:
    """What CrewAI writes between two task outputs of one context."""
    from crewai.utilities.formatter import DIVIDERS

    return str(DIVIDERS)


@functools.cache
def _force_final_answer() -> str:
    from crewai.utilities.i18n import I18N_DEFAULT

    return str(I18N_DEFAULT.errors("force_final_answer")).strip()


def forced_final_answer(messages: Any) -> bool:
    """Whether an LLM call's ``messages`` end with CrewAI's demand for a final answer, which
    an agent's executor makes once it reached ``max_iter`` (a user message, or the agent's
    last text followed by it in an assistant message, depending on CrewAI's version)."""
    if isinstance(messages, str) or not isinstance(messages, list) or not messages:
        return False
    last = messages[-1]
    content = last.get("content") if isinstance(last, Mapping) else None
    return isinstance(content, str) and content.rstrip().endswith(_force_final_answer())


def final_answer(text: str) -> str:
    """An agent's reply as CrewAI hands it on as the task's output: the answer after
    ``Final Answer:`` of a reply in its Thought/Action text format (read by CrewAI's own
    parser), else the text; stripped."""
    from crewai.agents.constants import FINAL_ANSWER_ACTION
    from crewai.agents.parser import AgentFinish, parse

    if FINAL_ANSWER_ACTION in text:
        try:
            parsed = parse(text)
        except Exception:  # not a reply CrewAI could read: its text as it stands
            return text.strip()
        if isinstance(parsed, AgentFinish):
            return str(parsed.output).strip()
    return text.strip()
