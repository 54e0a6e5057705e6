"""Text that another message already holds: what a message of the session quotes of another.

Two cases are sent once instead of twice:

* a tool's result that holds the documents its call retrieved (:func:`quoting`): the
  documents render fenced, in the result's place or within its text;
* an earlier answer that the newest user message quotes in full (:func:`quoted_answers`):
  an app that hands a previous answer back to a model inside its new prompt (a crew's task
  given the earlier tasks' outputs as context, "translate this: ...") would otherwise send
  that answer twice, once in the history and once in the prompt, and once more in every
  earlier prompt that quoted it too (each task of a sequential crew gets all the outputs
  before it). The history's copies then go as pointers to the prompt: the answer as
  :data:`QUOTED_ANSWER`, each copy inside an earlier prompt as :data:`QUOTED_IN_PROMPT`, for
  as long as that prompt is the newest user message (the one every assembled input keeps
  whole);
* two evidences with the same text (two retrievers, sources or indexes returning one passage):
  one of them goes whole, each other one kept with it as its own fenced block (its id and
  source) holding :data:`SAME_TEXT_POINTER` instead of the text (see
  :mod:`~ce.core.pipeline._same_text`).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence

from ce.core.pipeline._levels import fence_evidence
from ce.core.schema import Evidence, Message, Role

__all__ = [
    "QUOTED_ANSWER",
    "QUOTED_IN_PROMPT",
    "QUOTED_REASON",
    "SAME_TEXT_POINTER",
    "SAME_TEXT_REASON",
    "Quotes",
    "fenced_in_place",
    "quoted_answers",
    "quoting",
    "without_quoted",
]

QUOTED_ANSWER = "[This answer is quoted in full in the latest user message.]"

QUOTED_IN_PROMPT = "[an earlier answer, quoted in full in the latest user message]"

QUOTED_REASON = "; what the latest user message quotes in full goes there only (a pointer here)"
"""Added to the prune decision of a block sent with such a pointer, so a report says why it
costs so little."""

SAME_TEXT_POINTER = "[same text as evidence {evidence_id}]"
"""The body of an evidence block whose text another kept evidence holds whole."""

SAME_TEXT_REASON = "the same text as evidence {evidence_id}, kept whole: a pointer here"
"""The prune decision's reason for such a block (what it costs: its fence and one line)."""

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


def fenced_in_place(text: str, documents: list[Evidence]) -> str:
    """``text`` with each of the ``documents`` it quotes fenced where it stands."""
    for document in documents:
        content = document.content.strip()
        if content and content in text:
            text = text.replace(content, fence_evidence(document, content))
    return text


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


class Quotes:
    """What the newest user message quotes of the blocks before it: ``answers``, the
    positions of the answers it quotes whole, and ``prompts``, the positions of the earlier
    user messages that quote some of those answers too, with the answers' texts."""

    __slots__ = ("answers", "prompts")

    def __init__(self, answers: dict[int, str], prompts: dict[int, tuple[str, ...]]) -> None:
        self.answers = answers
        self.prompts = prompts

    @property
    def blocks(self) -> frozenset[int]:
        """Every position sent with a pointer."""
        return frozenset(self.answers) | frozenset(self.prompts)


def quoted_answers(prompt: Message, heads: Sequence[Message], first: int) -> Quotes:
    """What ``prompt`` quotes of ``heads`` (positions: ``first`` + offset): the assistant
    messages whose whole text it quotes (plain-text answers of at least
    :data:`MIN_QUOTED_CHARS` characters, without levels of detail of the app's own), and the
    user messages among ``heads`` that quote some of those answers as well."""
    text = prompt.content
    answers: dict[int, str] = {}
    if len(text) >= MIN_QUOTED_CHARS:
        for offset, head in enumerate(heads):
            if head.role is not Role.ASSISTANT or head.lod is not None:
                continue
            answer = head.content.strip()
            if len(answer) >= MIN_QUOTED_CHARS and answer in text:
                answers[first + offset] = answer
    prompts: dict[int, tuple[str, ...]] = {}
    if answers:
        for offset, head in enumerate(heads):
            if head.role is Role.USER and head.lod is None:
                held = tuple(a for a in answers.values() if a in head.content)
                if held:
                    prompts[first + offset] = held
    return Quotes(answers, prompts)


def without_quoted(text: str, answers: Sequence[str]) -> str:
    """``text`` (an earlier prompt) with each of ``answers`` replaced by
    :data:`QUOTED_IN_PROMPT`."""
    for answer in answers:
        text = text.replace(answer, QUOTED_IN_PROMPT)
    return text
