"""``ContextEngineMemory``: a LlamaIndex ``BaseMemory`` whose history is the engine's session."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.memory.types import BaseMemory

from ce.core.engine import ContextEngine
from ce.core.formats import to_openai_messages
from ce.core.integration import (
    assembled_to_openai,
    openai_to_messages,
    resolve_scope,
)
from ce.core.schema import MessagePart, Role, SessionDocument
from ce.llamaindex._convert import from_openai, to_openai
from ce.llamaindex._plugin import LlamaIndexPlugin

__all__ = ["ContextEngineMemory"]


class ContextEngineMemory(BaseMemory):
    """Chat memory for chat engines and agents that take ``memory=``: what it is given is
    recorded into the engine's session, and what it returns is the session's history as the
    engine assembles it (within the budget, tool calls kept with their results, redacted).

    ``session_id`` names the session (also for the plugin's recording of the runs that use
    this memory). Without one the memory is its own conversation: it generates a session id
    once (``"memory:<uuid>"``, :attr:`conversation_id`) and keeps it for its lifetime, so two
    memories never share history and one memory's runs do. As everywhere, an
    ``instrument_tags`` ``ce_session_id`` or ``with engine.session(...)`` around the run takes
    precedence over the generated id; inside a run the plugin tracks, the memory uses the
    session the plugin resolved for the span it is called in (a memory used by a sub-agent
    inside a tool is in that tool call's child scope). ``engine`` defaults to the installed
    plugin's. Messages put into the memory are recorded at the next ``get``; the history is
    append-only, so ``reset`` and ``set`` only drop what was not recorded yet. The engine's
    context blocks (evidence, notebook, summary) reach the model through the plugin's
    injection or :func:`ce.llamaindex.wrap`; the memory returns the conversation.
    """

    session_id: str | None = None
    engine: Any = Field(default=None, exclude=True)

    ce_memory: ClassVar[bool] = True  # the plugin reads session_id as a session name

    _pending: list[ChatMessage] = PrivateAttr(default_factory=list)
    _generated: str = PrivateAttr(default_factory=lambda: f"memory:{uuid.uuid4().hex}")

    @classmethod
    def class_name(cls) -> str:
        return "ContextEngineMemory"

    @classmethod
    def from_defaults(
        cls,
        engine: ContextEngine | None = None,
        session_id: str | None = None,
        **kwargs: Any,
    ) -> ContextEngineMemory:
        """A memory over ``engine``'s session ``session_id``."""
        if kwargs:
            raise TypeError(f"unknown arguments: {sorted(kwargs)}")
        return cls(engine=engine, session_id=session_id)

    @property
    def conversation_id(self) -> str:
        """The conversation this memory stands for: its ``session_id``, else the id it
        generated for itself."""
        return self.session_id or self._generated

    def _engine_and_session(self) -> tuple[ContextEngine, str]:
        from llama_index.core.instrumentation.dispatcher import (  # type: ignore[attr-defined]
            active_instrument_tags,
        )
        from llama_index.core.instrumentation.span import active_span_id

        from ce.llamaindex._scopes import explicit_session

        plugin = LlamaIndexPlugin()
        engine = self.engine if self.engine is not None else plugin.engine
        tracker = plugin.tracker if plugin.installed else None
        info = tracker.span(active_span_id.get()) if tracker is not None else None
        if info is not None:  # the session the plugin resolved for this span
            return engine, info.session_id
        explicit = explicit_session(active_instrument_tags.get()) or self.session_id
        scope = resolve_scope(
            plugin, run_id=self.conversation_id, explicit=explicit, framework=self._generated
        )
        return engine, scope.session_id

    def _take_pending(self) -> list[Any]:
        pending, self._pending = self._pending, []
        return openai_to_messages(to_openai(pending))

    @staticmethod
    def _history(sent: list[dict[str, Any]]) -> list[ChatMessage]:
        return from_openai([m for m in sent if m["role"] != "system"], [], [])

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """Record what was put since the last call, and return the assembled history."""
        engine, session_id = self._engine_and_session()
        plugin = LlamaIndexPlugin()
        result = engine.sync.prepare_call(session_id, self._take_pending(), plugin.config)
        return self._history(assembled_to_openai(result.assembled_input))

    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        engine, session_id = self._engine_and_session()
        plugin = LlamaIndexPlugin()
        result = await engine.prepare_call(session_id, self._take_pending(), plugin.config)
        return self._history(assembled_to_openai(result.assembled_input))

    def get_all(self) -> list[ChatMessage]:
        """Every message the session holds (system instructions excepted); what was put
        since the last ``get`` is not recorded yet."""
        engine, session_id = self._engine_and_session()
        return self._all(engine.sync.get_session(session_id))

    async def aget_all(self) -> list[ChatMessage]:
        engine, session_id = self._engine_and_session()
        return self._all(await engine.get_session(session_id))

    def _all(self, doc: SessionDocument) -> list[ChatMessage]:
        parts = [
            MessagePart(
                role=m.role,
                content=m.content,
                tool_calls=m.tool_calls,
                tool_call_id=m.tool_call_id,
                name=m.name,
            )
            for m in doc.session.messages
            if m.role is not Role.SYSTEM
        ]
        return self._history(to_openai_messages(parts))

    def put(self, message: ChatMessage) -> None:
        self._pending.append(message)

    async def aput(self, message: ChatMessage) -> None:
        self.put(message)

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        self.put_messages(messages)

    def set(self, messages: list[ChatMessage]) -> None:
        """Record ``messages`` at the next ``get`` (those the session holds are not written
        again)."""
        self._pending = list(messages)

    def reset(self) -> None:
        """Drop what was put and not recorded yet (the session's history stays: it is
        append-only; see the engine's compliance delete)."""
        self._pending = []
