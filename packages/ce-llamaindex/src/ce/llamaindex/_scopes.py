"""Which session a LlamaIndex span belongs to: the kit's rule (``resolve_scope``) applied to
LlamaIndex's spans.

A span's scope is its parent span's, except where something changes it:

- **The top-level run** (a span without a known parent: ``agent.run(...)``, whose workflow
  steps are all children of the run span, a chat engine's ``chat``, a direct ``llm.chat``):
  ``ce_session_id`` in ``instrument_tags`` (or ``session_id``), else ``engine.session(...)``,
  else the framework's conversation identity (:func:`memory_session` of the memory the run or
  chat engine uses), else ``install(session_id=...)``, else ``run:<root span id>``. A span
  deeper in a top-level run that names a session (new tags, a new ``engine.session``) or, in a
  run scoped by the install default or by the run itself, brings a memory with an identity, is
  resolved again the same way. A prompt call without a known parent (an app's own
  ``llm.predict``, the synthesizer call a streaming query engine's response generator makes
  when the app reads it) is resolved the same way and is a component of that session.
- **Components** (a nested call, :meth:`ce.core.integration.Scope.child`): an agent's tool run
  (the ``call_tool`` step, id: the model's tool-call id, ``<id>~2``, ``<id>~3``, ... for a run
  of an id the session's runs already used; or a tool the app or a tool body calls itself,
  id: the call id of the latest reply asking for it, else the span id); a prompt call
  of an LLM (``predict`` / ``complete`` / ``structured_predict`` families: a condense step, a
  response synthesizer's call, an LLM-backed helper; id: the span id) except the answer a chat
  engine's response synthesizer makes (``CondensePlusContextChatEngine``,
  ``ContextChatEngine``, streamed or not: that call carries the conversation); a chat call
  made directly inside a query engine, or by a memory's own work (a memory block while a
  ``Memory`` puts messages into it: ``FactExtractionMemoryBlock`` asks the LLM for the facts
  of the messages that left the chat history; ``ChatSummaryMemoryBuffer.get`` summarising
  the oldest messages; see :data:`in_memory_work`), or a ``StructuredLLM``'s chat (an
  agent's ``output_cls`` answer, made from the conversation rendered as XML in one message)
  (id: its span id). Each gets
  ``<enclosing session>/<id>``, unless the spans inside it name a session of their own (an
  ``instrument_tags`` ``ce_session_id`` or an ``engine.session`` that no enclosing scope has).

A closed span is no parent (LlamaIndex versions that leave a finished workflow run's span
active in the caller's context would make later calls its children), except a chat engine's
streaming span, whose stream is read after it closed, and a ``StructuredLLM``'s streaming
span or an LLM's streamed structured prediction (``stream_structured_predict`` /
``astream_structured_predict``): the spans its stream opens as the app reads it (its LLM's
structured prediction and chat) open with no parent, or under a span of the app's, and are
that span's children (see :data:`in_structured_stream`); and a workflow run opened right
under another workflow run's span is a top-level run (that parent is such a left-behind
span). A span inside an LLM chat call is part of that call (:attr:`SpanInfo.call`): a chat
span opening in it, also under the prompt call a ``StructuredLLM`` makes between its chat and
its LLM's, is no call of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.llms.base import BaseLLM
from llama_index.core.chat_engine.types import BaseChatEngine, StreamingAgentChatResponse
from llama_index.core.llms.structured_llm import StructuredLLM
from llama_index.core.memory.simple_composable_memory import SimpleComposableMemory
from llama_index.core.memory.types import BaseMemory
from llama_index.core.response_synthesizers.base import BaseSynthesizer
from llama_index.core.tools.types import BaseTool
from llama_index.core.workflow import Workflow

from ce.core.engine import current_session_id
from ce.core.integration import Scope, resolve_scope

if TYPE_CHECKING:
    from ce.core.integration import Plugin, ToolRun
    from ce.llamaindex._record import LlmCall

__all__ = [
    "CHAT_METHODS",
    "SESSION_TAGS",
    "WRITE_METHODS",
    "ChatTurn",
    "SpanInfo",
    "explicit_session",
    "in_memory_work",
    "in_object_retrieval",
    "in_structured_stream",
    "is_tool",
    "memory_session",
    "method_of",
    "run_memories",
    "span_scope",
]

in_memory_work: ContextVar[bool] = ContextVar("ce_llamaindex_in_memory_work", default=False)
"""True while a memory does its own work (``BaseMemoryBlock.aput``,
``ChatSummaryMemoryBuffer.get``, wrapped by the plugin): a model call made there is the
memory's, not a turn of the conversation."""

