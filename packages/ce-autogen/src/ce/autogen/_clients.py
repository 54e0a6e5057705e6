"""Model calls a tool body makes itself: an LLM-backed tool that calls a
``ChatCompletionClient`` directly, outside any agent.

Such a call is nested in the tool call it runs in: it gets the child scope
``<outer session>/<tool call id>``, receives the engine's input for its own messages there
(budgeted, redacted) and is recorded there, never in the outer conversation. AutoGen has no
hook on a client, so the plugin replaces the ``create`` / ``create_stream`` of every
``ChatCompletionClient`` class that defines them (and of classes defined later, through
``ChatCompletionClient.__init_subclass__``), each recorded in the ledger. Outside a tool call
of an instrumented run the replacement calls the original at once; an agent's own model call
(already handed the engine's input by :class:`~ce.autogen._inject.EngineClient`) passes
through as well: the engine client marks the client it calls (:func:`bypassing`).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from autogen_core.models import ChatCompletionClient

from ce.autogen._convert import turn_key
from ce.autogen._scopes import Frame, current_tool
from ce.core.integration import RunConversations, is_suppressed

if TYPE_CHECKING:
    from ce.autogen._record import Book
    from ce.autogen._scopes import Runs
    from ce.core.integration import PatchLedger, Plugin

__all__ = ["ClientSeams", "bypassing"]

logger = logging.getLogger("ce.autogen")

_MARK = "ce_autogen_client_seam"
_bypass: ContextVar[int | None] = ContextVar("ce_autogen_bypass", default=None)


@contextmanager
def bypassing(client: object) -> Iterator[None]:
    """Within this block a call of ``client`` is the engine client's own: left alone."""
    token = _bypass.set(id(client))
    try:
        yield
    finally:
        _bypass.reset(token)


class ClientSeams:
    """The client seams of one install: every client class present, and those defined
    later."""

    def __init__(self, plugin: Plugin, runs: Runs, book: Book, ledger: PatchLedger) -> None:
        self.plugin = plugin
        self.runs = runs
        self.book = book
        self.ledger = ledger
        self.conversations = RunConversations()  # of the direct calls, per tool call scope
        self._lock = threading.Lock()

    def install(self) -> None:
        self.ledger.for_subclasses(ChatCompletionClient, self.add)

    def add(self, cls: type) -> None:
        """Seam the ``create`` / ``create_stream`` ``cls`` defines itself (the plugin's own
        delegating clients are left alone)."""
        if getattr(cls, "ce_delegating", False):
            return
        with self._lock:
            for name, make in (("create", self._create), ("create_stream", self._stream)):
                current = vars(cls).get(name)
                if current is None or getattr(current, _MARK, False) or not callable(current):
                    continue
                new = make(current)
                setattr(new, _MARK, True)
                for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
                    setattr(new, attr, getattr(current, attr, None))
                new.__wrapped__ = current  # type: ignore[attr-defined]
                self.ledger.replace(cls, name, new)

    def _frame(self, client: object, messages: Sequence[Any]) -> Frame | None:
        """The scope of a direct call of ``client`` passing ``messages`` (None: leave it
        alone): the tool call's child scope when the call is the first the tool body makes,
        or continues a conversation of its earlier calls there (it passes one of their
        messages); else a child of that scope of its own (a second, unrelated prompt of the
        same tool body, an orchestrator's ledger prompts). Where an agent's run records into
        the tool call's scope (an ``AgentTool``), every direct call is a child of its own
        unless it continues another direct call's conversation: a memory's own call is not
        a turn of the agent's conversation."""
        if _bypass.get() == id(client) or current_tool() is None or is_suppressed():
            return None
        if not self.plugin.installed:
            return None
        scope = self.runs.new_scope()
        placed = self.conversations.place(
            scope,
            messages,
            turn_key,
            f"call:{uuid.uuid4().hex[:12]}",
            first_in_scope=not self.runs.running_in(scope.session_id),
        )
        return Frame(placed)

    def _engine_client(self, client: Any, frame: Frame) -> Any:
        from ce.autogen._inject import CallSite, EngineClient

        return EngineClient(client, CallSite(self.plugin, self.book, frame, ""))

    def _create(self, original: Callable[..., Any]) -> Callable[..., Any]:
        seams = self

        async def create(client: Any, *args: Any, **kwargs: Any) -> Any:
            frame = seams._frame(client, args[0]) if args else None
            if frame is None:
                return await original(client, *args, **kwargs)
            return await seams._engine_client(client, frame).create(*args, **kwargs)

        return create

    def _stream(self, original: Callable[..., Any]) -> Callable[..., Any]:
        seams = self

        async def create_stream(
            client: Any, *args: Any, **kwargs: Any
        ) -> AsyncGenerator[Any, None]:
            frame = seams._frame(client, args[0]) if args else None
            if frame is None:
                async for chunk in original(client, *args, **kwargs):
                    yield chunk
                return
            async for chunk in seams._engine_client(client, frame).create_stream(*args, **kwargs):
                yield chunk

        return create_stream
