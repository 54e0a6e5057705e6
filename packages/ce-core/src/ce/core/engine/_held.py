"""What a session already holds, looked up for what a framework hands over: the same history
continued, a ReAct scratchpad or an app's earlier question already stored in another form,
retrieved documents a prompt quotes whole, and the evidences an answer cites."""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from itertools import islice
from typing import Any

from ce.core.config import RuntimeConfig
from ce.core.engine._session import FRAMEWORK_CALL_IDS, SessionEntry, message_key
from ce.core.pipeline import (
    QUOTED_MIN_CHARS,
    canonical_step,
    document_pointer,
    quotes_document,
    transcript_parts,
)
from ce.core.pipeline._levels import POINTER_PREFIX
from ce.core.schema import EvidenceType, Message, Ref, Role

__all__ = [
    "answers_waiting_call",
    "asked_within",
    "cited",
    "current_turn",
    "holds_transcript",
    "joined_instruction",
    "quoted_documents",
    "quoting_evidence",
    "renders",
    "unchanged_prefix",
]


def unchanged_prefix(
    entry: SessionEntry, pending: Sequence[Message], cfg: RuntimeConfig
) -> tuple[int, dict[tuple[Any, ...], int], tuple[int, ...]]:
    """How many leading ``pending`` messages are the very objects the session's previous call
    passed before its last one (under the same config), with the counts of their keys and
    the positions of their system messages: they were matched then and stay matched (a
    session only gains messages), so only what follows them is matched again. ``(0, {},
    ())`` when the history is not that one continued."""
    memo = entry.pending_memo
    if memo is None:
        return 0, {}, ()
    before, seen, systems, config = memo
    count = len(before)
    if config is not cfg or count == 0 or len(pending) <= count:
        return 0, {}, ()
    if not all(map(operator.is_, pending[:count], before)):
        return 0, {}, ()
    return count, dict(seen), systems


def joined_instruction(pending: Sequence[Message], systems: Sequence[int]) -> Message | None:
    """The instruction of a call whose system messages are ``pending[i]`` for ``i`` in
    ``systems`` (in order): the one system message, or the texts of several joined with a
    blank line, a text repeated once (a framework's own prompt and the app's system message
    among its messages are both what the model is told). None when there is none."""
    if not systems:
        return None
    last = pending[systems[-1]]
    if len(systems) == 1:
        return last
    texts = list(dict.fromkeys(t for i in systems if (t := pending[i].content).strip()))
    return last.model_copy(update={"content": "\n\n".join(texts)})


def holds_transcript(entry: SessionEntry, text: str) -> bool:
    """Whether ``text`` is a whole ReAct scratchpad (see :func:`transcript_parts`) whose
    steps, observations and answer the session holds already, one message each."""
    parts = transcript_parts(text)
    if parts is None:
        return False
    held = {
        (m.role.value, canonical_step(m.content).strip())
        for m in entry.doc.session.messages
        if m.role in (Role.USER, Role.ASSISTANT)
    }
    return all((role, canonical_step(part)) in held for role, part in parts)


def current_turn(entry: SessionEntry) -> tuple[tuple[Any, ...] | None, set[str]]:
    """The key of the session's newest user message, and the framework's ids of the tool
    calls the session holds after it (the calls of the turn that message opened)."""
    calls: set[str] = set()
    for message in reversed(entry.doc.session.messages):
        if message.role is Role.USER:
            return message_key(message), calls
        if message.tool_calls:
            renamed = message.meta.get(FRAMEWORK_CALL_IDS) or {}
            calls.update(renamed.get(c.tool_call_id, c.tool_call_id) for c in message.tool_calls)
    return None, calls


def answers_waiting_call(entry: SessionEntry, framework_id: str) -> bool:
    """Whether a tool result under ``framework_id`` would answer a call of the session that
    has no result yet (the id itself, or the id a reused framework id was stored under)."""
    waiting = {c.tool_call_id for c in entry.state.pending_tool_calls}
    return framework_id in waiting or entry.call_aliases.get(framework_id) in waiting


_QUOTED_RECENT = 64  # the newest retrieved documents a framework's prompt may quote