in_object_retrieval: ContextVar[bool] = ContextVar(
    "ce_llamaindex_in_object_retrieval", default=False
)
"""True while an ``ObjectRetriever`` retrieves objects (``retrieve`` / ``aretrieve``, wrapped
by the plugin: an agent's ``tool_retriever`` picking the tools of a step, an ``ObjectIndex``
of tables): its hits are the objects it returns, never retrieved documents."""

in_structured_stream: ContextVar[str | None] = ContextVar(
    "ce_llamaindex_in_structured_stream", default=None
)
"""The id of the streaming span (a ``StructuredLLM``'s ``stream_chat`` / ``astream_chat``,
an LLM's ``stream_structured_predict`` / ``astream_structured_predict``) whose stream is
being read (set for each step of the read by the plugin's read seam): a span opening there is
that call's."""

SESSION_TAGS = ("ce_session_id", "session_id")
"""``instrument_tags`` keys naming the session of everything run inside them."""

CHAT_METHODS = frozenset({"chat", "achat", "stream_chat", "astream_chat"})
_PROMPT_METHODS = frozenset(
    {
        "predict",
        "apredict",
        "stream",
        "astream",
        "complete",
        "acomplete",
        "stream_complete",
        "astream_complete",
        "structured_predict",
        "astructured_predict",
        "stream_structured_predict",
        "astream_structured_predict",
    }
)
_STREAM_METHODS = frozenset({"stream", "astream"})
_STREAM_CHAT_METHODS = frozenset({"stream_chat", "astream_chat"})
_STREAM_PREDICT_METHODS = frozenset({"stream_structured_predict", "astream_structured_predict"})
WRITE_METHODS = frozenset({"write_response_to_history", "awrite_response_to_history"})
_TOOL_METHODS = frozenset({"call", "acall"})
_QUERY_METHODS = frozenset({"query", "aquery"})
_SYNTHESIZE_METHODS = frozenset({"synthesize", "asynthesize"})
_DEFAULT_MEMORY_KEY = "chat_history"  # ChatMemoryBuffer's default chat_store_key


@dataclass
class ChatTurn:
    """One ``chat`` of a chat engine (its outermost chat span ``span_id``): the user's
    ``question`` in session ``session_id``, whether a model call of that session ran inside it
    (``answered``: the call carried the exchange and recorded it) and the provider and model
    of the last model call made inside it. A chat engine that answers through calls of their
    own (``CondenseQuestionChatEngine``: a condense step, then a query engine's synthesizer,
    each a component) carries the exchange in none of its calls: the plugin records it when
    the answer is there."""

    span_id: str
    question: str
    session_id: str
    answered: bool = False
    queried: bool = False
    """A query engine ran inside it: a stream read after the chat span closed is that query
    engine's synthesizer's (``CondenseQuestionChatEngine``), not the chat engine's answer."""
    model: tuple[str, str] | None = None


