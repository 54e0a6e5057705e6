"""Text that another message already holds: what a message of the session quotes of another.

Two cases are sent once instead of twice:

* a tool's result that holds the documents its call retrieved (:func:`quoting`): the
  documents render fenced, in the result's place or within its text;
* an earlier answer that the newest user message quotes in full (:func:`quoted_answers`):
  an app that hands a previous answer back to a model inside its new prompt (a crew's task
  given an earlier task's output as context, "translate this: ...") would otherwise send that
  answer twice, once in the history and once in the prompt. The history's copy then renders
  as :data:`QUOTED_ANSWER`, a pointer to the prompt, for as long as that prompt is the newest
  user message (the one every assembled input keeps whole).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence

from ce.core.schema import Evidence, Message, Role

__all__ = ["QUOTED_ANSWER", "QUOTED_REASON", "quoted_answers", "quoting"]

QUOTED_ANSWER = "[This answer is quoted in full in the latest user message.]"

QUOTED_REASON = "; sent as a pointer: the latest user message quotes it in full"
"""Added to the prune decision of such an answer, so a report says why it costs so little."""

MIN_QUOTED_CHARS = 80
"""Answers shorter than this stay as they are: a short answer ("Yes.", a number) found in a
prompt says little about being quoted, and its pointer would save next to nothing."""

QUOTE_LOOKBACK = 32
"""How many conversation blocks before the newest user message are looked at: quoted answers
are the recent ones, and a turn's cost stays independent of the history's length."""


def quoting(text: str, documents: list[Evidence]) -> bool | None:
    """How a tool's result ``text`` holds the ``documents`` its call retrieved. ``False``: it
    is those documents alone, or data holding them (a retriever's or a search function's
    output: they render in its place, fenced). ``True``: it quotes some of them within text
    of its own. ``None``: it quotes none (an answer made from them: the tool's own text
    renders, then the documents)."""
    rest, quoted = text, False
    for document in documents:
        content = document.content.strip()
        if content and content in rest:
            rest, quoted = rest.replace(content, ""), True
    if not quoted:
        return None
    if _structured(text):
        return False  # search results as data (JSON, a list of them): the documents are it
    return any(c.isalnum() for c in rest)


def _structured(text: str) -> bool:
    """Whether ``text`` is data (JSON, or a Python literal such as a list of JSON strings)."""
    try:
        json.loads(text)
        return True
    except ValueError:
        pass
    try:
        ast.literal_eval(text.strip())
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def quoted_answers(prompt: Message, heads: Sequence[Message], first: int) -> list[int]:
    """The positions (``first`` + offset in ``heads``) of the assistant messages among
    ``heads`` whose whole text ``prompt`` quotes: plain-text answers of at least
    :data:`MIN_QUOTED_CHARS` characters, without levels of detail of the app's own."""
    text = prompt.content
    if len(text) < MIN_QUOTED_CHARS:
        return []
    out: list[int] = []
    for offset, head in enumerate(heads):
        if head.role is not Role.ASSISTANT or head.lod is not None:
            continue
        answer = head.content.strip()
        if len(answer) >= MIN_QUOTED_CHARS and answer in text:
            out.append(first + offset)
    return out