def quoting_evidence(entry: SessionEntry, text: str) -> str:
    """``text`` (a system instruction in its stored form) with every retrieved document the
    session holds as ``rag_doc`` evidence that it quotes whole replaced by a reference to that
    evidence. A framework that inlines retrieved context into its prompt (a chat engine's
    context template) would otherwise send it twice: raw in the instruction and fenced as
    evidence. The engine sends it once, fenced with its evidence id and budgeted as evidence."""
    if len(text) < QUOTED_MIN_CHARS:
        return text
    evidences = entry.doc.evidences
    # the same instruction on every call of a session: look once per instruction and evidence
    state = (len(evidences), next(reversed(evidences), None))
    memo = entry.quoted_memo
    if memo is not None and memo[0] == text and memo[1] == state:
        return memo[2]
    quoted = quoted_documents(entry, text)
    entry.quoted_memo = (text, state, quoted)
    return quoted


def quoted_documents(entry: SessionEntry, text: str) -> str:
    """``text`` with every one of the session's newest retrieved documents that it quotes
    whole replaced by :func:`~ce.core.pipeline.document_pointer` (``text`` itself when it
    quotes none). Documents of the same text (one text from two sources) point to the oldest
    of them: retrieving the other copy later must not rewrite the prompts stored before. A
    document that came with turns the app took back is not pointed to (it is not sent)."""
    oldest: dict[str, str] = {}  # text -> the oldest evidence id of it, newest text first
    summary = entry.doc.session.summary
    withdrawn = summary.withdraws_evidence if summary is not None and summary.withdrawn else None
    for evidence in islice(reversed(entry.doc.evidences.values()), _QUOTED_RECENT):
        if evidence.type is EvidenceType.RAG_DOC and not (withdrawn and withdrawn(evidence)):
            content = evidence.content.strip()
            if quotes_document(text, content):
                oldest[content] = evidence.evidence_id
    for content, evidence_id in oldest.items():
        text = text.replace(content, document_pointer(evidence_id))
    return text


WITHIN_MIN_CHARS = 16  # a shorter question could be part of any prompt
_WITHIN_RECENT = 256  # the newest messages an app's earlier question is looked for in


def renders(prompt: Message, question: str, *, answered: bool = False) -> bool:
    """Whether the stored user message ``prompt``, at the place of an app's bare
    ``question`` in its history, is the prompt the app rendered around it: it holds the
    question and more. A question shorter than ``WITHIN_MIN_CHARS`` only in a prompt that
    quoted retrieved documents (a RAG prompt around a follow-up such as "Why?"), or, when
    ``answered`` (the prompt is the one the session's answer that the app passes after
    ``question`` answered), as words of its own: elsewhere it could be part of another
    message by chance."""
    question = question.strip()
    content = prompt.content
    if not question or len(content) <= len(question) or question not in content:
        return False
    if len(question) >= WITHIN_MIN_CHARS or POINTER_PREFIX in content:
        return True
    return answered and re.search(rf"(?<!\w){re.escape(question)}(?!\w)", content) is not None


def asked_within(entry: SessionEntry, text: str, held: int) -> bool:
    """Whether the user message ``text`` (an earlier turn of an app's history, which the
    session does not hold as such) is part of a longer user message among the session's
    first ``held`` messages (those it held before the call): the prompt the app rendered
    around its question (retrieved documents, instructions) and sent on that turn, while its
    history keeps the bare question."""
    question = text.strip()
    if len(question) < WITHIN_MIN_CHARS:
        return False
    messages = entry.doc.session.messages
    for i in range(held - 1, max(held - _WITHIN_RECENT, 0) - 1, -1):
        m = messages[i]
        if m.role is Role.USER and len(m.content) > len(question) and question in m.content:
            return True
    return False


_ID_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:~-]{7,}")


def cited(entry: SessionEntry, text: str) -> list[Ref]:
    """The session's evidences an answer cites by id (the id each evidence fence shows), in
    the order it first cites them."""
    evidences = entry.doc.evidences
    if not evidences:
        return []
    tokens = (t.rstrip("._:~-") for t in _ID_TOKEN.findall(text))  # "... see <id>."
    cited = dict.fromkeys(t for t in tokens if t in evidences)
    return [Ref(evidence_id=evidence_id) for evidence_id in cited]