@dataclass
class SpanInfo:
    """An open span: its parent, the top-level run it belongs to, its scope and what it runs
    inside. ``tool_call_id`` is the tool call the span runs in and ``tool_session`` the
    session that tool call belongs to (where its run and its retrieval hits are recorded)."""

    parent: str | None
    root: str
    scope: Scope
    named: str | None = None
    engine_named: str | None = None
    framework: str | None = None
    call: LlmCall | None = None
    """The LLM chat call the span is or runs inside: a chat span opening in it belongs to
    that call."""
    tool_call_id: str | None = None
    tool_session: str | None = None
    tool: ToolRun | None = None
    tool_pending: bool = False
    in_query: bool = False
    in_chat_engine: bool = False
    answer: bool = False
    prompt_call: bool = False
    streams: bool = False
    """A span whose stream is read after it closed (a chat engine's streaming ``chat``, a
    ``StructuredLLM``'s ``stream_chat``, a ``stream_structured_predict``): kept as the parent
    of the spans of that read."""
    in_stream: str | None = None
    """The streaming span this span is (``streams``) or opened in: a span opening while that
    span's stream is read, under this one, is part of the read already."""
    workflow_run: bool = False
    prompt_handled: bool = False
    """Inside a completion whose prompt already went through the redactor (the completion
    seam) or the engine (``wrap()``'s LLM): a completion nested in it keeps its prompt."""
    completion: tuple[str, str, dict[str, Any]] | None = None
    """An LLM completion span: the provider, model and parameters its usage is recorded with."""
    completion_inside: bool = False
    """A completion span in which another completion ran (``CustomLLM``'s ``acomplete``
    calling its ``complete``): that one is recorded, this one is not recorded again."""
    chat_inside: bool = False
    """A chat call ran inside this span (a completion a provider serves through its own chat:
    that call is recorded, the completion is not recorded again)."""
    chat_turn: ChatTurn | None = None
    """The chat engine's ``chat`` this span runs in."""
    stream_write: tuple[Any, Mapping[str, Any]] | None = None
    """A streamed chat response's write to the memory (this span): the response and the
    span's arguments."""
    nodes: tuple[Any, ...] = ()
    """The nodes a query's synthesizer answers from (its final source nodes), for the model
    calls made inside it: a text a call's messages quote from two of them is that call's
    evidence (sent once)."""

    @property
    def session_id(self) -> str:
        return self.scope.session_id


def method_of(span_id: str) -> str:
    """The method name of a span id (``"OpenAI.achat-<uuid>"`` -> ``"achat"``)."""
    return span_id.split("-", 1)[0].rsplit(".", 1)[-1]


def _primary(memory: Any) -> Any:
    """The memory that holds the conversation of ``memory``: a ``SimpleComposableMemory``'s
    primary memory (its secondary sources only add recalled messages to the system prompt),
    any other memory itself."""
    while isinstance(memory, SimpleComposableMemory):
        memory = memory.primary_memory
    return memory


def memory_session(memory: Any) -> str | None:
    """The conversation a LlamaIndex memory stands for, when it names one: a
    :class:`~ce.llamaindex.ContextEngineMemory`'s session (its ``session_id``, else the id it
    generated for itself), a ``Memory``'s ``session_id`` (the random UUID LlamaIndex generates
    counts too: it is unique to that memory object, so it joins the runs that share the memory
    and no others), a ``ChatMemoryBuffer``'s ``chat_store_key`` unless it is the default
    ``"chat_history"`` (every buffer has that key: it names no conversation), a
    ``SimpleComposableMemory``'s: the one its primary memory names."""
    memory = _primary(memory)
    if not isinstance(memory, BaseMemory):
        return None
    if getattr(type(memory), "ce_memory", False):  # ContextEngineMemory
        conversation = getattr(memory, "conversation_id", None)
        return conversation if isinstance(conversation, str) and conversation else None
    session = getattr(memory, "session_id", None)
    if isinstance(session, str) and session:
        return session
    key = getattr(memory, "chat_store_key", None)
    if isinstance(key, str) and key and key != _DEFAULT_MEMORY_KEY:
        return key
    return None


def explicit_session(tags: Mapping[str, Any] | None) -> str | None:
    """The session ``instrument_tags`` name (``ce_session_id``, else ``session_id``)."""
    for key in SESSION_TAGS:
        value = (tags or {}).get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return str(value)
    return None


def _memories(arguments: Mapping[str, Any], instance: Any) -> list[Any]:
    """The memories a span's call uses: its ``memory`` argument, its instance's (a chat
    engine's ``_memory``), a workflow start event's ``memory``."""
    try:
        own = getattr(instance, "_memory", None)
    except Exception:  # an object whose attribute access fails for its own reasons
        own = None
    candidates = [arguments.get("memory"), own]
    for name in ("start_event", "ev"):
        event = arguments.get(name)
        getter = getattr(event, "get", None)
        if callable(getter):
            try:
                candidates.append(getter("memory", None))
            except Exception:  # an event whose get() is not a mapping's
                continue
    return candidates


