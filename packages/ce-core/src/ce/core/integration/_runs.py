"""The conversations of one run that nothing names a session for.

A run scoped to itself (``run:<id>``, or a nested call's ``<outer>/<id>``) may make model calls
that continue one another (an agent's tool loop passes its whole history on every call) and
calls that have nothing to do with each other: the map calls of a map-reduce summary, the
steps of a chain that prompts for a draft and then for its critique, the steps of a custom
workflow, a router's classification of a question and then the answer to it. Without the
engine each of those gets its own messages only; sharing the run's session would hand each one
the exchanges of the calls before it. So within such a scope, :class:`RunConversations` places
a call in the conversation it continues: it passes a user, assistant or tool message one of
that conversation's calls passed and something after it, and the newest such message is the
conversation's latest reply where the plugin noted one (:meth:`RunConversations.replied`): a
call that repeats a conversation's messages without its reply (a second model asked the same
question, the answer after a classifier) does not continue it. A call that continues none goes,
if the scope already holds a conversation, to a child scope of its own (``<scope>/<call id>``).
Named sessions (``ce_session_id``, ``engine.session()``, the framework's conversation, the
install default) are conversations by name: a call in one always continues it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from ce.core.integration._sessions import Scope

__all__ = ["RunConversations"]


class _Conversation:
    """One conversation of a scope: the scope it is recorded in, the keys of the messages its
    calls passed and of the replies noted, and the latest reply's key."""

    __slots__ = ("keys", "placed", "reply")

    def __init__(self, placed: Scope, keys: set[Hashable]) -> None:
        self.placed = placed
        self.keys = keys
        self.reply: Hashable | None = None

    def continued_by(self, messages: Sequence[Any], key: Callable[[Any], Hashable | None]) -> bool:
        """Whether a call passing ``messages`` continues this conversation (its newest message
        this conversation knows is followed by something new and is the latest reply, when
        one was noted); then the new keys are the conversation's."""
        new: list[Hashable] = []
        for message in reversed(messages):
            k = key(message)
            if k is None:
                continue
            if k in self.keys:
                if not new or (self.reply is not None and k != self.reply):
                    return False
                self.keys.update(new)
                return True
            new.append(k)
        return False


class RunConversations:
    """Per unnamed scope (the newest ``sessions`` of them), its conversations: the scope each
    one is recorded in and the keys of the messages its calls passed. Thread-safe."""

    def __init__(self, sessions: int = 1024) -> None:
        self._held: OrderedDict[str, list[_Conversation]] = OrderedDict()
        self._placed: dict[str, _Conversation] = {}  # by the session each is recorded in
        self._sessions = sessions
        self._lock = threading.Lock()

    def place(
        self,
        scope: Scope,
        messages: Sequence[Any],
        key: Callable[[Any], Hashable | None],
        call_id: str,
        *,
        first_in_scope: bool = True,
    ) -> Scope:
        """The scope of a model call passing ``messages`` (oldest first), resolved to
        ``scope``: ``scope`` itself when a session names it, when it holds no conversation
        yet, or when the call continues its first one; else the conversation of the scope
        the call continues, else a new child ``scope.child(call_id)``. ``key`` reads a
        message as the conversation holds it (``None``: not a turn, e.g. a system message).
        ``first_in_scope=False``: the scope is another's (an agent's run that these calls
        are not part of), so even the first conversation placed gets a child scope.
        Looks at the messages newest first and stops at the first it knows: a call that
        continues a conversation costs what it adds to it."""
        if scope.named or not messages:
            return scope
        with self._lock:
            conversations = self._held.pop(scope.session_id, None)
            if conversations is None:
                conversations = []
            self._held[scope.session_id] = conversations  # the latest used last
            while len(self._held) > self._sessions:
                _, dropped = self._held.popitem(last=False)
                for conversation in dropped:
                    self._placed.pop(conversation.placed.session_id, None)
            for conversation in conversations:
                if conversation.continued_by(messages, key):
                    return conversation.placed
            keys = {k for k in map(key, messages) if k is not None}
            placed = scope.child(call_id) if conversations or not first_in_scope else scope
            if keys:
                conversation = _Conversation(placed, keys)
                conversations.append(conversation)
                self._placed.setdefault(placed.session_id, conversation)
            return placed

    def replied(self, session_id: str, key: Hashable | None) -> None:
        """Note the reply (its ``key``) of a call placed in ``session_id``: the conversation
        recorded there is continued by the calls that pass it (a tool loop's next call), not
        by one that repeats its messages without it. A session no conversation of this
        object is recorded in (a named one) is left alone."""
        if key is None:
            return
        with self._lock:
            conversation = self._placed.get(session_id)
            if conversation is not None:
                conversation.keys.add(key)
                conversation.reply = key

    def clear(self) -> None:
        """Forget every conversation."""
        with self._lock:
            self._held.clear()
            self._placed.clear()
