"""Text tool use (ReAct): an assistant step that names an ``Action`` with its ``Action Input``,
and the ``Observation`` (a user message) that answers it.

Frameworks that drive tools through text re-render a step on every call of the loop, not
always as the model wrote it (LlamaIndex prints the parsed input as a Python dict: ``{'q':
'x'}`` for the model's ``{"q": "x"}``): :func:`canonical_step` reads both as one step. The
index keeps a step and its observation in one block, so pruning never separates them and an
observation never counts as the user's question."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

__all__ = ["canonical_step", "is_observation", "is_react_step", "transcript_parts"]

_ACTION = re.compile(r"^[ \t]*Action[ \t]*:[ \t]*\S", re.M)
_INPUT = re.compile(r"^([ \t]*Action Input[ \t]*:[ \t]*)(.*)\Z", re.M | re.S)
_OBSERVATION = re.compile(r"\A\s*Observation[ \t]*:")
_TRANSCRIPT_CUT = re.compile(r"^(?=[ \t]*(?:Thought|Observation)[ \t]*:)", re.M)
_MAX_INPUT_CHARS = 20_000  # a longer input is compared as written


def is_react_step(text: str) -> bool:
    """Whether an assistant text names a tool ``Action`` (a ReAct step, not an answer)."""
    return "Action" in text and _ACTION.search(text) is not None


def is_observation(text: str) -> bool:
    """Whether a message text is a ReAct ``Observation:`` (a tool's output sent as text)."""
    return _OBSERVATION.match(text) is not None


def _parsed(raw: str) -> Any:
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return None


def canonical_step(text: str) -> str:
    """``text`` with its ``Action Input`` written as canonical JSON (sorted keys) when it
    reads as JSON or as a Python literal; ``text`` itself otherwise."""
    if "Action Input" not in text:
        return text
    match = _INPUT.search(text)
    if match is None:
        return text
    raw = match[2].strip()
    if not raw or len(raw) > _MAX_INPUT_CHARS or raw[0] not in "{[":
        return text
    value = _parsed(raw)
    if not isinstance(value, (dict, list)):
        return text
    try:
        canonical = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):  # a literal JSON cannot write (a set, bytes)
        return text
    return text[: match.start(2)] + canonical


def transcript_parts(text: str) -> list[tuple[str, str]] | None:
    """A whole ReAct scratchpad written as one message (steps, their ``Observation:`` lines,
    maybe the final ``Answer``: how some framework versions keep a finished run in memory)
    cut into its messages, ``("assistant", step)`` and ``("user", observation)`` in order;
    ``None`` when ``text`` is not such a transcript (no step answered by an observation)."""
    if "Observation" not in text or not is_react_step(text):
        return None
    pieces = [p.strip() for p in _TRANSCRIPT_CUT.split(text) if p.strip()]
    parts = [("user" if is_observation(p) else "assistant", p) for p in pieces]
    if len(parts) < 2 or parts[0][0] != "assistant" or all(r != "user" for r, _ in parts):
        return None
    return parts