def run_memories(id_: str, instance: Any, arguments: Mapping[str, Any]) -> list[BaseMemory]:
    """The memories the span ``id_`` converses with (its ``memory`` argument, its chat engine's,
    its workflow start event's); none for a chat engine's span other than a chat (its
    ``reset`` empties the memory, it holds no conversation)."""
    if isinstance(instance, BaseChatEngine) and method_of(id_) not in CHAT_METHODS:
        return []
    return [m for m in _memories(arguments, instance) if isinstance(m, BaseMemory)]


def _given_memory_session(memories: list[Any]) -> str | None:
    """A ContextEngineMemory's own ``session_id`` (also as a ``SimpleComposableMemory``'s
    primary memory): the user named a ce session with it."""
    for memory in map(_primary, memories):
        if isinstance(memory, BaseMemory) and getattr(type(memory), "ce_memory", False):
            given = getattr(memory, "session_id", None)
            if isinstance(given, str) and given:
                return given
    return None


def _component(
    id_: str, method: str, instance: Any, arguments: Mapping[str, Any], parent: SpanInfo
) -> str | None:
    """The id of the component ``id_`` opens inside ``parent`` (a nested call), if it opens
    one. Tool runs are handled by the span handler (their id needs the model's reply)."""
    if isinstance(instance, BaseLLM):
        if parent.prompt_call or parent.call is not None:
            return None  # part of the LLM call already open
        if method in _PROMPT_METHODS:
            return None if parent.answer or _streamed_answer(method, parent) else id_
        if method in CHAT_METHODS and (parent.in_query or _helper_chat(instance)):
            return id_  # a chat call a query engine, a memory or a structured LLM makes
    return None


def _helper_chat(instance: Any) -> bool:
    """Whether a chat call of the LLM ``instance`` is helper work, never a turn of the
    conversation it runs in: a memory's own call (see :data:`in_memory_work`), or a
    ``StructuredLLM``'s (``llm.as_structured_llm(cls)``: an agent's ``output_cls`` answer
    made from the whole conversation rendered as XML in one message, an extraction)."""
    return in_memory_work.get() or isinstance(instance, StructuredLLM)


def _streamed_answer(method: str, parent: SpanInfo) -> bool:
    """A chat engine streams its answer only (a condense step never streams): a streaming
    prompt call made right in a chat engine (a stream its response reads after the
    synthesizer returned) is the answer, unless the chat engine answers through a query
    engine (``CondenseQuestionChatEngine``): the stream is then that query engine's
    synthesizer's, a component like its other calls."""
    queried = parent.chat_turn is not None and parent.chat_turn.queried
    return method in _STREAM_METHODS and parent.in_chat_engine and not (parent.in_query or queried)


