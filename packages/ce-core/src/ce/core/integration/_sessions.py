"""Which session a framework call belongs to."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ce.core.engine import current_session_id

if TYPE_CHECKING:
    from ce.core.integration._plugin import Plugin

__all__ = ["DEFAULT_SESSION_ID", "resolve_session"]

DEFAULT_SESSION_ID = "default"
"""The session of calls nothing else names a session for."""


def resolve_session(framework_id: str | None, plugin: Plugin) -> str:
    """The session of a call: the framework's own id for it (a thread id, a chat history's
    session, ...) when it has one, else the innermost ``with engine.session(...)``, else the
    ``session_id`` given to ``plugin.install()``, else :data:`DEFAULT_SESSION_ID`. Empty
    strings count as absent."""
    return framework_id or current_session_id() or plugin.session_id or DEFAULT_SESSION_ID
