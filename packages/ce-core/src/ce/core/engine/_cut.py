"""Where an app's cut of the oldest part of its history falls in the session (see
``ContextEngine.cut_history``): the newest stored message that is one of the messages the
app removed, moved back to a turn boundary when it would reach the current run or split a
tool call's exchange."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ce.core.engine._held import quoted_documents
from ce.core.engine._session import FRAMEWORK_MESSAGE_ID, SessionEntry, TailTooShort, message_key
from ce.core.pipeline import SessionIndex
from ce.core.schema import Message, Role

__all__ = ["CUT_SHORTENED", "Removed", "cut_point"]

CUT_SHORTENED = "history_cut_shortened"
"""The reason of the ``Degraded`` event of a cut that removes less than the app asked for."""


@dataclass(frozen=True)
class Removed:
    """The messages an app removed from its history, as the session would hold them: the
    framework ids it gives with the role and stored (redacted) text of each, for those the
    session stores under that id; the keys (:func:`message_key` of the stored text) of the
    others."""

    ids: dict[str, set[tuple[Role, str]]]
    keys: set[tuple[Any, ...]]

    @classmethod
    def of(
        cls,
        entry: SessionEntry,
        messages: Sequence[Message],
        stored_text: Callable[[str], str],
    ) -> Removed:
        """``messages`` (system messages aside: they are the app's instruction, no turn)
        matched as the engine matches a framework's pending messages against the session:
        by stored id when the session holds one under it with the same role and text, else by
        key (a user message also in its form with the retrieved documents it quotes replaced
        by pointers, the form the session stores it in)."""
        ids: dict[str, set[tuple[Role, str]]] = {}
        keys: set[tuple[Any, ...]] = set()
        for message in messages:
            if message.role is Role.SYSTEM:
                continue
            text = stored_text(message.content)
            framework_id = message.message_id
            if framework_id and entry.holds(framework_id, message.role, text):
                ids.setdefault(framework_id, set()).add((message.role, text))
                continue
            keys.add(message_key(message, text))
            if message.role is Role.USER:
                quoted = quoted_documents(entry, text)
                if quoted != text:
                    keys.add(message_key(message, quoted))
        return cls(ids, keys)

    def matches(self, stored: Message) -> bool:
        """Whether the session's ``stored`` message is one of them."""
        if stored.role is Role.SYSTEM:
            return False
        variant = (stored.role, stored.content)
        for framework_id in (stored.message_id, stored.meta.get(FRAMEWORK_MESSAGE_ID)):
            if isinstance(framework_id, str) and variant in self.ids.get(framework_id, ()):
                return True
        return bool(self.keys) and message_key(stored) in self.keys


def cut_point(
    entry: SessionEntry, index: SessionIndex, removed: Removed
) -> tuple[int | None, list[tuple[str, str]]]:
    """Where the cut ends: the position (from the session's first message) of the last
    message it removes, and the ``(reason, detail)`` of each way it removes less than asked;
    ``None`` when it removes nothing more than the session's current cut.

    The cut ends at the newest message the session stores after its current cut that is
    one of ``removed``. It never reaches the newest user message (nor what follows it: the
    current run, its tool calls in flight): it ends before it instead. It never ends inside a
    conversation block (a tool call's results after it, a ReAct step's Observation): it
    ends before that block. Work proportional to the messages after the current cut that the
    entry holds (none when it holds no message with the key of one of ``removed``).
    ``index`` is the entry's index. On an entry of the session's newest
    messages, raises :class:`TailTooShort` when none of them is one of ``removed`` (an older
    one may be) or its newest user message is older than they are."""
    messages = entry.doc.session.messages
    base = entry.unread.messages
    summary = entry.doc.session.summary
    done = summary.removed_by_app if summary is not None else 0
    found = None
    if removed.ids or any(key in entry.key_counts for key in removed.keys):
        for i in range(len(messages) - 1, max(done - base, 0) - 1, -1):
            if removed.matches(messages[i]):
                found = base + i
                break
    if found is None:
        if base > done:
            raise TailTooShort()
        return None, []
    notes: list[tuple[str, str]] = []
    cut = found
    newest = index.last_user_group
    if newest is None and base:
        raise TailTooShort()  # the newest user message is older than what the entry holds
    if newest is not None and cut >= index.groups[newest].position:
        cut = index.groups[newest].position - 1
        notes.append(
            (
                CUT_SHORTENED,
                f"the app removed messages up to {found}: the newest user message ({cut + 1})"
                " and what follows it (the current run) are kept; cut before it",
            )
        )
    following = cut + 1 - base
    while following < len(messages) and messages[following].role is Role.SYSTEM:
        following += 1
    if following < len(messages):
        group = index.group_of(messages[following].message_id or "")
        head = index.groups[group].position if group is not None else base + following
        if head <= cut:
            notes.append(
                (
                    CUT_SHORTENED,
                    f"the cut at message {cut} would split the exchange that starts at message"
                    f" {head} (a tool call and its results, a step and its Observation); cut"
                    " before it",
                )
            )
            cut = head - 1
    if cut < done:
        return None, notes
    return cut, notes
