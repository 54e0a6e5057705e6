"""The engine's input back onto the app's own messages: one mechanism for every plugin.

The engine speaks OpenAI-style dicts of text (``ce.core.formats`` reads only the text parts of
a message). A plugin that rebuilt its framework's messages from the assembled dicts would lose
what the engine never saw: image, file and audio parts, message ids, provider fields. So a
plugin converts the app's messages to dicts once (``pending``, one per app message), hands them
to the engine, and asks :func:`reconcile_openai` which app message each assembled one is:

- the app's message unchanged (the plugin sends the app's very object);
- the app's system, user or tool message whose text alone the engine rewrote (redaction, a
  fenced tool result, the system prompt with the engine's context): the plugin sends a copy of
  the app's message with that text, its media kept when the engine kept them (an old message
  at a cheaper Level of Detail goes without its images, its text saying so);
- anything else (the engine's summary, history the app did not pass, and every assistant
  message whose tool calls the engine changed, e.g. redacted arguments): the plugin builds a
  new message from the assembled dict, so nothing the engine removed comes back.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ce.core.integration._history import History
    from ce.core.schema import Author

__all__ = ["Reconciled", "SentMessages", "index_keys", "openai_key", "reconcile_openai"]

_TEXT_TYPES = frozenset({"text", "input_text", "output_text"})

Key = tuple[Hashable, ...]

_INDEXED_ROLES = ("system", "user", "tool")


@dataclass(frozen=True, slots=True)
class Reconciled:
    """Where one message of the engine's input comes from: ``source`` is the index of the
    app message it stands for (``None``: build it from the assembled dict); ``text`` is
    ``None`` when that app message goes unchanged, else the text its copy takes; ``media``
    is false when the copy must leave out the app's images, files and audio (the app's user
    message or tool result has media parts, the engine's has none)."""

    source: int | None
    text: str | None = None
    media: bool = True


_AS_IS: dict[int, Reconciled] = {}
_AS_IS_MAX = 1 << 16  # app positions whose unchanged Reconciled is shared


def _as_is(source: int) -> Reconciled:
    """The :class:`Reconciled` of the app message at ``source`` going unchanged: one shared
    instance per position (it is immutable), made once, not on every call."""
    held = _AS_IS.get(source)
    if held is None:
        held = Reconciled(source)
        if source < _AS_IS_MAX:
            held = _AS_IS.setdefault(source, held)
    return held


def _text(content: Any) -> str:
    """A content's text as the engine reads it: a string, or the text parts of a list joined
    with newlines; anything else counts as no text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        part if isinstance(part, str) else str(part.get("text", ""))
        for part in content
        if isinstance(part, str) or (isinstance(part, Mapping) and part.get("type") in _TEXT_TYPES)
    )


def _has_media(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(part, Mapping) and part.get("type") not in _TEXT_TYPES for part in content
    )


def _arguments(function: Mapping[str, Any]) -> str:
    raw = function.get("arguments")
    if raw is not None and not isinstance(raw, str):
        raw = json.dumps(raw, ensure_ascii=False, separators=(",", ":"))
    return raw if raw and raw.strip() else "{}"


def openai_key(message: Mapping[str, Any]) -> Key:
    """What the engine sees of an OpenAI message: role, text, tool call id, the name of a
    user or assistant message, tool calls. Two messages with equal keys are one message to
    the engine (the reading of ``ce.core.formats.from_openai_messages``, without building
    its parts)."""
    role = message.get("role")
    role = "system" if role == "developer" else role
    name = message.get("name") if role in ("user", "assistant") else None
    requests = message.get("tool_calls")
    calls = (
        tuple(
            (call.get("id"), function.get("name"), _arguments(function))
            for call in requests
            if isinstance(call, Mapping) and isinstance(function := call.get("function"), Mapping)
        )
        if requests
        else ()
    )
    call_id = message.get("tool_call_id") if role == "tool" else None
    content = message.get("content")
    return (role, content if isinstance(content, str) else _text(content), call_id, name, calls)


class SentMessages(list[dict[str, Any]]):
    """The OpenAI messages the model receives for an assembled input
    (:func:`~ce.core.integration.assembled_to_openai`), with each one's
    :func:`openai_key` in ``reconcile_keys``, so that :func:`reconcile_openai` need not
    read them again, and who wrote each in ``authors`` (the part's
    :attr:`~ce.core.schema.MessagePart.author`). The messages are the caller's own (fresh
    dicts on every call)."""

    __slots__ = ("authors", "reconcile_keys")

    def __init__(
        self,
        messages: list[dict[str, Any]],
        keys: list[Key],
        authors: list[Author | None],
    ) -> None:
        super().__init__(messages)
        self.reconcile_keys = keys
        self.authors = authors


def _sent_keys(sent: Sequence[Mapping[str, Any]]) -> list[Key]:
    if isinstance(sent, SentMessages) and len(sent.reconcile_keys) == len(sent):
        return sent.reconcile_keys
    return [openai_key(m) for m in sent]


def index_keys(
    keys: Sequence[Key],
    start: int = 0,
    positions: dict[Key, list[int]] | None = None,
    by_role: dict[str, list[int]] | None = None,
    results: dict[Hashable, list[int]] | None = None,
) -> tuple[dict[Key, list[int]], dict[str, list[int]], dict[Hashable, list[int]]]:
    """The indexes of :class:`History` for ``keys`` at positions ``start``, ``start + 1``,
    ...: new dicts, extending the given ones (never changed: a touched list is copied). A
    named message is found by its key without the name too: the engine sends a message it
    stored before the app named it (a multi-agent graph names an agent's reply after the
    model call that made it) without the name, and it is still that app message."""
    positions = dict(positions or {})
    by_role = dict(by_role or {})
    results = dict(results or {})
    touched: set[int] = set()
    for offset, key in enumerate(keys):
        at = start + offset
        held = positions.get(key)
        positions[key] = [at] if held is None else [*held, at]
        if key[3] is not None:
            unnamed = (key[0], key[1], key[2], None, key[4])
            held = positions.get(unnamed)
            positions[unnamed] = [at] if held is None else [*held, at]
        role = key[0]
        if isinstance(role, str) and role in _INDEXED_ROLES:
            held_role = by_role.get(role)
            if held_role is None or id(held_role) not in touched:
                held_role = [] if held_role is None else list(held_role)
                touched.add(id(held_role))
                by_role[role] = held_role
            held_role.append(at)
        if role == "tool":
            held = results.get(key[2])
            results[key[2]] = [at] if held is None else [*held, at]
    return positions, by_role, results


def _unchanged(positions: Mapping[Key, list[int]], sent_keys: Sequence[Key]) -> list[int | None]:
    """For each sent message, the index of the app message it is unchanged from, or None:
    matched from the end, keeping the order (the newest messages are the app's pending ones;
    older ones may come from the store). ``positions``: each app key's indexes, ascending."""
    match: list[int | None] = [None] * len(sent_keys)
    bound: int | None = None  # every app index is below it (None: no bound yet)
    for i in range(len(sent_keys) - 1, -1, -1):
        candidates = positions.get(sent_keys[i])
        if not candidates:
            continue
        below = len(candidates) if bound is None else bisect_left(candidates, bound)
        if below:
            bound = match[i] = candidates[below - 1]
    return match