def span_scope(
    plugin: Plugin,
    id_: str,
    parent_id: str | None,
    parent: SpanInfo | None,
    tags: Mapping[str, Any] | None,
    arguments: Mapping[str, Any],
    instance: Any,
) -> SpanInfo:
    """The :class:`SpanInfo` of a span opening: its scope by the module's rule (tool runs
    are nested by the span handler, which knows their call ids)."""
    method = method_of(id_)
    workflow_run = isinstance(instance, Workflow) and method == "run"
    if parent is not None and parent.workflow_run and workflow_run:
        # a workflow run is started by the app or by a step or tool of another run, never by
        # the run span itself: this parent is the active span an earlier run left behind in
        # the caller's context (llama-index-workflows 2.0 does not reset it; later releases do)
        parent = None
    memories = _memories(arguments, instance)
    named = explicit_session(tags) or _given_memory_session(memories)
    in_engine = current_session_id()
    own = next((s for s in map(memory_session, memories) if s), None)
    if parent is None:
        scope = resolve_scope(plugin, run_id=id_, explicit=named, framework=own)
        if isinstance(instance, BaseLLM) and (
            method in _PROMPT_METHODS or (method in CHAT_METHODS and _helper_chat(instance))
        ):
            # a prompt call (or a memory's own call) is never the conversation, also without
            # a parent: an app's own
            # llm.predict, or the last call of a streaming query engine's synthesizer, which its
            # response generator makes when the app reads it, after query() returned; that span
            # opens with no parent id at all (keeping the closed query spans as parents, as for
            # a chat engine's stream, would not reach it), so it is its session's component
            scope = scope.child(id_)
        info = SpanInfo(parent=parent_id, root=id_, scope=scope)
    else:
        info = SpanInfo(
            parent=parent_id,
            root=parent.root,
            scope=parent.scope,
            framework=parent.framework,
            call=parent.call,
            tool_call_id=parent.tool_call_id,
            tool_session=parent.tool_session,
            tool_pending=parent.tool_pending,
            in_query=parent.in_query,
            in_chat_engine=parent.in_chat_engine,
            answer=parent.answer,
            prompt_call=parent.prompt_call,
            prompt_handled=parent.prompt_handled,
            chat_turn=parent.chat_turn,
            nodes=parent.nodes,
            in_stream=parent.in_stream,
        )
        component = _component(id_, method, instance, arguments, parent)
        if (
            component is None
            and info.chat_turn is not None
            and isinstance(instance, BaseLLM)
            and parent.call is None
            and not parent.prompt_call
        ):
            info.chat_turn.answered = True  # a call of the conversation: it carries the turn
        # a name the span's context lost (a workflow step's own instrument_tags) is kept
        named, in_engine = named or parent.named, in_engine or parent.engine_named
        renamed = (named, in_engine) != (parent.named, parent.engine_named)
        if component is not None:
            info.scope = resolve_scope(
                plugin,
                run_id=parent.root,
                explicit=named,
                parent=parent.scope,
                parent_call_id=component,
            )
        elif parent.scope.nested and renamed:
            scope = resolve_scope(plugin, run_id=parent.root, explicit=named, parent=parent.scope)
            if scope.source in ("explicit", "engine"):
                info.scope = scope
        elif not parent.scope.nested and (
            renamed or (own and parent.scope.source in ("run", "install"))
        ):
            info.scope = resolve_scope(
                plugin, run_id=parent.root, explicit=named, framework=own or parent.framework
            )
    info.named, info.engine_named = named, in_engine
    info.framework = own or info.framework
    _mark(info, method, instance)
    if info.streams:
        info.in_stream = id_
    if info.chat_turn is None and isinstance(instance, BaseChatEngine) and method in CHAT_METHODS:
        question = arguments.get("message")
        if isinstance(question, str):
            info.chat_turn = ChatTurn(id_, question, info.session_id)
    if info.in_query and isinstance(instance, BaseSynthesizer) and method in _SYNTHESIZE_METHODS:
        nodes = arguments.get("nodes")
        info.nodes = tuple(nodes) if isinstance(nodes, (list, tuple)) else ()
    return info


def _mark(info: SpanInfo, method: str, instance: Any) -> None:
    """What the span runs inside, for its children."""
    if isinstance(instance, BaseLLM) and method in _PROMPT_METHODS:
        info.prompt_call = True
        # a streamed prediction's model call is made as its stream is read, after it closed
        info.streams = method in _STREAM_PREDICT_METHODS
    elif isinstance(instance, BaseChatEngine) and method in CHAT_METHODS:
        info.in_chat_engine, info.answer = True, False
        info.streams = method in _STREAM_CHAT_METHODS
    elif isinstance(instance, StructuredLLM) and method in _STREAM_CHAT_METHODS:
        info.streams = True  # its model call is made as its stream is read, after it closed
    elif isinstance(instance, Workflow) and method == "run":
        info.workflow_run = True
    elif isinstance(instance, BaseQueryEngine) and method in _QUERY_METHODS:
        info.in_query, info.answer = True, False
        if info.chat_turn is not None:
            info.chat_turn.queried = True
    elif isinstance(instance, BaseSynthesizer) and method in _SYNTHESIZE_METHODS:
        # a chat engine's own synthesizer (not a query engine's) makes its answer
        info.answer = info.in_chat_engine and not info.in_query and not info.prompt_call
    elif isinstance(instance, StreamingAgentChatResponse) and method in WRITE_METHODS:
        # a streamed answer is read when the response is written to the memory: the chat
        # engine's own, unless it answered through a query engine (whose synthesizer's)
        queried = info.chat_turn is not None and info.chat_turn.queried
        info.answer = info.in_chat_engine and not info.in_query and not queried


def is_tool(instance: Any, method: str) -> bool:
    """Whether a span is a LlamaIndex tool's ``call`` / ``acall``."""
    return isinstance(instance, BaseTool) and method in _TOOL_METHODS
