"""The async seam: every LLM class's ``achat`` / ``astream_chat`` awaits the engine inside its
chat span, before LlamaIndex's chat callback and the provider's body run.

Why there: LlamaIndex gives no awaited hook between a chat span opening and the LLM reading
its messages. Span handlers are called synchronously (``Dispatcher.span_enter``, from the span
decorator, before the method body); ``LLMChatStartEvent`` goes out through the synchronous
``Dispatcher.event``; the chat callback's only await before the body is an optional rate
limiter; providers read the messages before their first await. A handler can therefore only
call the engine blocking, which on an async path stalls the event loop for the whole
``prepare_call``. So the plugin makes the seam itself: at install, each LLM class's own
``achat`` / ``astream_chat`` (the dispatcher's span around the chat callback around the
provider's body) is replaced, through the plugin's ledger, by the same span around a coroutine
that first awaits ``before(llm)`` and then runs the original inner function with the very
arguments. The span handler has already resolved the call's session synchronously (cheap, no
engine call) when the seam runs, and the list the seam rewrites is the one the chat callback
dispatches and the provider reads. Classes created after install are seamed as they are created
(``BaseLLM.__init_subclass__``, recorded in the ledger too). Every async chat path ends in one
of these two methods: ``achat_with_tools`` / ``astream_chat_with_tools`` (FunctionAgent,
AgentWorkflow), ReActAgent, chat engines, ``apredict`` / ``astream`` of chat models.

The completion seam, the same way: a completion (``complete``, ``acomplete``,
``stream_complete``, ``astream_complete``) gets a string prompt, which no span handler can
rewrite, and a provider may serve it without any chat span (llama-index-llms-openai's
``OpenAI``: ``CondensePlusContextChatEngine``'s condense prompt, which quotes the conversation).
So each LLM class's own completion methods become the same span around a function (sync or
coroutine, as the original) that passes the ``prompt`` argument through ``prompt(llm, text)``
(``aprompt`` in the async ones: the configured redactor) and runs the original inner function
with it and the other arguments as they were.

The read seam: a ``StructuredLLM``'s ``stream_chat`` / ``astream_chat`` returns a stream whose
body makes the model call (its ``stream_structured_predict`` and the LLM's chat) only when the
app reads it, after the ``StructuredLLM``'s span closed, and so does every LLM's
``stream_structured_predict`` / ``astream_structured_predict`` (their generator's body calls
the LLM's ``stream_chat_with_tools`` or its streamed structured program); those spans open
with no parent (or under whatever span of the app's is active there), nothing links them to
that call. So the plugin makes those methods the same span around a function that runs the
original inner function and returns its stream read with a context variable set to the
span's id for each step (:func:`mark_reads`, installed with or without injection: it decides
the scope; the prediction methods of every LLM class, those created later too).
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from contextvars import ContextVar
from types import FunctionType
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.base import BaseLLM
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.span import active_span_id

if TYPE_CHECKING:
    from ce.core.integration import PatchLedger

__all__ = [
    "ASYNC_CHAT_METHODS",
    "COMPLETION_METHODS",
    "PREDICT_READS",
    "STRUCTURED_READS",
    "Seams",
    "mark_reads",
    "seamed",
]

logger = logging.getLogger("ce.llamaindex")

ASYNC_CHAT_METHODS = frozenset({"achat", "astream_chat"})
"""The methods every async chat call of an LLM ends in."""
COMPLETION_METHODS = frozenset({"complete", "acomplete", "stream_complete", "astream_complete"})
"""The methods every completion of an LLM ends in (its prompt is passed through the seam)."""

STRUCTURED_READS = ("stream_chat", "astream_chat")
"""A ``StructuredLLM``'s streamed chats: read with the call marked (the read seam)."""
PREDICT_READS = ("stream_structured_predict", "astream_structured_predict")
"""Every LLM's streamed structured predictions: read with the call marked (the read seam)."""

