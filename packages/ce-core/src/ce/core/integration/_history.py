"""A framework's history converted once per session: what a call costs grows with what is new.

A framework passes its whole history again on every model call. Converting every message to an
OpenAI dict, keying it and building its neutral :class:`~ce.core.schema.Message` on every call
makes a call's cost grow with the conversation. :class:`HistoryMemo` keeps, per session, the
previous call's framework messages with those conversions: when a call's messages begin with
the very objects the previous call passed (the history continued), only the messages after
them are converted. A few of those may be new objects that convert to the same dicts (a
prompt template's system message, built on every call; a memory's own copy of the question):
only they are converted again, to compare. :func:`~ce.core.integration.reconcile_openai`
then finds the app messages through the history's indexes, in time that grows with what the
engine sends, not with the history.

A message object changed in place after a call passed it is not read again: the engine holds
what it read then. When such a message would reach the model as the app's own object, the
plugin checks it first (:meth:`History.unchanged`) and sends the engine's version instead:
:meth:`History.reads_as_converted` tells without converting it again whether none of its
fields (nor of its parts) was given another value since; only when one was does
:meth:`History.matches` compare a new conversion.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ce.core.integration._convert import openai_to_messages
from ce.core.integration._reconcile import Key, index_keys, openai_key
from ce.core.schema import Author, Message, Role

__all__ = ["History", "HistoryMemo"]


@dataclass(frozen=True, slots=True, eq=False)
class History:
    """One call's framework messages (``app``) with, for each, its OpenAI dict
    (``pending``, read-only), its key (:func:`~ce.core.integration.openai_key`; an opaque
    message's key matches nothing) and its neutral message (``messages``, read-only), and
    the indexes reconciling needs: each key's positions, the positions of system, user and
    tool messages, and of each tool call id's results (all ascending). ``repeats``: the
    positions of the messages that read as the one before them (equal dicts as the engine
    reads them, opaque content aside), for frameworks that hand a message on twice.
    ``fingerprints``: what each message read as when it was converted (its
    ``fingerprint_of``, by default :func:`fingerprint`)."""

    app: list[Any]
    pending: list[dict[str, Any]]
    keys: list[Key]
    messages: list[Message]
    opaque: list[int]
    positions: dict[Key, list[int]]
    by_role: dict[str, list[int]]
    results: dict[Hashable, list[int]]
    repeats: list[int]
    fingerprints: list[Fingerprint] = field(default_factory=list)
    fingerprint_of: Callable[[Any], Fingerprint] = field(default=lambda message: ())
    extends: bool = False
    """Whether this call's messages are the previous call's (of the memo's session) with
    more after them: the app's conversation went on, it did not go back."""

    def matches(self, position: int, pending: Mapping[str, Any]) -> bool:
        """Whether ``pending``, the app message at ``position`` converted now, is still what
        the history holds for it."""
        return openai_key(pending) == self.keys[position]

    def unchanged(
        self,
        position: int,
        message: Any,
        convert: Callable[[Any], Mapping[str, Any] | None],
    ) -> bool:
        """Whether the app's ``message`` at ``position`` still reads as the history holds it,
        before it goes to the model as the app's own object (the app may have changed it in
        place since it was converted): it reads as converted (:meth:`reads_as_converted`),
        or ``convert`` (the plugin's conversion of one message; None: it cannot go as it is)
        makes what the history holds (:meth:`matches`)."""
        if self.reads_as_converted(position, message):
            return True
        converted = convert(message)
        return converted is not None and self.matches(position, converted)

    def reads_as_converted(self, position: int, message: Any) -> bool:
        """Whether ``message`` is the app message at ``position`` and each of its fields,
        and of its parts, holds the very value (or an equal one) it held when it was
        converted (see :func:`fingerprint`), so this never converts it again. False says
        nothing: convert it and ask :meth:`matches`."""
        if position >= len(self.fingerprints) or self.app[position] is not message:
            return False
        try:
            return bool(self.fingerprint_of(message) == self.fingerprints[position])
        except Exception:  # a value that cannot be compared (e.g. an array): converted again
            return False


Fingerprint = tuple[Any, ...]
_ATOMS = (str, int, float, bool, bytes, type(None))


_SLOTS: dict[type, tuple[str, ...]] = {}


def _slots(cls: type) -> tuple[str, ...]:
    names = _SLOTS.get(cls)
    if names is None:
        found: list[str] = []
        for klass in cls.__mro__:
            declared = getattr(klass, "__slots__", ())
            for name in (declared,) if isinstance(declared, str) else declared:
                if name not in ("__dict__", "__weakref__"):
                    found.append(name)
        names = _SLOTS[cls] = tuple(found)
    return names


def _values(obj: Any) -> tuple[Any, ...]:
    """The values of an object's fields (its ``__dict__`` or slots; a mapping's values)."""
    if isinstance(obj, Mapping):
        return tuple(obj.values())
    held = getattr(obj, "__dict__", None)
    if held is not None:
        return tuple(held.values())
    return tuple(getattr(obj, name, None) for name in _slots(type(obj)))


def fingerprint(message: Any) -> Fingerprint:
    """What a framework message reads as, cheaply: the values of its fields and, for each
    list among them (content parts, blocks, items), its length and the values of its parts'
    fields, compared item by item (by identity first). A field given another value, a part
    added, removed or given another value all show; a value changed inside a nested dict or
    list of a part does not."""
    fields = getattr(message, "__dict__", None)
    refs = tuple(fields.values()) if fields is not None else _values(message)
    out: list[Any] | None = None
    for value in refs:
        if isinstance(value, (list, tuple)):
            if out is None:
                out = list(refs)
            out.append(len(value))
            for item in value:
                if isinstance(item, _ATOMS):
                    continue
                fields = getattr(item, "__dict__", None)
                out.extend(fields.values() if fields is not None else _values(item))
    return refs if out is None else tuple(out)


_RECREATED_MAX = 8
"""How many of the previous call's messages a call may pass as new objects that must be
converted to compare (a prompt template's system message, built on every call) and still
continue that call's history."""


def _recreated(
    previous: History,
    app: Sequence[Any],
    to_openai: Callable[[Sequence[Any]], list[dict[str, Any]]],
    opaque: Callable[[Any], bool],
    author: Callable[[Any], Author | None] | None,
) -> History | None:
    """``previous`` with the app's new objects in its place where the call passes, instead
    of the previous call's very objects, new ones that read as the same messages: of the
    same class with fields of equal values (their fingerprints; an app that loads its history
    from a database builds every message anew on every call), or a few that convert to the
    same dicts (a prompt template builds its system message anew on every call, an agent
    built anew its system message, a memory its copy of the question); readable as before,
    and written by the same author. None when more differ, or one reads otherwise."""
    fingerprint_of = previous.fingerprint_of
    hidden = set(previous.opaque)
    changed: list[int] = []
    prints: dict[int, Fingerprint] = {}
    for i, (now, then) in enumerate(zip(app, previous.app, strict=False)):
        if now is then:
            continue
        if type(now) is type(then) and i < len(previous.fingerprints):
            read = fingerprint_of(now)
            if _same_print(read, previous.fingerprints[i]) and (
                author is None or author(now) == previous.messages[i].author
            ):
                prints[i] = read
                continue
        changed.append(i)
        if len(changed) > _RECREATED_MAX:
            return None
    objects = [app[i] for i in changed]
    dicts = to_openai(objects) if objects else []
    if len(dicts) != len(objects):
        return None
    for i, message, converted in zip(changed, objects, dicts, strict=True):
        if (
            converted != previous.pending[i]
            or opaque(message) != (i in hidden)
            or (author is not None and author(message) != previous.messages[i].author)
        ):
            return None
        prints[i] = fingerprint_of(message)
    if any(opaque(app[i]) != (i in hidden) for i in prints if i not in changed):
        return None
    count = len(previous.app)
    return dataclasses.replace(
        previous,
        app=list(app[:count]),
        fingerprints=[prints.get(i, f) for i, f in enumerate(previous.fingerprints)],
    )


_AUTHORED_MAX = 8192
# A converted message (shared, read-only: see ``openai_to_messages``) as written by an agent,
# by the message object and the author: a framework that builds its agents anew converts the
# same history on every call, and each message is copied for its author once.
_authored: dict[tuple[int, str, str], tuple[Message, Message]] = {}
_authored_lock = threading.Lock()


def _written_by(message: Message, writer: Author) -> Message:
    key = (id(message), writer.kind.value, writer.id)
    held = _authored.get(key)
    if held is not None and held[0] is message:
        return held[1]
    copy = message.model_copy(update={"author": writer})
    with _authored_lock:
        if len(_authored) >= _AUTHORED_MAX:
            _authored.clear()
        _authored[key] = (message, copy)
    return copy


def _opaque_key(key: Key) -> Key:
    role, _, call_id, name, calls = key
    return (role, object(), call_id, name, calls)


def _call_name(call_id: str | None, *histories: Sequence[Message]) -> str | None:
    """The name of tool call ``call_id``, searched newest first."""
    for messages in histories:
        for message in reversed(messages):
            for call in message.tool_calls or ():
                if call.tool_call_id == call_id:
                    return call.name
    return None


_ITEMS_MAX = 8192
# What each app message converted to (its OpenAI dict, key, whether it is opaque, its neutral
# message), by the message object, for the conversion functions it went through: a history
# built anew for messages met before (a session whose history was evicted, a plugin
# installed again, a list trimmed at its head so it no longer continues the previous call's)
# converts only the messages it has not met. Checked against the message's fingerprint.
_Item = tuple[Any, Fingerprint, tuple[Callable[..., Any], ...], dict[str, Any], Key, bool, Message]
_items: dict[int, _Item] = {}
_items_lock = threading.Lock()


def _same_print(a: Fingerprint, b: Fingerprint) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a value that cannot be compared (e.g. an array): converted again
        return False


def _converted_items(
    new: list[Any],
    prints: list[Fingerprint],
    to_openai: Callable[[Sequence[Any]], list[dict[str, Any]]],
    opaque: Callable[[Any], bool],
) -> tuple[list[dict[str, Any]], list[Key], list[bool], list[Message]] | None:
    """For each of ``new`` (with its fingerprint in ``prints``): its OpenAI dict (read-only),
    key, whether it is opaque and its neutral message; converted with ``to_openai`` and
    :func:`openai_to_messages` unless met before unchanged (see ``_items``). None when
    ``to_openai`` does not give one dict per message. A tool result without a name of its
    own takes it from the call it answers, in its history: it is not kept for another."""
    functions = (to_openai, opaque)
    held = [_items.get(id(message)) for message in new]
    missing = [
        i
        for i, (item, message) in enumerate(zip(held, new, strict=True))
        if item is None
        or item[0] is not message
        or item[2] != functions
        or not _same_print(item[1], prints[i])
    ]
    fresh = to_openai([new[i] for i in missing]) if missing else []
    if len(fresh) != len(missing):
        return None
    fresh_messages = openai_to_messages(fresh) if fresh else []
    pending: list[dict[str, Any]] = []
    keys: list[Key] = []
    opaques: list[bool] = []
    messages: list[Message] = []
    made = dict(zip(missing, zip(fresh, fresh_messages, strict=True), strict=True))
    kept: list[tuple[int, _Item]] = []
    for i, message in enumerate(new):
        item = held[i]
        if i in made:
            entry, neutral = made[i]
            key = openai_key(entry)
            hidden = opaque(message)
            if neutral.role is not Role.TOOL or entry.get("name") is not None:
                item = (message, prints[i], functions, entry, key, hidden, neutral)
                kept.append((id(message), item))
        else:
            assert item is not None
            _, _, _, entry, key, hidden, neutral = item
        pending.append(entry)
        keys.append(key)
        opaques.append(hidden)
        messages.append(neutral)
    if kept:
        with _items_lock:
            if len(_items) + len(kept) > _ITEMS_MAX:
                _items.clear()
            _items.update(kept)
    return pending, keys, opaques, messages


class HistoryMemo:
    """Per session, the :class:`History` of the previous call (the newest ``max_sessions``
    sessions). Thread-safe: a history is never changed, a call builds a new one."""

    def __init__(self, max_sessions: int = 256) -> None:
        self._held: OrderedDict[str, History] = OrderedDict()
        self._kept: OrderedDict[str, tuple[list[Any], list[Any], Callable[[Any], bool]]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()
        self._max = max_sessions

    def forget(self) -> None:
        """Drop every history held."""
        with self._lock:
            self._held.clear()
            self._kept.clear()

    def kept(self, session_id: str, app: Sequence[Any], keep: Callable[[Any], bool]) -> list[Any]:
        """The messages of ``app`` that ``keep`` keeps (a summary the framework put in place
        of turns the session holds, say, left out), in order, with ``keep`` asked only of the
        messages after the previous call's when ``app`` begins with that call's very
        objects (a continued history): a check that reads every message of a long history
        again on every call would cost more than the rest of the call. ``keep`` must depend
        on the message alone; a session asked with another ``keep`` is checked whole. The
        list is new, and read-only for the caller."""
        with self._lock:
            held = self._kept.get(session_id)
        if (
            held is not None
            and held[2] is keep
            and len(app) >= len(held[0])
            and all(map(operator.is_, app, held[0]))
        ):
            before, kept, _ = held
            out = kept + [m for m in itertools.islice(app, len(before), None) if keep(m)]
        else:
            out = [m for m in app if keep(m)]
        with self._lock:
            self._kept[session_id] = (list(app), out, keep)
            self._kept.move_to_end(session_id)
            while len(self._kept) > self._max:
                self._kept.popitem(last=False)
        return out

    def convert(
        self,
        session_id: str,
        app: Sequence[Any],
        to_openai: Callable[[Sequence[Any]], list[dict[str, Any]]],
        opaque: Callable[[Any], bool],
        author: Callable[[Any], Author | None] | None = None,
        fingerprint_of: Callable[[Any], Fingerprint] | None = None,
    ) -> History | None:
        """The history of a call passing ``app`` in ``session_id``: the messages after the
        previous call's (when ``app`` begins with them) converted with ``to_openai`` (one
        dict per message), ``opaque`` telling which carry content the engine cannot read,
        ``author`` who wrote each (multi-agent frameworks; the neutral message is written by
        it). ``session_id`` may be any key that fixes what these functions return for a
        message (e.g. a session as one agent sees it). ``fingerprint_of``: what a message
        reads as (see :meth:`History.reads_as_converted`; default :func:`fingerprint`), a
        cheaper one where a plugin knows what its conversion reads. A message object met
        before that reads the same is not converted again (see ``_items``) when the same
        ``to_openai`` and ``opaque`` functions come with it: pass the same ones on every call.
        A previous call's messages passed as new objects continue its history when each reads
        the same (same class, equal fingerprint, same author). None when ``to_openai`` does
        not give one dict per message. Raises what ``to_openai`` raises and
        :class:`ValueError` for a malformed message."""
        fingerprint_of = fingerprint_of or fingerprint
        with self._lock:
            previous = self._held.get(session_id)
        count = len(previous.app) if previous is not None else 0
        if (
            previous is None
            or previous.fingerprint_of is not fingerprint_of
            or len(app) < count
            or (
                not all(map(operator.is_, app[:count], previous.app))
                and (previous := _recreated(previous, app, to_openai, opaque, author)) is None
            )
        ):
            previous, count = None, 0
        new = list(app[count:])
        prints = [fingerprint_of(message) for message in new]
        converted = _converted_items(new, prints, to_openai, opaque)
        if converted is None:
            return None
        pending, keys, opaques, messages = converted
        before = openai_key(previous.pending[-1]) if previous and previous.pending else None
        repeats = [
            count + offset
            for offset, key in enumerate(keys)
            if key == (keys[offset - 1] if offset else before)
        ]
        hidden = [offset for offset, flag in enumerate(opaques) if flag]
        for offset in hidden:
            keys[offset] = _opaque_key(keys[offset])
        earlier = previous.messages if previous is not None else []
        for offset, message in enumerate(messages):
            update: dict[str, Any] = {}
            if message.role is Role.TOOL and message.name is None:
                name = _call_name(message.tool_call_id, messages[:offset], earlier)
                if name is not None:
                    update["name"] = name
            if author is not None:
                writer = author(new[offset])
                if writer is not None and message.author != writer:
                    if not update:
                        messages[offset] = _written_by(message, writer)
                        continue
                    update["author"] = writer
            if update:
                messages[offset] = message.model_copy(update=update)
        if previous is None:
            history = History(
                list(app),
                pending,
                keys,
                messages,
                hidden,
                *index_keys(keys),
                repeats,
                prints,
                fingerprint_of,
            )
        else:
            history = History(
                [*previous.app, *new],
                [*previous.pending, *pending],
                [*previous.keys, *keys],
                [*previous.messages, *messages],
                [*previous.opaque, *(count + offset for offset in hidden)],
                *index_keys(keys, count, previous.positions, previous.by_role, previous.results),
                [*previous.repeats, *repeats],
                [*previous.fingerprints, *prints],
                fingerprint_of,
                extends=bool(new),
            )
        with self._lock:
            self._held[session_id] = history
            self._held.move_to_end(session_id)
            while len(self._held) > self._max:
                self._held.popitem(last=False)
        return history
