"""Engine -> AutoGen: the messages a model call sends instead of its own.

The seam is a delegating ``ChatCompletionClient`` (:class:`EngineClient`): it sees the final
list of every model call an ``AssistantAgent`` makes (its system message, which AutoGen
prepends outside the model context, the memory messages, the tools), on every call of the tool
loop and of the reflection, streamed or not. The plugin hands it to AutoGen's own model-call
code in place of the agent's client for that one call (see ``_patch``), so the agent keeps its
own client: ``dump_component()``, ``save_state()`` and ``load_state()`` are unchanged.

Before the call, :func:`prepare` awaits the engine on the caller's loop (no blocking bridge)
through the kit (:func:`ce.core.integration.prepare_openai`): the agent's messages from its
own view in, the engine's input back in AutoGen's types (``_convert``). Fail-open, never
unredacted: when the engine fails the kit returns the agent's own messages redacted; when the
conversion itself fails, the agent's messages go through the configured redactor here. After
the call the reply, its usage (streaming: the final chunk's, which OpenAI clients are asked to
send with ``include_usage``) and its latency are recorded in the call's session.

:class:`RecordingClient` is the same delegation without injection, for the speaker-selection
prompt of a ``SelectorGroupChat``: its reply is parsed for an agent's name, so it is recorded
(usage and output) and never rewritten, only redacted (it quotes the conversation).
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncGenerator, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from autogen_core.models import AssistantMessage, ChatCompletionClient, CreateResult, LLMMessage

from ce.autogen._clients import bypassing
from ce.autogen._convert import (
    AuthorLookup,
    Pending,
    author_of,
    from_sent,
    handed_key,
    opaque,
    part_of,
    redacted_natively,
    reply_text,
    reply_to_message,
    stored_reply,
    to_openai,
    to_pending,
    tool_schemas,
)
from ce.autogen._record import HANDED, model_call, write
from ce.core.integration import (
    RUN_SESSION_PREFIX,
    fail_open,
    guarded,
    is_suppressed,
    prepare_openai,
)
from ce.core.schema import Message, ModelUsageStage, Role
from ce.core.stores import SliceStore

if TYPE_CHECKING:
    from ce.autogen._record import Book
    from ce.autogen._scopes import Frame
    from ce.core.integration import Plugin

__all__ = ["CallSite", "EngineClient", "RecordingClient", "prepare"]


@dataclass(frozen=True)
class CallSite:
    """One agent's model call: the plugin, the run it belongs to, the agent; ``inject``
    false: the engine records the call's messages, the model gets the agent's own."""

    plugin: Plugin
    book: Book
    frame: Frame
    agent: str
    inject: bool = True

    @property
    def session_id(self) -> str:
        return self.frame.session_id


async def prepare(
    site: CallSite, messages: Sequence[LLMMessage], tools: Sequence[Any]
) -> list[LLMMessage] | None:
    """The messages the model receives instead of ``messages``: the engine's input for the
    call's session from the agent's view, or on failure the agent's own redacted (``None``:
    send them as they are). Raises the error with ``plugin.fail_closed``.

    A history the agent continues (its model context grows call after call) is converted
    only for its new messages: ``plugin.histories`` keeps each agent's view of a session
    (its previous call's messages, converted, each written by its author)."""
    plugin, session_id = site.plugin, site.session_id
    peers = site.frame.peers

    def redact() -> list[LLMMessage] | None:
        return redacted_natively(plugin.engine.redactor_for(plugin.config), messages)

    view = _view(site.agent, tuple(sorted(peers)))
    try:
        pending = to_pending(messages, site.agent, peers, site.book.memory_texts())
        if pending.handed:
            await _find_handed(site, pending)
        key = _view_key(site)
        history = plugin.histories.convert(
            key, pending.units, view, opaque, lambda unit: author_of(unit, site.agent, peers)
        )
        if history is None:
            pending.convert(view(pending.units))
        else:
            pending.continued(history)
        schemas = tool_schemas(tools)
        if peers:
            _note_authors(site, pending)
    except Exception as exc:
        return await fail_open(plugin, session_id, "convert messages", exc, redact)
    authors = None if pending.history is not None else pending.authors  # the history's own
    sent = await prepare_openai(
        plugin, session_id, pending.dicts, schemas, authors, history=pending.history
    )
    if sent is None:
        return None
    lookup = await _lookup(site, sent) if peers else None
    try:
        own_only = site.agent in site.frame.filtered
        return from_sent(sent, messages, pending, site.agent, peers, lookup, own_only)
    except Exception as exc:
        return await fail_open(plugin, session_id, "convert messages", exc, redact)


@functools.lru_cache(maxsize=256)
def _view(agent: str, peers: tuple[str, ...]) -> Callable[[Sequence[Any]], list[dict[str, Any]]]:
    """The conversion of units from ``agent``'s view among ``peers``: one function per view,
    so ``plugin.histories`` knows a unit converted before from that view."""

    def view(units: Sequence[Any]) -> list[dict[str, Any]]:
        return to_openai(units, agent, peers)

    return view


def _view_key(site: CallSite) -> str:
    """What ``plugin.histories`` keeps a call's history under: its session as its agent
    sees it (the agents of a team each pass their own messages, a peer's reply as a user
    message)."""
    return "\x1f".join((site.session_id, site.agent, *sorted(site.frame.peers)))


_TAIL_MARGIN = 32  # messages read beyond the engine's input (tool results, left-out calls)


async def _lookup(site: CallSite, sent: Sequence[Mapping[str, Any]]) -> AuthorLookup:
    """The authors of the assistant messages of the engine's input ``sent`` for a team
    agent's call. When the book does not know one (written by another process, or before
    this one started: a team resumed with ``load_state``), the authors the session stores
    are read into the book from its newest part, as many messages as ``sent`` holds and a
    few more (``sent`` is the newest part of the session, and what this process wrote the
    book knows); again whenever another process wrote one since. A run's own new session is
    never read; a message the session stores without an agent author is read for once."""
    book, session_id = site.book, site.session_id
    lookup = AuthorLookup(*book.authors(session_id))
    if session_id.startswith(RUN_SESSION_PREFIX):  # a run's own (or nested in one): all new
        return lookup
    if not lookup.unexplained(sent) - book.unattributed(session_id):
        return lookup

    async def read() -> None:
        book.note_stored(session_id, await _newest(site, len(sent) + _TAIL_MARGIN))

    await guarded(site.plugin, read, session_id=session_id, what="read the session's authors")
    lookup = AuthorLookup(*book.authors(session_id))
    book.note_unattributed(session_id, lookup.unexplained(sent))
    return lookup


async def _newest(site: CallSite, count: int) -> list[Message]:
    """The newest ``count`` messages of the call's session (all of them on a store that
    cannot read a tail)."""
    engine = site.plugin.engine
    store = engine.store
    if isinstance(store, SliceStore):
        tail = await store.read_tail(site.session_id, messages=count, evidences=0)
        return tail.changes.messages if tail is not None else []
    return (await engine.get_session(site.session_id)).session.messages


async def _find_handed(site: CallSite, pending: Pending) -> None:
    """Note the replies of the parts of peers' replies a handoff passed on to the agent
    that :data:`~ce.autogen._record.HANDED` does not know (noted by another process, or
    before this one started: a team resumed with ``load_state``): read from the session's
    newest messages, as many as the agent's list holds and a few more, once per part and
    session (a reply the session does not hold is not read for again). A run's own new
    session is never read."""
    book, session_id = site.book, site.session_id
    if session_id.startswith(RUN_SESSION_PREFIX):
        return
    unknown: dict[tuple[str, Hashable], AssistantMessage] = {}
    for j in pending.handed:
        unit = cast(AssistantMessage, pending.units[j])
        part = (unit.source, handed_key(unit))
        if HANDED.reply(*part) is None and not book.sought(session_id, part):
            unknown[part] = unit
    if not unknown:
        return
    book.note_sought(session_id, unknown)

    async def read() -> None:
        for message in await _newest(site, len(pending.units) + _TAIL_MARGIN):
            if message.role is not Role.ASSISTANT or not message.tool_calls:
                continue
            reply = stored_reply(message)
            for (source, key), unit in unknown.items():
                if source == reply.source and part_of(unit, reply):
                    HANDED.note(source, key, to_openai([reply])[0])

    await guarded(site.plugin, read, session_id=session_id, what="read the handed replies")


def _note_authors(site: CallSite, pending: Any) -> None:
    """Note the authors the book does not know yet in this session of the call's messages:
    of each tool call (the agent's own, or a peer's a handoff passed on) and of each peer
    message (a reply from another process, a message of an agent the plugin does not act
    on, a message an earlier run in another session carried over: as written and as the
    session stores it; one its author emitted in an earlier run as emitted, see
    :meth:`~ce.autogen._record.Book.note_emitted`)."""
    book, session_id = site.book, site.session_id
    redactor: Any = None
    for entry, author in zip(pending.dicts, pending.authors, strict=True):
        if entry.get("role") != "assistant" or author is None:
            continue
        calls = [str(c.get("id") or "") for c in entry.get("tool_calls") or ()]
        if calls:
            unknown = [c for c in calls if not book.knows_call(session_id, c)]
            if unknown:
                book.note_reply(session_id, author.id, (), unknown)
            continue
        text = entry.get("content")
        if (
            author.id == site.agent
            or not isinstance(text, str)
            or not text
            or book.knows(session_id, text)
        ):
            continue
        if redactor is None:
            redactor = site.plugin.engine.redactor_for(site.plugin.config) or False
        texts = [text]
        if redactor:
            texts.append(redactor.redact_text(text).redacted_text)
        if book.emitted_before(author.id, text):  # in an earlier run's session
            book.note_emitted(session_id, author.id, texts)
        else:
            book.note_reply(session_id, author.id, texts, ())


def _usage_args(inner: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` of a streamed call of ``inner``, asking an OpenAI client for the usage
    chunk (``stream_options.include_usage``) unless the app set stream options itself."""
    try:
        from autogen_ext.models.openai import (  # type: ignore[import-not-found,unused-ignore]
            BaseOpenAIChatCompletionClient,
        )
    except ImportError:  # autogen-ext (or its openai extra) is not installed
        return kwargs
    if not isinstance(inner, BaseOpenAIChatCompletionClient):
        return kwargs
    extra = dict(kwargs.get("extra_create_args") or {})
    own = getattr(inner, "_create_args", None)
    if "stream_options" in extra or (isinstance(own, Mapping) and "stream_options" in own):
        return kwargs
    if kwargs.get("include_usage") is not None:
        return kwargs
    extra["stream_options"] = {"include_usage": True}
    return {**kwargs, "extra_create_args": extra}


async def _chain(head: list[Any], rest: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
    for item in head:
        yield item
    async for item in rest:
        yield item


class _Delegating(ChatCompletionClient):
    """A ``ChatCompletionClient`` that delegates everything to ``inner``."""

    asks_usage = False
    """Whether a streamed call asks an OpenAI client for the usage chunk."""
    ce_delegating = True
    """The client seams leave the plugin's own clients alone (see ``_clients``)."""

    def __init__(self, inner: ChatCompletionClient) -> None:
        self._inner = inner

    @property
    def inner(self) -> ChatCompletionClient:
        """The client the calls go to."""
        return self._inner

    async def close(self) -> None:
        await self._inner.close()

    def actual_usage(self) -> Any:
        return self._inner.actual_usage()

    def total_usage(self) -> Any:
        return self._inner.total_usage()

    def count_tokens(self, messages: Sequence[LLMMessage], **kwargs: Any) -> int:
        return self._inner.count_tokens(messages, **kwargs)

    def remaining_tokens(self, messages: Sequence[LLMMessage], **kwargs: Any) -> int:
        return self._inner.remaining_tokens(messages, **kwargs)

    @property
    def capabilities(self) -> Any:
        return self._inner.capabilities  # deprecated in AutoGen, still abstract

    @property
    def model_info(self) -> Any:
        return self._inner.model_info

    def dump_component(self) -> Any:
        """The wrapped client's component: the wrapper never shows in a dumped config."""
        return self._inner.dump_component()

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)

    # -- to override ------------------------------------------------------------------------

    async def _before(self, messages: Sequence[LLMMessage], kwargs: dict[str, Any]) -> Any:
        return messages

    async def _after(
        self,
        result: CreateResult | None,
        started: float,
        first_token: float | None,
        error: BaseException | None,
    ) -> None:
        return None

    # -- the calls --------------------------------------------------------------------------

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:
        if is_suppressed():
            return await self._inner.create(messages, **kwargs)
        sent = await self._before(messages, kwargs)
        started = time.perf_counter()
        try:
            with bypassing(self._inner):
                result = await self._inner.create(sent, **kwargs)
        except Exception as exc:
            await self._after(None, started, None, exc)
            raise
        await self._after(result, started, None, None)
        return result

    async def create_stream(
        self, messages: Sequence[LLMMessage], **kwargs: Any
    ) -> AsyncGenerator[str | CreateResult, None]:
        if is_suppressed():
            async for chunk in self._inner.create_stream(messages, **kwargs):
                yield chunk
            return
        sent = await self._before(messages, kwargs)
        if self.asks_usage:
            kwargs = _usage_args(self._inner, kwargs)
        started = time.perf_counter()
        first: float | None = None
        result: CreateResult | None = None
        try:
            stream = self._inner.create_stream(sent, **kwargs)
            with bypassing(self._inner):  # the stream's first step is where it looks
                head = [await stream.__anext__()]
            first = time.perf_counter()
            async for chunk in _chain(head, stream):
                if isinstance(chunk, CreateResult):
                    result = chunk
                yield chunk
        except StopAsyncIteration:  # a stream with no chunk at all
            pass
        except Exception as exc:
            await self._after(None, started, first, exc)
            raise
        await self._after(result, started, first, None)


class EngineClient(_Delegating):
    """``inner`` for one model call of an agent: the call sends the engine's input and its
    reply, usage and latency are recorded (see the module docstring)."""

    asks_usage = True

    def __init__(self, inner: ChatCompletionClient, site: CallSite) -> None:
        super().__init__(inner)
        self._site = site

    async def _before(self, messages: Sequence[LLMMessage], kwargs: dict[str, Any]) -> Any:
        sent = await prepare(self._site, messages, kwargs.get("tools") or ())
        return messages if sent is None or not self._site.inject else sent

    async def _after(
        self,
        result: CreateResult | None,
        started: float,
        first_token: float | None,
        error: BaseException | None,
    ) -> None:
        site = self._site
        text = reply_text(result) if result is not None else ""
        call = model_call(self._inner, result, started, first_token, text, error=error)
        reply = None
        if result is not None:
            reply = reply_to_message(result, site.agent, call.provider, call.model)
            if site.frame.peers:
                self._note(reply, text)
        await write(
            site.plugin,
            site.session_id,
            "record model call",
            lambda r: r.record_model_call(call, reply),
        )

    def _note(self, reply: Any, text: str) -> None:
        """Remember the reply's author for the other agents of the team (by its text as
        written and as the session stores it, and by its tool call ids)."""
        site = self._site
        texts = [text]
        redactor = site.plugin.engine.redactor_for(site.plugin.config)
        if redactor is not None and text:
            texts.append(redactor.redact_text(text).redacted_text)
        calls = [c.tool_call_id for c in reply.tool_calls or ()]
        site.book.note_reply(site.session_id, site.agent, texts, calls)


class RecordingClient(_Delegating):
    """``inner`` for one speaker selection: its prompt (which quotes the conversation) goes
    as AutoGen wrote it, only passed through the configured redactor (the names it is parsed
    for are kept; a streamed request is not asked for a usage chunk either); the call's usage
    (when the provider sends it) and output are recorded in ``session_id`` (stage ``route``),
    no message is."""

    def __init__(self, inner: ChatCompletionClient, plugin: Plugin, session_id: str) -> None:
        super().__init__(inner)
        self._plugin = plugin
        self._session_id = session_id

    async def _before(self, messages: Sequence[LLMMessage], kwargs: dict[str, Any]) -> Any:
        plugin = self._plugin

        def redact() -> list[LLMMessage] | None:
            return redacted_natively(plugin.engine.redactor_for(plugin.config), messages)

        try:
            redacted = redact()
        except Exception as exc:  # redaction failed: reported, then as fail_open says
            redacted = await fail_open(plugin, self._session_id, "redact", exc, redact)
        return messages if redacted is None else redacted

    async def _after(
        self,
        result: CreateResult | None,
        started: float,
        first_token: float | None,
        error: BaseException | None,
    ) -> None:
        text = reply_text(result) if result is not None else ""
        call = model_call(
            self._inner, result, started, first_token, text, ModelUsageStage.ROUTE, error
        )
        await write(
            self._plugin, self._session_id, "record model call", lambda r: r.record_model_call(call)
        )