_MARK = "ce_async_seam"
_PROMPT_MARK = "ce_prompt_seam"
_READ_MARK = "ce_read_seam"
_SPAN_MARK = "__dispatcher_span_decorated__"  # llama_index_instrumentation's attribute

Before = Callable[[BaseLLM], Awaitable[None]]
Prompt = Callable[[BaseLLM, str], str]
APrompt = Callable[[BaseLLM, str], Awaitable[str]]


def seamed(instance: Any, method: str) -> bool:
    """Whether the ``method`` a call of ``instance`` runs awaits the engine at the seam (else
    the span handler injects inline)."""
    try:
        attribute = inspect.getattr_static(type(instance), method)
    except AttributeError:
        return False
    return getattr(attribute, _MARK, False) is True


def _spanned(cls: type, inner: Callable[..., Any], seam: Any, mark: str) -> Any:
    """``seam`` standing for ``inner`` (the function the dispatcher's span wrapped), in a span
    of the class's module dispatcher, as ``DispatcherSpanMixin`` decorates it."""
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):  # the span id's name
        setattr(seam, name, getattr(inner, name, None))
    seam.__wrapped__ = inner  # the signature the span binds
    setattr(seam, mark, True)
    return get_dispatcher(cls.__module__).span(seam)


def _seam(cls: type, inner: Callable[..., Any], before: Before) -> Any:
    """``inner`` behind ``await before(llm)``."""

    async def seam(self: BaseLLM, *args: Any, **kwargs: Any) -> Any:
        await before(self)
        return await inner(self, *args, **kwargs)

    return _spanned(cls, inner, seam, _MARK)


def _prompt_seam(cls: type, inner: Callable[..., Any], prompt: Prompt, aprompt: APrompt) -> Any:
    """``inner`` (a completion method) given its ``prompt`` argument (the first positional
    one, else the keyword, as LlamaIndex's completion callback reads it) through ``prompt``
    (``aprompt`` when ``inner`` is a coroutine function)."""
    if inspect.iscoroutinefunction(inner):

        async def aseam(self: BaseLLM, *args: Any, **kwargs: Any) -> Any:
            if args and isinstance(args[0], str):
                args = (await aprompt(self, args[0]), *args[1:])
            elif isinstance(kwargs.get("prompt"), str):
                kwargs["prompt"] = await aprompt(self, kwargs["prompt"])
            return await inner(self, *args, **kwargs)

        return _spanned(cls, inner, aseam, _PROMPT_MARK)

    def seam(self: BaseLLM, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], str):
            args = (prompt(self, args[0]), *args[1:])
        elif isinstance(kwargs.get("prompt"), str):
            kwargs["prompt"] = prompt(self, kwargs["prompt"])
        return inner(self, *args, **kwargs)

    return _spanned(cls, inner, seam, _PROMPT_MARK)


def _span_inner(current: Any) -> Callable[..., Any] | None:
    """The function a span LlamaIndex opens wraps (``None``: ``current`` is not such a span,
    e.g. a plain function, which the span handler never sees)."""
    inner = getattr(current, "__wrapped__", None)
    if type(current) is FunctionType or not getattr(current, _SPAN_MARK, False):
        return None
    return inner if callable(inner) else None


