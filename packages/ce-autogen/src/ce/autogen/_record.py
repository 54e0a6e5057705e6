"""AutoGen runs -> the engine: model calls (usage, the reply with its agent as author), tool
runs (AutoGen's call id, status, duration), memory queries (one ``rag_doc`` evidence per
hit), speaker selections (usage and output only).

Every write is awaited on the caller's loop (AutoGen is async only), fail-open like the kit's
:func:`ce.core.integration.guarded`: a failed write is logged and reported as a ``Degraded``
event, never raised into the agent's run (raised with ``fail_closed=True``). Not written behind
(``engine.defer`` plus a flush task): a read right after a run (``engine.get_session``) does not
wait for a deferred write another task is already running, so it could miss the run's last
reply; and on AutoGen's single event loop the flush costs the same time a little later.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ce.core.integration import (
    ModelCall,
    RetrievalHit,
    ToolRun,
    error_text,
    provider_of,
)
from ce.core.integration import (
    record_awaited as write,
)
from ce.core.schema import AuthorKind, Message, ModelUsageStage, Role

if TYPE_CHECKING:
    from autogen_core.models import CreateResult


__all__ = [
    "EMITTED",
    "HANDED",
    "SHOWN",
    "Book",
    "HandedParts",
    "ShownTexts",
    "hits_from_memory",
    "model_name",
    "write",
]

_URI_KEYS = ("source", "uri", "url", "file_path", "path")
_SCORE_KEYS = ("score", "relevance", "similarity")
_ID_KEYS = ("id", "doc_id", "document_id")
_SMALL = 512
_SESSIONS_KEPT = 1024
_PER_SESSION = 4096
_MEMORY_TEXTS = 4096
_EMITTED_KEPT = 4096
_SHOWN_KEPT = 4096
_HANDED_KEPT = 4096

EMITTED = "autogen_emitted"
"""The meta key of a message the plugin stored for an agent that AutoGen never puts into that
agent's own model context (a ``ToolCallSummaryMessage``, a ``HandoffMessage``): its AutoGen
message type."""


def model_name(client: Any) -> str:
    """The model an AutoGen model client calls (its create args' ``model``, else its model
    family)."""
    args = getattr(client, "_create_args", None)
    if isinstance(args, Mapping) and isinstance(args.get("model"), str):
        return str(args["model"])
    for attr in ("model", "_model", "model_name"):
        value = getattr(client, attr, None)
        if isinstance(value, str) and value:
            return value
    try:
        return str(client.model_info.get("family") or "unknown")
    except Exception:  # a client whose model_info is not a mapping
        return "unknown"


def model_call(
    client: Any,
    result: CreateResult | None,
    started: float,
    first_token: float | None,
    text: str,
    stage: ModelUsageStage = ModelUsageStage.OTHER,
    error: BaseException | None = None,
) -> ModelCall:
    """The neutral record of one finished (or failed) model call of ``client``."""
    usage = getattr(result, "usage", None)
    ended = time.perf_counter()
    return ModelCall(
        call_id=uuid.uuid4().hex,
        provider=provider_of(client),
        model=model_name(client),
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        latency_ms=round((ended - started) * 1000),
        first_token_latency_ms=(
            round((first_token - started) * 1000) if first_token is not None else None
        ),
        output_text=text,
        stage=stage,
        error=error_text(error) if error is not None else None,
    )


def tool_run(
    call_id: str,
    name: str,
    args: dict[str, Any] | str,
    result: Any,
    started: float,
) -> ToolRun:
    """The neutral record of one tool run of an agent, from AutoGen's
    ``FunctionExecutionResult`` (its ``is_error`` makes the run an error)."""
    content = str(getattr(result, "content", result))
    failed = bool(getattr(result, "is_error", False))
    return ToolRun(
        tool_call_id=call_id,
        name=name,
        args=args,
        result=None if failed else content,
        error=content if failed else None,
        started_at=started,
        ended_at=time.time(),
        provider_name="autogen",
    )


def _small(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= _SMALL
    return isinstance(value, (int, float, bool))


def hits_from_memory(results: Sequence[Any]) -> list[RetrievalHit]:
    """AutoGen ``MemoryContent`` results as neutral hits: the source uri from the metadata
    (``source``, ``uri``, ``url``, ``file_path`` or ``path``), the score (``score``,
    ``relevance`` or ``similarity``), the document id, and the small scalar metadata."""
    hits: list[RetrievalHit] = []
    for item in results:
        content = getattr(item, "content", item)
        if not isinstance(content, str):
            content = str(content)
        meta = dict(getattr(item, "metadata", None) or {})
        uri = next((str(meta[k]) for k in _URI_KEYS if meta.get(k)), "")
        score = next((meta[k] for k in _SCORE_KEYS if isinstance(meta.get(k), (int, float))), None)
        doc_id = next((str(meta[k]) for k in _ID_KEYS if meta.get(k) is not None), None)
        metadata = {
            str(k): v
            for k, v in meta.items()
            if _small(v) and k not in _URI_KEYS and k not in _SCORE_KEYS
        }
        mime = getattr(item, "mime_type", None)
        if mime is not None:
            metadata["mime_type"] = str(getattr(mime, "value", mime))
        hits.append(
            RetrievalHit(
                content=content,
                uri=uri,
                score=float(score) if score is not None else None,
                doc_id=doc_id,
                metadata=metadata,
            )
        )
    return hits


def _levels(text: str) -> list[str]:
    """``text`` and its shorter renderings (the engine's Summary and Gist of a message that
    has no rendering of its own)."""
    from ce.core.pipeline import shorten
    from ce.core.schema import LevelOfDetail

    return [text, shorten(text, LevelOfDetail.SUMMARY), shorten(text, LevelOfDetail.GIST)]


class Book:
    """What the plugin remembers between calls: who wrote the assistant messages of each
    session (by text, redacted text and tool call id: the engine's input names no author),
    which of them an agent emitted without AutoGen ever putting them into its own model
    context (a tool-call summary, a handoff message), which sessions' stored authors were read,
    which parts of replies a handoff passed on were looked for in a session, and the system
    messages memories added to model contexts. Bounded (oldest first out)."""

    def __init__(self) -> None:
        self._texts: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._calls: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._emitted: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._ever_emitted: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._unattributed: OrderedDict[str, set[str]] = OrderedDict()
        self._sought: OrderedDict[str, set[Hashable]] = OrderedDict()
        self._memory: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def _session(self, table: OrderedDict[str, dict[str, str]], session_id: str) -> dict[str, str]:
        entry = table.get(session_id)
        if entry is None:
            entry = table[session_id] = {}
            while len(table) > _SESSIONS_KEPT:
                table.popitem(last=False)
        else:
            table.move_to_end(session_id)
        if len(entry) > _PER_SESSION:
            entry.clear()
        return entry

    def note_reply(
        self, session_id: str, agent: str, texts: Sequence[str], call_ids: Sequence[str]
    ) -> None:
        """Agent ``agent`` wrote a reply with these texts (raw and as stored) and calls. The
        texts are noted at every level of detail the engine may render them at (a reply the
        budget degraded is still its author's)."""
        forms = {form for text in texts if text for form in _levels(text)}
        with self._lock:
            by_text = self._session(self._texts, session_id)
            for text in forms:
                by_text[text] = agent
            by_call = self._session(self._calls, session_id)
            for call_id in call_ids:
                by_call[call_id] = agent

    def note_emitted(self, session_id: str, agent: str, texts: Sequence[str]) -> None:
        """Agent ``agent`` emitted a message with these texts (raw and as stored) that AutoGen
        shows its peers but never puts into the agent's own model context (a tool-call
        summary, a handoff message). Noted as :meth:`note_reply` notes a reply, and as the
        agent's emitted message."""
        self.note_reply(session_id, agent, texts, ())
        forms = {form for text in texts if text for form in _levels(text)}
        with self._lock:
            emitted = self._session(self._emitted, session_id)
            for text in forms:
                emitted[text] = agent
            for text in texts:
                self._ever_emitted[(agent, text)] = None
                self._ever_emitted.move_to_end((agent, text))
            while len(self._ever_emitted) > _EMITTED_KEPT:
                self._ever_emitted.popitem(last=False)

    def emitted_before(self, agent: str, text: str) -> bool:
        """Whether agent ``agent`` emitted a message with ``text`` in any session (a team's
        next run in a new session carries its earlier messages over in its agents' model
        contexts)."""
        return (agent, text) in self._ever_emitted

    def knows(self, session_id: str, text: str) -> bool:
        """Whether the author of ``text`` in ``session_id`` is noted."""
        return text in self._texts.get(session_id, {})

    def knows_call(self, session_id: str, call_id: str) -> bool:
        """Whether the author of tool call ``call_id`` in ``session_id`` is noted."""
        return call_id in self._calls.get(session_id, {})

    def authors(self, session_id: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """The texts and the tool call ids of ``session_id`` with their authors, and the
        texts of the messages its agents emitted (see :meth:`note_emitted`) with theirs."""
        with self._lock:
            return (
                dict(self._texts.get(session_id, {})),
                dict(self._calls.get(session_id, {})),
                dict(self._emitted.get(session_id, {})),
            )

    def unattributed(self, session_id: str) -> frozenset[str]:
        """The texts and tool call ids of ``session_id`` whose messages the session stores
        without an agent author (see :meth:`note_unattributed`)."""
        with self._lock:
            return frozenset(self._unattributed.get(session_id, ()))

    def note_unattributed(self, session_id: str, keys: Collection[str]) -> None:
        """Note texts and tool call ids of ``session_id`` that the session stores with no
        agent author: reading the session again would not tell their author either."""
        if not keys:
            return
        with self._lock:
            known = self._unattributed.get(session_id)
            if known is None:
                known = self._unattributed[session_id] = set()
                while len(self._unattributed) > _SESSIONS_KEPT:
                    self._unattributed.popitem(last=False)
            known.update(keys)

    def sought(self, session_id: str, part: Hashable) -> bool:
        """Whether the reply of ``part`` (a part of a reply a handoff passed on, see
        :class:`HandedParts`) was looked for in ``session_id`` (see :meth:`note_sought`)."""
        return part in self._sought.get(session_id, ())

    def note_sought(self, session_id: str, parts: Collection[Hashable]) -> None:
        """Note parts of replies a handoff passed on whose replies were looked for in
        ``session_id``: reading the session again would not find them either."""
        with self._lock:
            known = self._sought.get(session_id)
            if known is None:
                known = self._sought[session_id] = set()
                while len(self._sought) > _SESSIONS_KEPT:
                    self._sought.popitem(last=False)
            known.update(parts)

    def note_stored(self, session_id: str, messages: Sequence[Message]) -> None:
        """Note the authors of the assistant messages ``session_id`` stores (written by
        another process, or before this one started): each agent's message by its text as
        stored and its tool call ids, a message the plugin recorded as emitted (meta
        :data:`EMITTED`) as emitted."""
        for message in messages:
            author = message.author
            if (
                message.role is not Role.ASSISTANT
                or author is None
                or author.kind is not AuthorKind.AGENT
            ):
                continue
            if message.meta.get(EMITTED):
                self.note_emitted(session_id, author.id, [message.content])
                continue
            calls = [c.tool_call_id for c in message.tool_calls or ()]
            self.note_reply(session_id, author.id, [message.content], calls)

    def note_memory(self, text: str) -> None:
        """A memory added this system message to a model context."""
        with self._lock:
            self._memory[text] = None
            self._memory.move_to_end(text)
            while len(self._memory) > _MEMORY_TEXTS:
                self._memory.popitem(last=False)

    def memory_texts(self) -> Collection[str]:
        """The system messages memories added (a live view: membership tests only)."""
        return self._memory.keys()


class ShownTexts:
    """The replies whose text AutoGen shows an agent's peers differently from what the model
    wrote: a ``StructuredMessage`` reaches the peers as its content's compact JSON, while the
    agent's own model context (and the session) holds the model's text. By agent and the
    text shown: the text written. Bounded (oldest first out); thread-safe."""

    def __init__(self) -> None:
        self._written: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, agent: str, shown: str, written: str) -> None:
        """Agent ``agent``'s reply ``written`` reaches its peers as ``shown``."""
        if shown == written:
            return
        with self._lock:
            self._written[(agent, shown)] = written
            self._written.move_to_end((agent, shown))
            while len(self._written) > _SHOWN_KEPT:
                self._written.popitem(last=False)

    def written(self, agent: str, shown: str) -> str:
        """The text agent ``agent`` wrote for a message its peers receive as ``shown``
        (``shown`` itself when noted as none)."""
        return self._written.get((agent, shown), shown)


SHOWN = ShownTexts()
"""The process's :class:`ShownTexts`: how AutoGen renders a reply for the peers depends on
the reply alone, not on an install (the conversions of ``_convert`` read it)."""


class HandedParts:
    """The parts of replies AutoGen passes on to an agent's peers as a handoff's context
    (the reply's tool calls but the handoffs, with their results, or its thought alone),
    while the reply itself stays in the agent's own model context (and the session holds it
    once). By agent and the part's key: the whole reply as its OpenAI dict. Bounded (oldest
    first out); thread-safe."""

    def __init__(self) -> None:
        self._replies: OrderedDict[tuple[str, Hashable], dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, agent: str, part: Hashable, reply: dict[str, Any]) -> None:
        """Agent ``agent``'s reply ``reply`` reaches its peers as the part keyed ``part``."""
        with self._lock:
            self._replies[(agent, part)] = reply
            self._replies.move_to_end((agent, part))
            while len(self._replies) > _HANDED_KEPT:
                self._replies.popitem(last=False)

    def reply(self, agent: str, part: Hashable) -> dict[str, Any] | None:
        """The reply of agent ``agent`` a handoff passed on as the part keyed ``part``
        (``None`` when noted as none)."""
        return self._replies.get((agent, part))


HANDED = HandedParts()
"""The process's :class:`HandedParts`: what a handoff passes on depends on the reply alone,
not on an install (the conversions of ``_convert`` read it)."""
