"""Engine -> Haystack: the messages each chat-generator call sends instead of its own.

Why this seam: a chat generator's ``run`` / ``run_async`` is the one place every model call
of Haystack goes through, in a Pipeline (``instance.run(**inputs)``), in an Agent's loop
(``self.chat_generator.run(...)`` each step, sync and async) and called on its own. The
Agent's ``before_llm`` hook would see the Agent's calls only, and its rewrite persists in the
Agent's ``State`` (and in the messages the Agent returns); a tracer cannot rewrite anything
(component inputs are deep-copied before tracing). The wrapper replaces the call's
``messages`` argument only: the Pipeline's data and the Agent's ``State`` keep the app's own
messages. It keeps ``run``'s signature (``functools.wraps``: the Agent inspects it for
``tools``, a component's sockets are read from it) and the streaming callback (wrapped only
to time the first token). A ``str`` given as ``messages`` is one user message, as Haystack
reads it.

Each call hands the engine the messages (awaited on the caller's loop in ``run_async``,
through :func:`ce.core.integration.prepare_openai`; blocking in ``run``, through
:func:`~ce.core.integration.prepare_openai_sync`) and the call's tool schemas, and sends the
engine's input. Documents the run passes on (what its retrievers returned, less what a
ranker or filter dropped) are recorded then as the session's ``rag_doc`` evidence, rendered
by the engine fenced with their evidence id; where the app's prompt inlines one of them (a
``ChatPromptBuilder`` template), the inline copy is replaced by a pointer to that evidence,
so the model receives each document once. Earlier turns of the session a prompt builder
rendered into the prompt as text are replaced by a pointer too (see ``_rendered``): they go
once, as the session's messages. A history the app
continues (an Agent's loop passes its growing message list again each step) is converted only
for its new messages (``plugin.histories``). After the call the reply, its usage
(``meta["usage"]``; streamed Chat Completions calls ask for it with
``stream_options.include_usage`` unless the app set ``stream_options``) and its latency are
recorded.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ce.core.integration import (
    ModelCall,
    Recorder,
    RunConversations,
    error_text,
    fail_open,
    fail_open_sync,
    guarded,
    guarded_sync,
    peer_turns_as_user,
    prepare_openai,
    prepare_openai_sync,
    provider_of,
    record_awaited,
    redact_openai,
)
from ce.core.pipeline import document_pointer, quotes_document
from ce.haystack._convert import (
    Pending,
    agent_author,
    as_messages,
    from_sent,
    is_readable,
    normalise_usage,
    opaque,
    prompt_text,
    reply_text,
    reply_to_message,
    to_openai,
    to_pending,
    tool_schemas,
    turn_key,
    with_prompt_text,
)
from ce.haystack._record import write
from ce.haystack._rendered import HeldReplies, without_rendered_turns
from ce.haystack._scopes import (
    RunFrame,
    bound,
    hit_key,
    hook_run,
    in_call,
    in_component_work,
    in_hook,
    open_run,
    run_frame,
    tool_frame,
)

if TYPE_CHECKING:
    from ce.core.integration import History, Plugin, RetrievalHit
    from ce.core.schema import Author, Evidence

__all__ = ["Seam", "inline_evidence"]


def inline_evidence(
    dicts: Sequence[Mapping[str, Any]], documents: Sequence[tuple[str, str]]
) -> list[dict[str, Any]]:
    """``dicts`` with every inline copy of a document (``(content, evidence id)``) in a
    system or user message's text replaced by a pointer to its evidence (its pictures and
    files kept)."""
    out: list[dict[str, Any]] = []
    for entry in dicts:
        content = prompt_text(entry)
        if content is not None:
            text = content
            for document, evidence_id in documents:
                if quotes_document(text, document):
                    text = text.replace(document, document_pointer(evidence_id))
            if text != content:
                entry = with_prompt_text(entry, text)
        out.append(dict(entry))
    return out


def _pending(plugin: Plugin, session_id: str, messages: Sequence[Any]) -> Pending:
    """The call's messages as the engine reads them: through the session's history (only
    the messages after the previous call's very objects are converted), else converted for
    this call alone (see :func:`~ce.haystack._convert.to_pending`)."""
    kept = plugin.histories.kept(session_id, messages, is_readable)
    history = plugin.histories.convert(session_id, kept, to_openai, opaque)
    if history is None:
        return to_pending(messages)
    return Pending(history.pending, kept, history)


def _quoted_once(
    pending: Pending,
    documents: Sequence[tuple[str, str]],
    turns: Callable[[Sequence[Mapping[str, Any]]], list[Mapping[str, Any]]] | None = None,
) -> tuple[Sequence[Mapping[str, Any]], History | None]:
    """The dicts handed to the engine (earlier turns rendered into the prompt replaced by
    ``turns``, see :func:`~ce.haystack._rendered.without_rendered_turns`; inline documents
    replaced, see :func:`inline_evidence`; the pending dicts themselves when there is
    neither: they are read, never changed) and the history whose neutral messages stand for
    them (None when some text was replaced: the engine then converts the dicts it is
    given)."""
    if not documents and turns is None:
        return pending.dicts, pending.history
    dicts: Sequence[Mapping[str, Any]] = pending.dicts
    if turns is not None:
        dicts = turns(dicts)
    if documents:
        dicts = inline_evidence(dicts, documents)
    same = all(
        new.get("content") is old.get("content")
        for new, old in zip(dicts, pending.dicts, strict=True)
    )
    return dicts, pending.history if same else None


class _Timer:
    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.first: float | None = None

    def mark(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()


class AgentPrompts:
    """The system prompt each Agent put first in its model calls (the newest
    ``held`` prompts), to tell another Agent's prompt among a call's messages: an Agent whose
    ``messages`` input is connected to another Agent's ``messages`` output gets that Agent's
    conversation, its system prompt included, right after its own prompt (a chain of Agents:
    each one's prompt, in the leading system messages)."""

    def __init__(self, held: int = 1024) -> None:
        self._agents: OrderedDict[str, str] = OrderedDict()
        self._held = held
        self._lock = threading.Lock()

    def own_instruction(self, frame: RunFrame, messages: list[Any]) -> list[Any]:
        """The messages of a model call of ``frame``'s Agent without the system prompts of
        other Agents: its instruction is its own (the first message, which the Agent put
        there), never the prompt of the Agent whose output it continues. ``messages``
        itself when there is none to leave out, or the Agent has no prompt of its own. Reads
        the leading system messages only: a call costs the same however long its history."""
        if not frame.agent or not frame.prompted or not messages:
            return messages
        first = messages[0]
        if not first.is_from("system"):
            return messages
        agent, others = frame.agent, []
        with self._lock:
            self._agents[first.text or ""] = agent
            self._agents.move_to_end(first.text or "")
            while len(self._agents) > self._held:
                self._agents.popitem(last=False)
            for i in range(1, len(messages)):
                message = messages[i]
                if not message.is_from("system"):
                    break
                owner = self._agents.get(message.text or "")
                if owner is not None and owner != agent:
                    others.append(i)
        if not others:
            return messages
        left_out = set(others)
        return [m for i, m in enumerate(messages) if i not in left_out]


def asked_once(frame: RunFrame, messages: list[Any]) -> tuple[list[Any], str | None]:
    """The messages of a model call of ``frame``'s Agent with the user message that closes
    them left out when another Agent of the run was asked it first (the run's input handed to
    each of its Agents): the session holds it, where it was asked, and the call gets it from
    there, not asked again after the other Agents' turns. Also the text of that message for
    :attr:`RunFrame.asked` once the engine prepared the call, None when it is not to be noted
    (no Agent, no closing user message, or left out)."""
    if not frame.agent or not messages or not messages[-1].is_from("user"):
        return messages, None
    question = messages[-1].text or ""
    if frame.asked.get(question, frame.agent) == frame.agent:
        return messages, question
    return messages[:-1], None


class Seam:
    """The per-call hook of one install: what a wrapped ``run`` / ``run_async`` does."""

    def __init__(self, plugin: Plugin, inject: bool, active: Callable[[], bool]) -> None:
        self.plugin = plugin
        self.inject = inject
        self.active = active
        self.prompts = AgentPrompts()
        self.conversations = RunConversations()
        self.replies = HeldReplies()

    # -- the wrappers ----------------------------------------------------------------------

    def wrap_run(self, original: Callable[..., Any], instance: Any = None) -> Callable[..., Any]:
        """A generator class's ``run`` (``instance=None``) or one instance's bound ``run``,
        sending the engine's input; same signature."""
        seam, signature = self, inspect.signature(original)
        if instance is None:

            @functools.wraps(original)
            def run(self: Any, *args: Any, **kwargs: Any) -> Any:
                return seam.call(self, original, signature, (self, *args), kwargs)

        else:

            @functools.wraps(original)
            def run(*args: Any, **kwargs: Any) -> Any:
                return seam.call(instance, original, signature, args, kwargs)

        run.ce_wrapped = True  # type: ignore[attr-defined]
        return run

    def wrap_run_async(
        self, original: Callable[..., Any], instance: Any = None
    ) -> Callable[..., Any]:
        """The coroutine twin of :meth:`wrap_run` for ``run_async``."""
        seam, signature = self, inspect.signature(original)
        if instance is None:

            @functools.wraps(original)
            async def run_async(self: Any, *args: Any, **kwargs: Any) -> Any:
                return await seam.acall(self, original, signature, (self, *args), kwargs)

        else:

            @functools.wraps(original)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                return await seam.acall(instance, original, signature, args, kwargs)

        run_async.ce_wrapped = True  # type: ignore[attr-defined]
        return run_async

    # -- one call --------------------------------------------------------------------------

    def _begin(
        self, generator: Any, signature: inspect.Signature, args: Any, kwargs: Any
    ) -> tuple[inspect.BoundArguments, RunFrame] | None:
        if not self.active() or in_call.get():
            return None
        try:
            arguments = signature.bind(*args, **kwargs)
        except TypeError:  # the generator will say what is wrong
            return None
        if "messages" not in arguments.arguments:
            return None
        frame, tool, hook = run_frame.get(), tool_frame.get(), in_hook.get()
        work = in_component_work.get()
        if frame is None or (tool is not None and tool.scope == frame.scope):
            # on its own, or inside a tool of the run (an LLM-backed tool): a run of its own
            frame = open_run(self.plugin)
        elif hook is not None:  # an Agent's hook summarising its messages, say
            frame = hook_run(self.plugin, frame, hook)
        elif work is not None:  # a router's, a ranker's own call: not the conversation's
            frame = hook_run(self.plugin, frame, work)
        # in a run that names no session, a call continuing none of its earlier calls (a
        # query rewriter's, then the answer's) is a conversation of its own
        messages = as_messages(arguments.arguments["messages"])
        scope = self.conversations.place(frame.scope, messages, turn_key, uuid.uuid4().hex[:12])
        if scope is not frame.scope:
            frame = dataclasses.replace(frame, scope=scope)
        return arguments, frame

    def call(
        self,
        generator: Any,
        original: Callable[..., Any],
        signature: inspect.Signature,
        args: Any,
        kwargs: Any,
    ) -> Any:
        begun = self._begin(generator, signature, args, kwargs)
        if begun is None:
            return original(*args, **kwargs)
        arguments, frame = begun
        self._prepare_sync(generator, frame, arguments)
        timer = self._stream(generator, signature, arguments)
        with bound(in_call, True):
            try:
                result = original(*arguments.args, **arguments.kwargs)
            except Exception as exc:
                work = self._recording(generator, frame, None, timer, exc)
                write(self.plugin, frame.scope.session_id, "record model call", work, True)
                raise
        work = self._recording(generator, frame, result, timer, None)
        write(self.plugin, frame.scope.session_id, "record model call", work, True)
        return result

    async def acall(
        self,
        generator: Any,
        original: Callable[..., Any],
        signature: inspect.Signature,
        args: Any,
        kwargs: Any,
    ) -> Any:
        begun = self._begin(generator, signature, args, kwargs)
        if begun is None:
            return await original(*args, **kwargs)
        arguments, frame = begun
        await self._prepare(generator, frame, arguments)
        timer = self._stream(generator, signature, arguments)
        with bound(in_call, True):
            try:
                result = await original(*arguments.args, **arguments.kwargs)
            except Exception as exc:
                work = self._recording(generator, frame, None, timer, exc)
                await record_awaited(self.plugin, frame.scope.session_id, "record model call", work)
                raise
        work = self._recording(generator, frame, result, timer, None)
        await record_awaited(self.plugin, frame.scope.session_id, "record model call", work)
        return result

    # -- before ----------------------------------------------------------------------------

    def _redactor(self, messages: list[Any]) -> Callable[[], list[Any] | None]:
        plugin = self.plugin

        def redact() -> list[Any] | None:
            redactor = plugin.engine.redactor_for(plugin.config)
            if redactor is None:
                return None
            pending = to_pending(messages)
            return from_sent(redact_openai(pending.dicts, redactor), pending)

        return redact

    def _authors(self, pending: Pending, frame: RunFrame) -> list[Author | None] | None:
        if not frame.agent:
            return None
        author = agent_author(frame.agent)
        return [author if d.get("role") == "assistant" else None for d in pending.dicts]

    def _turns(
        self, frame: RunFrame
    ) -> Callable[[Sequence[Mapping[str, Any]]], list[Mapping[str, Any]]] | None:
        """How a call of ``frame`` leaves out the earlier turns its prompt builders rendered
        as text that the session holds (see ``_rendered``); None when there are none, or the
        engine does not send the session's turns (``mode="augment"`` sends the app's own
        messages, whose prompt is then the only copy)."""
        if not self._renders_turns(frame):
            return None
        conversations = list(frame.rendered)
        holds = self.replies.holder(frame.scope.session_id)
        return lambda dicts: without_rendered_turns(dicts, conversations, holds)

    def _renders_turns(self, frame: RunFrame) -> bool:
        return bool(frame.rendered) and self.plugin.mode == "replace"

    def _unknown_replies(self, frame: RunFrame) -> list[str]:
        """The replies the conversations ``frame``'s prompt builders rendered hold that the
        plugin knows nothing of for the session (another worker recorded them, or they are
        older than the session): the engine is asked about them once."""
        if not self._renders_turns(frame):
            return []
        return self.replies.unknown(frame.scope.session_id, frame.rendered)

    def _note_held_sync(self, frame: RunFrame) -> None:
        """Note which replies of :meth:`_unknown_replies` the session holds."""
        unknown, session_id = self._unknown_replies(frame), frame.scope.session_id
        if unknown:
            engine = self.plugin.engine
            held = guarded_sync(
                self.plugin,
                lambda: engine.sync.replies_held(session_id, unknown),
                session_id=session_id,
                what="look up the replies a prompt renders",
            )
            if held is not None:
                self.replies.settle(session_id, unknown, held)

    async def _note_held(self, frame: RunFrame) -> None:
        """:meth:`_note_held_sync`, awaited."""
        unknown, session_id = self._unknown_replies(frame), frame.scope.session_id
        if unknown:
            held = await guarded(
                self.plugin,
                lambda: self.plugin.engine.replies_held(session_id, unknown),
                session_id=session_id,
                what="look up the replies a prompt renders",
            )
            if held is not None:
                self.replies.settle(session_id, unknown, held)

    def _prepare_sync(
        self, generator: Any, frame: RunFrame, arguments: inspect.BoundArguments
    ) -> None:
        plugin, session_id = self.plugin, frame.scope.session_id
        messages = self.prompts.own_instruction(frame, as_messages(arguments.arguments["messages"]))
        redact = self._redactor(messages)
        messages, question = asked_once(frame, messages)
        try:
            pending = _pending(plugin, session_id, messages)
            schemas = tool_schemas(arguments.arguments.get("tools"))
        except Exception as exc:
            own = fail_open_sync(plugin, session_id, "convert messages", exc, redact)
            if own is not None:
                arguments.arguments["messages"] = own
            return
        documents: list[tuple[str, str]] = []
        if frame.hits:
            hits = list(frame.hits)
            recorder = Recorder(plugin.engine, session_id)
            evidences = guarded_sync(
                plugin,
                lambda: plugin.engine.sync.run(recorder.record_retrieval(hits)),
                session_id=session_id,
                what="record retrieval",
            )
            documents = _documents(frame, hits, evidences)
        self._note_held_sync(frame)
        dicts, history = _quoted_once(pending, documents, self._turns(frame))
        sent = prepare_openai_sync(
            plugin,
            session_id,
            dicts,
            schemas,
            self._authors(pending, frame),
            history=history,
            rewind=True,
        )
        if sent is not None and question is not None:
            frame.asked.setdefault(question, frame.agent or "")
        self._send(
            generator,
            arguments,
            sent,
            pending,
            frame.agent,
            lambda exc: fail_open_sync(plugin, session_id, "convert messages", exc, redact),
        )

    async def _prepare(
        self, generator: Any, frame: RunFrame, arguments: inspect.BoundArguments
    ) -> None:
        plugin, session_id = self.plugin, frame.scope.session_id
        messages = self.prompts.own_instruction(frame, as_messages(arguments.arguments["messages"]))
        redact = self._redactor(messages)
        messages, question = asked_once(frame, messages)
        try:
            pending = _pending(plugin, session_id, messages)
            schemas = tool_schemas(arguments.arguments.get("tools"))
        except Exception as exc:
            own = await fail_open(plugin, session_id, "convert messages", exc, redact)
            if own is not None:
                arguments.arguments["messages"] = own
            return
        documents: list[tuple[str, str]] = []
        if frame.hits:
            hits = list(frame.hits)
            recorder = Recorder(plugin.engine, session_id)
            evidences = await guarded(
                plugin,
                lambda: recorder.record_retrieval(hits),
                session_id=session_id,
                what="record retrieval",
            )
            documents = _documents(frame, hits, evidences)
        await self._note_held(frame)
        dicts, history = _quoted_once(pending, documents, self._turns(frame))
        sent = await prepare_openai(
            plugin,
            session_id,
            dicts,
            schemas,
            self._authors(pending, frame),
            history=history,
            rewind=True,
        )
        if sent is not None and question is not None:
            frame.asked.setdefault(question, frame.agent or "")
        failed: list[Exception] = []
        self._send(generator, arguments, sent, pending, frame.agent, lambda exc: failed.append(exc))
        if failed:
            own = await fail_open(plugin, session_id, "convert messages", failed[0], redact)
            if own is not None:
                arguments.arguments["messages"] = own

    def _send(
        self,
        generator: Any,
        arguments: inspect.BoundArguments,
        sent: list[dict[str, Any]] | None,
        pending: Pending,
        agent: str | None,
        on_error: Callable[[Exception], Any],
    ) -> None:
        """Put the engine's input ``sent`` in the call's ``messages`` (nothing when it is
        ``None``: the app's own go, or with ``inject=False``). For an Agent's call, the turns
        another Agent of the session wrote go as that Agent's words (see
        :func:`~ce.core.integration.peer_turns_as_user`), never as the caller's own. A tool
        result the session supplies goes without its pictures and files to an OpenAI Chat
        Completions generator, which takes none in tool messages."""
        if sent is None or not self.inject:
            return
        try:
            if agent:
                sent = peer_turns_as_user(sent, agent)
            tool_media = not _chat_completions(generator)
            arguments.arguments["messages"] = from_sent(sent, pending, tool_media)
        except Exception as exc:
            own = on_error(exc)
            if isinstance(own, list):
                arguments.arguments["messages"] = own

    def _stream(
        self, generator: Any, signature: inspect.Signature, arguments: inspect.BoundArguments
    ) -> _Timer:
        """The call's timer; a streaming call's callback wrapped to mark the first token,
        and an OpenAI stream asked for its usage."""
        timer = _Timer()
        if "streaming_callback" not in signature.parameters:
            return timer
        values = arguments.arguments
        callback = values.get("streaming_callback") or getattr(
            generator, "streaming_callback", None
        )
        if callback is None:
            return timer
        if inspect.iscoroutinefunction(callback):

            async def timed_async(chunk: Any) -> Any:
                timer.mark()
                return await callback(chunk)

            values["streaming_callback"] = timed_async
        else:

            def timed(chunk: Any) -> Any:
                timer.mark()
                return callback(chunk)

            values["streaming_callback"] = timed
        if _chat_completions(generator) and "generation_kwargs" in signature.parameters:
            own = getattr(generator, "generation_kwargs", None) or {}
            given = values.get("generation_kwargs") or {}
            if "stream_options" not in own and "stream_options" not in given:
                values["generation_kwargs"] = {
                    **given,
                    "stream_options": {"include_usage": True},
                }
        return timer

    # -- after -----------------------------------------------------------------------------

    def _recording(
        self,
        generator: Any,
        frame: RunFrame,
        result: Any,
        timer: _Timer,
        error: BaseException | None,
    ) -> Callable[[Recorder], Any]:
        """How the finished (or failed) call is recorded: the reply (by the run's Agent),
        its ``llm_output`` evidence and its usage, in one engine write."""
        ended = time.perf_counter()
        replies = result.get("replies") if isinstance(result, Mapping) else None
        reply = replies[0] if replies else None
        meta = getattr(reply, "meta", None) or {}
        prompt, completion = normalise_usage(meta.get("usage"))
        provider = provider_of(generator)
        model = str(meta.get("model") or getattr(generator, "model", None) or "unknown")
        call = ModelCall(
            call_id=uuid.uuid4().hex,
            provider=provider,
            model=model,
            prompt_tokens=prompt,
            completion_tokens=completion,
            latency_ms=round((ended - timer.started) * 1000),
            first_token_latency_ms=(
                round((timer.first - timer.started) * 1000) if timer.first is not None else None
            ),
            output_text=reply_text(reply) if reply is not None else "",
            error=error_text(error) if error is not None else None,
        )
        message = (
            reply_to_message(reply, frame.agent, provider, model) if reply is not None else None
        )
        if reply is not None:  # the run's next call continues this one if it passes the reply
            self.conversations.replied(frame.scope.session_id, turn_key(reply))
            self.replies.add(frame.scope.session_id, reply.text or "")

        async def work(recorder: Recorder) -> None:
            await recorder.record_model_call(call, message)

        return work


def _chat_completions(generator: Any) -> bool:
    """Whether ``generator`` streams OpenAI Chat Completions (``OpenAIChatGenerator`` and its
    subclasses: Azure's, the OpenAI-compatible integrations), which send usage only when
    asked (the Responses API generators do not take ``stream_options``)."""
    from haystack.components.generators.chat import OpenAIChatGenerator

    return isinstance(generator, OpenAIChatGenerator)


def _documents(
    frame: RunFrame, hits: Sequence[RetrievalHit], evidences: Sequence[Evidence] | None
) -> list[tuple[str, str]]:
    """The ``(content, evidence id)`` of the run's documents just recorded (now counted as
    recorded on ``frame``); none when recording failed."""
    if not evidences:
        return []
    frame.recorded.update(map(hit_key, hits))
    return [
        (hit.content.strip(), evidence.evidence_id)
        for hit, evidence in zip(hits, evidences, strict=False)
    ]
