"""Earlier turns an app renders as text into its prompt, sent once.

A common Haystack chat app keeps its conversation as ``ChatMessage`` objects (a list, a chat
message store) and renders it into the user message of each run with a ``ChatPromptBuilder``
template (``{% for m in memories %}{{ m.text }}{% endfor %}``). In a named session the engine
sends the session's earlier turns as messages, so the rendered copy would reach the model a
second time. So the tracer notes, for each prompt builder of a run (a component taking a
``template``), the conversations it was given as template variables
(:func:`rendered_conversations`: a list of messages holding a user message and an assistant
one), and a model call of the run replaces, in its system and user messages, the rendered run
of the turns the session holds (:func:`without_rendered_turns`) with :data:`TURNS_POINTER`.
The model then gets those turns once, as the session's messages (trimmed to the budget like
any history, instead of growing inside the newest user message, which is always kept), and
the session stores the prompt without the copy.

The session holds a turn when it holds its reply, with the user message just before it in
the conversation (the question it answered): a reply the plugin recorded in that session
(:class:`HeldReplies`), or one the engine finds among the session's newest records
(``ContextEngine.replies_held``: recorded by another worker process, or before this one
started). Turns the session does not hold stay in the prompt: those of a run that names no
session (a session new with the run), a conversation older than the session.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ce.haystack._convert import prompt_text, with_prompt_text

__all__ = [
    "TURNS_POINTER",
    "HeldReplies",
    "Rendered",
    "held_turns",
    "rendered_conversations",
    "without_rendered_turns",
]

Rendered = tuple[tuple[str, str], ...]
"""A conversation a prompt builder rendered as text: the ``(role, text)`` of its user and
assistant messages with text, oldest first."""
TURNS_POINTER = "[earlier turns: the conversation above]"
"""What a prompt holds where it rendered earlier turns the session sends as messages."""
_GAP = 80  # the most text between two rendered messages (a role label, a separator)
_LABEL = re.compile(r"[^a-z]")


def rendered_conversations(inputs: Mapping[str, Any]) -> list[Rendered]:
    """The conversations a prompt builder's ``inputs`` give its template to render (its
    variables, ``template_variables`` included; never the ``template`` itself, whose
    messages are the prompt's own): each list of ``ChatMessage`` holding a user message and
    an assistant one, as ``(role, text)`` of its user and assistant messages with text."""
    values = [v for k, v in inputs.items() if k not in ("template", "template_variables")]
    variables = inputs.get("template_variables")
    if isinstance(variables, Mapping):
        values.extend(variables.values())
    found = []
    for value in values:
        turns = _conversation(value)
        if turns is not None:
            found.append(turns)
    return found


def _conversation(value: Any) -> Rendered | None:
    from haystack.dataclasses import ChatMessage

    if not isinstance(value, (list, tuple)) or not value:
        return None
    if not all(isinstance(m, ChatMessage) for m in value):
        return None
    turns = tuple(
        (str(m.role.value), m.text)
        for m in value
        if m.text and (m.is_from("user") or m.is_from("assistant"))
    )
    roles = {role for role, _ in turns}
    return turns if {"user", "assistant"} <= roles else None


class HeldReplies:
    """What the plugin knows of the replies sessions hold, per session: digests of the newest
    ``held`` reply texts of each of the newest ``sessions`` sessions, each noted as held (the
    plugin recorded it, or the engine found it stored) or not (the engine did not find it:
    a turn of a conversation older than the session). Thread-safe."""

    def __init__(self, sessions: int = 1024, held: int = 256) -> None:
        self._sessions: OrderedDict[str, OrderedDict[bytes, bool]] = OrderedDict()
        self._max_sessions = sessions
        self._held = held
        self._lock = threading.Lock()

    def add(self, session_id: str, text: str) -> None:
        """Note that ``session_id`` holds a reply with ``text``."""
        self._note(session_id, [text], {text})

    def settle(self, session_id: str, asked: Sequence[str], held: Iterable[str]) -> None:
        """Note which of the texts ``asked`` of the engine ``session_id`` holds (``held``)
        and which not, so neither is asked again."""
        self._note(session_id, asked, set(held))

    def _note(self, session_id: str, texts: Sequence[str], held: set[str]) -> None:
        with self._lock:
            replies = self._sessions.pop(session_id, None) or OrderedDict()
            self._sessions[session_id] = replies
            for text in texts:
                if text:
                    digest = _digest(text)
                    replies[digest] = text in held or replies.get(digest, False)
                    replies.move_to_end(digest)
            while len(replies) > self._held:
                replies.popitem(last=False)
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)

    def unknown(self, session_id: str, conversations: Sequence[Rendered]) -> list[str]:
        """The reply texts of ``conversations`` the plugin knows nothing of for
        ``session_id`` (recorded by another process, or before this one started, or no reply
        of the session), to ask the engine about."""
        with self._lock:
            noted = frozenset(self._sessions.get(session_id) or ())
        texts = (text for c in conversations for role, text in c if role == "assistant")
        return [t for t in dict.fromkeys(texts) if t and _digest(t) not in noted]

    def holder(self, session_id: str) -> Callable[[str], bool]:
        """Whether ``session_id`` holds a reply with a given text (as it holds them now)."""
        with self._lock:
            digests = frozenset(
                d for d, held in (self._sessions.get(session_id) or {}).items() if held
            )
        return lambda text: _digest(text) in digests


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def without_rendered_turns(
    dicts: Sequence[Mapping[str, Any]],
    conversations: Sequence[Rendered],
    holds: Callable[[str], bool],
) -> list[Mapping[str, Any]]:
    """``dicts`` (OpenAI-style) with, in the text of each system or user message (its
    pictures and files kept), the rendered run of the turns of ``conversations`` the session
    holds (``holds``: whether it holds a reply of that text; see :func:`held_turns`) replaced
    by :data:`TURNS_POINTER`. A message with nothing to replace is the same dict; one
    rendering the turns in another form (a filter that reformats them) is left as it is."""
    blocks = [b for b in (held_turns(c, holds) for c in conversations) if b]
    if not blocks:
        return list(dicts)
    out: list[Mapping[str, Any]] = []
    for entry in dicts:
        content = prompt_text(entry)
        if content is not None:
            text = content
            for block in blocks:
                text = _replaced(text, block)
            if text != content:
                entry = with_prompt_text(entry, text)
        out.append(entry)
    return out


def held_turns(conversation: Rendered, holds: Callable[[str], bool]) -> Rendered:
    """The newest run of ``conversation``'s turns the session holds: from its newest reply
    the session holds back to the oldest of the held replies before it without a gap, each
    with the user message just before it (the question it answered). Empty when the session
    holds none, or the run holds no user message (a list of replies quoted into a prompt
    is no conversation)."""
    end = next(
        (i for i in range(len(conversation) - 1, -1, -1) if _held(conversation[i], holds)),
        None,
    )
    if end is None:
        return ()
    start = end
    while start > 0:
        before = conversation[start - 1]
        if _held(before, holds) or (before[0] == "user" and conversation[start][0] == "assistant"):
            start -= 1
        else:
            break
    turns = conversation[start : end + 1]
    return turns if any(role == "user" for role, _ in turns) else ()


def _held(turn: tuple[str, str], holds: Callable[[str], bool]) -> bool:
    return turn[0] == "assistant" and holds(turn[1])


def _replaced(text: str, turns: Rendered) -> str:
    """``text`` with the rendering of ``turns`` (their texts in order, the newest last, at
    most :data:`_GAP` characters apart) replaced by :data:`TURNS_POINTER`, from the first
    one's line when only its role label comes before it there; ``text`` itself when it does
    not render them so."""
    end = len(text)
    start = stop = -1
    for _, turn in reversed(turns):
        found = text.rfind(turn, 0, end)
        if found < 0 or (stop >= 0 and end - (found + len(turn)) > _GAP):
            return text
        if stop < 0:
            stop = found + len(turn)
        start = end = found
    line = text.rfind("\n", 0, start) + 1
    if _LABEL.sub("", text[line:start].lower()) in ("", turns[0][0]):
        start = line
    return text[:start] + TURNS_POINTER + text[stop:]