class Seams:
    """The async chat seams and the completion seams of one install: every LLM class
    present, and those created later."""

    def __init__(
        self, ledger: PatchLedger, before: Before, prompt: Prompt, aprompt: APrompt
    ) -> None:
        self._ledger = ledger
        self._before = before
        self._prompt = prompt
        self._aprompt = aprompt
        self._lock = threading.Lock()

    def install(self) -> None:
        """Seam every LLM class there is, and every one created from now on."""
        self._ledger.for_subclasses(BaseLLM, self.add)

    def add(self, cls: type) -> None:
        """Seam the async chat methods and the completion methods ``cls`` defines itself (a
        class that injects itself, :func:`ce.llamaindex.wrap`'s, is left alone). Never
        raises: a chat method that cannot be seamed keeps the span handler's inline
        injection, a completion method its prompt as it is (logged)."""
        if getattr(cls, "ce_injects", False):
            return
        with self._lock:
            for method in sorted(ASYNC_CHAT_METHODS | COMPLETION_METHODS):
                current = vars(cls).get(method)
                mark = _MARK if method in ASYNC_CHAT_METHODS else _PROMPT_MARK
                if current is None or getattr(current, mark, False):
                    continue
                inner = _span_inner(current)
                if inner is None:
                    continue  # not a span LlamaIndex opens: the span handler never sees it
                try:
                    if method in COMPLETION_METHODS:
                        new = _prompt_seam(cls, inner, self._prompt, self._aprompt)
                    elif inspect.iscoroutinefunction(inner):
                        new = _seam(cls, inner, self._before)
                    else:
                        continue
                    self._ledger.replace(cls, method, new)
                except Exception:  # an odd class (read-only attributes, a metaclass veto)
                    logger.warning("cannot seam %s.%s", cls.__qualname__, method, exc_info=True)


def _read(
    stream: Generator[Any, Any, Any], var: ContextVar[str | None], span_id: str
) -> Generator[Any, None, None]:
    """``stream``, each step of it run with ``var`` set to ``span_id``."""
    try:
        while True:
            token = var.set(span_id)
            try:
                item = next(stream)
            except StopIteration:
                return
            finally:
                var.reset(token)
            yield item
    finally:
        stream.close()


async def _aread(
    stream: AsyncGenerator[Any, Any], var: ContextVar[str | None], span_id: str
) -> AsyncGenerator[Any, None]:
    """The async twin of :func:`_read`."""
    try:
        while True:
            token = var.set(span_id)
            try:
                item = await stream.__anext__()
            except StopAsyncIteration:
                return
            finally:
                var.reset(token)
            yield item
    finally:
        await stream.aclose()


def _reader(inner: Callable[..., Any], var: ContextVar[str | None]) -> Any:
    """``inner`` (a streaming method) returning its stream read with ``var`` set to the id of the
    span it runs in (:func:`_read`); any other result as it is."""
    if inspect.iscoroutinefunction(inner):

        async def aread(self: BaseLLM, *args: Any, **kwargs: Any) -> Any:
            span_id = active_span_id.get()
            result = await inner(self, *args, **kwargs)
            if span_id is None or not isinstance(result, AsyncGenerator):
                return result
            return _aread(result, var, span_id)

        return aread

    def read(self: BaseLLM, *args: Any, **kwargs: Any) -> Any:
        span_id = active_span_id.get()
        result = inner(self, *args, **kwargs)
        if span_id is None or not isinstance(result, Generator):
            return result
        return _read(result, var, span_id)

    return read


def mark_reads(
    ledger: PatchLedger, cls: type, var: ContextVar[str | None], methods: tuple[str, ...]
) -> None:
    """Make those of ``methods`` (:data:`STRUCTURED_READS`, :data:`PREDICT_READS`) ``cls``
    defines itself return their stream read with ``var`` set to the method's span id (the
    read seam, see the module's docstring); an async seam already there stays inside (the call
    still awaits the engine there). Never raises: a method that cannot be wrapped is logged
    and left as it is."""
    for method in methods:
        current = vars(cls).get(method)
        inner = _span_inner(current)
        if inner is None or getattr(current, _READ_MARK, False):
            continue
        try:
            reader = _reader(inner, var)
            if getattr(current, _MARK, False):
                setattr(reader, _MARK, True)  # seamed(): the engine is awaited inside
            ledger.replace(cls, method, _spanned(cls, inner, reader, _READ_MARK))
        except Exception:  # an odd class (read-only attributes, a metaclass veto)
            logger.warning("cannot mark reads of %s.%s", cls.__qualname__, method, exc_info=True)
