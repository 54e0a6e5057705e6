"""What the commands share: the CLI's own error, session and turn look-ups, the rich check."""

from __future__ import annotations

from ce.core.schema import SessionDocument, TurnRecord
from ce.core.stores import Store

__all__ = [
    "INSTALL_HINT",
    "CliError",
    "first_line",
    "require_rich",
    "session_or_fail",
    "turn_or_fail",
]

INSTALL_HINT = "pip install 'ce-core[cli]'"


class CliError(Exception):
    """A failure the CLI reports as one line on stderr with exit code 2 (the caller asked for
    something that does not exist or cannot be done)."""


def require_rich() -> None:
    """Raise :class:`ImportError` naming the extra when ``rich`` is not installed."""
    try:
        import rich  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"this ce command needs rich: {INSTALL_HINT}") from exc


async def session_or_fail(store: Store, session_id: str) -> SessionDocument:
    """The stored document of ``session_id``; :class:`CliError` when there is none."""
    doc = await store.get_session(session_id)
    if doc is None:
        raise CliError(f"no session {session_id!r} in the store")
    return doc


async def turn_or_fail(store: Store, session_id: str, turn_id: str | None) -> TurnRecord:
    """The turn record ``turn_id`` of the session: its id, its index as ``ce turns`` numbers
    them (``1`` the oldest, ``-1`` the newest), or a prefix of one id (the newest turn when
    None); :class:`CliError` when the session or the turn is not stored, or a prefix names
    several turns."""
    if turn_id is None:
        newest = await store.list_turns(session_id, limit=1)
        if newest:
            return newest[0]
        await session_or_fail(store, session_id)
        raise CliError(f"session {session_id!r} has no turn records")
    turn = await store.get_turn(session_id, turn_id)
    if turn is not None:
        return turn
    turns = await store.list_turns(session_id)
    if not turns:
        await session_or_fail(store, session_id)
    try:
        index = int(turn_id)
    except ValueError:
        matches = [t for t in turns if t.turn_id.startswith(turn_id)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise CliError(
                f"turn {turn_id!r} of session {session_id!r} is ambiguous: "
                + ", ".join(t.turn_id for t in matches[:5])
            ) from None
    else:
        if 1 <= index <= len(turns):
            return turns[index - 1]
        if -len(turns) <= index <= -1:
            return turns[index]
    raise CliError(
        f"session {session_id!r} has no turn {turn_id!r} ({len(turns)} turn(s): "
        "name one by its index, its id or a prefix of it; see ce turns)"
    )


def first_line(text: str, width: int = 80) -> str:
    """The first non-empty line of ``text``, cut to ``width`` characters (``…`` marks a cut,
    as does a following line)."""
    lines = [line.strip() for line in text.strip().splitlines()]
    line = lines[0] if lines else ""
    if len(line) > width:
        return line[: width - 1] + "…"
    return line + " …" if len(lines) > 1 else line