def _within(positions: Sequence[int], low: int, high: int) -> tuple[int, int]:
    """The slice of the ascending ``positions`` that lies in ``[low, high)``."""
    return bisect_left(positions, low), bisect_left(positions, high)


def _rewritten(
    app_keys: Sequence[Key],
    sent_keys: Sequence[Key],
    match: Sequence[int | None],
    by_role: Mapping[str, list[int]],
    results: Mapping[Hashable, list[int]],
) -> dict[int, int]:
    """Sent messages whose text alone the engine rewrote, to the app message each stands
    for: between the same unchanged neighbours, a tool result with the same tool call id, and
    the system and user messages in order when both sides have as many of them there (after
    the last unchanged message, the newest user message at least: the app's pending
    question). Assistant messages are never paired (their tool calls go as the engine sent
    them). ``by_role`` and ``results``: the app's system / user / tool positions and each
    tool call id's result positions, ascending (a gap costs what the engine sent in it)."""
    pairs: dict[int, int] = {}
    anchors = [(i, j) for i, j in enumerate(match) if j is not None]
    low_i = low_j = -1
    for high_i, high_j in [*anchors, (len(sent_keys), len(app_keys))]:
        sent_gap = range(low_i + 1, high_i)
        if sent_gap and high_j > low_j + 1:
            for role in ("system", "user"):
                sent_role = [i for i in sent_gap if sent_keys[i][0] == role]
                if not sent_role:
                    continue
                app_role = by_role.get(role, [])
                first, stop = _within(app_role, low_j + 1, high_j)
                if len(sent_role) == stop - first:
                    pairs.update(zip(sent_role, app_role[first:stop], strict=True))
                elif stop > first and role == "user" and high_i == len(sent_keys):
                    pairs[sent_role[-1]] = app_role[stop - 1]
            used: set[Hashable] = set()
            for i in sent_gap:
                call_id = sent_keys[i][2]
                if sent_keys[i][0] != "tool" or call_id in used:
                    continue
                held = results.get(call_id)
                if held:
                    first, stop = _within(held, low_j + 1, high_j)
                    if stop > first:
                        used.add(call_id)
                        pairs[i] = held[stop - 1]
        low_i, low_j = high_i, high_j
    return pairs


def reconcile_openai(
    pending: Sequence[Mapping[str, Any]],
    sent: Sequence[Mapping[str, Any]],
    opaque: Collection[int] = (),
    *,
    history: History | None = None,
) -> list[Reconciled]:
    """For each message of the engine's input ``sent``, which of the app's messages (their
    OpenAI dicts ``pending``, in the app's order) it stands for (see the module docstring).
    ``opaque`` names app messages that must never go unchanged (they carry content the
    engine and its redactor could not read): they are rewritten copies or built anew.
    ``history``: the :class:`~ce.core.integration.History` ``pending`` comes from (its keys,
    opaque messages and indexes are used, ``opaque`` is not): the work then grows with
    ``sent``, not with the app's history."""
    if history is None:
        app_keys = [openai_key(m) for m in pending]
        for hidden in opaque:
            role, _, call_id, name, calls = app_keys[hidden]
            app_keys[hidden] = (role, object(), call_id, name, calls)
        positions, by_role, results = index_keys(app_keys)
    else:
        app_keys, positions = history.keys, history.positions
        by_role, results = history.by_role, history.results
    sent_keys = _sent_keys(sent)
    match = _unchanged(positions, sent_keys)
    rewritten = _rewritten(app_keys, sent_keys, match, by_role, results)
    out: list[Reconciled] = []
    shared = _AS_IS.get
    for i, j in enumerate(match):
        if j is not None:
            out.append(shared(j) or _as_is(j))
        elif i in rewritten:
            text, source = sent_keys[i][1], rewritten[i]
            # the engine keeps the media of user messages and tool results (not a system
            # message's): when it sent one without them, it left them out on purpose
            kept = sent_keys[i][0] == "system" or _has_media(sent[i].get("content"))
            media = kept or not _has_media(pending[source].get("content"))
            out.append(Reconciled(source, text if isinstance(text, str) else "", media))
        else:
            out.append(Reconciled(None))
    return out
