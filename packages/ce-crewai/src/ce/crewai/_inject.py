"""Engine -> CrewAI: the engine's assembled input instead of the executor's messages, at
``BaseLLM.call`` / ``acall`` of every provider class that defines them (those created after
``install()`` too).

Why a patch: CrewAI's global ``before_llm_call`` hooks are copied into each executor when it
is built and their edits persist in the executor's history, so the request is rewritten at
the provider's call instead: the model gets the engine's messages, the executor keeps its own.
The async path awaits the engine inside ``acall``; the sync path calls it from CrewAI's own
thread (in an ``akickoff``, whose agent steps run on worker threads, the engine is awaited on
the kickoff's loop while only the worker waits). A call of no agent (a direct ``LLM.call``)
writes under ``LLM.call``: it reads the agents' turns as theirs, they read its replies as its,
and it gets none of their system prompts.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ce.core.integration import (
    SentMessages,
    is_suppressed,
    peer_turns_as_user,
    prepare_openai,
    prepare_openai_sync,
    tool_chains_as_text,
)
from ce.crewai._convert import (
    DIRECT_CALL,
    authors_of,
    caller,
    context_divider,
    context_marker,
    final_answer,
    forced_final_answer,
    pending_messages,
    reply_tool_calls,
    tool_schemas,
)
from ce.crewai._scopes import Runs, Target, current_call, current_run, current_work, in_planning

if TYPE_CHECKING:
    from ce.core.integration import PatchLedger, Plugin

__all__ = ["AgentPrompts", "Injector", "said_once"]

SETTLE_SECONDS = 5.0
"""How long a model call waits at most for the event handlers of what came before it."""


def _events_pending() -> bool:
    """Whether CrewAI's event bus has handlers of emitted events still to run."""
    from crewai.events import crewai_event_bus

    return bool(getattr(crewai_event_bus, "_has_pending_events", True))


def _settle_events() -> None:
    """Wait (at most :data:`SETTLE_SECONDS`) for the handlers of the events CrewAI emitted
    so far, before a model call is prepared. CrewAI runs sync event handlers on a thread
    pool: the handler of the previous call's completed event (which records its reply) or of
    a tool's finished event can still be queued when the next model call begins, and what it
    records would reach the session after the messages of that call, which already hold the
    reply or answer the tool call (a chat loop's reply stored twice, a run unmatched). No
    wait when no handler is pending. Not from one of the bus's own threads: a model call
    made inside a handler would wait for itself."""
    from crewai.events import crewai_event_bus

    current = threading.current_thread()
    executor = getattr(crewai_event_bus, "_sync_executor", None)
    if current in getattr(executor, "_threads", ()) or current is getattr(
        crewai_event_bus, "_loop_thread", None
    ):
        return
    crewai_event_bus.flush(timeout=SETTLE_SECONDS)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _quoted_at(context: str, answer: str) -> tuple[int, int] | None:
    """Where ``context`` holds ``answer`` as whole lines (the first such place), as CrewAI
    quotes a task output or a rejected attempt; None when it does not."""
    start = context.find(answer)
    while start >= 0:
        end = start + len(answer)
        before, after = context[:start].rstrip(" \t"), context[end:].lstrip(" \t")
        if (not before or before.endswith("\n")) and (not after or after.startswith("\n")):
            return start, end
        start = context.find(answer, start + 1)
    return None


def _context_of(message: dict[str, Any]) -> tuple[str, str] | None:
    """A task prompt's text before CrewAI's context marker and all after it (the context
    first); None for a message that is not a prompt with a context."""
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, str):
        return None
    prompt, marker, context = content.partition(context_marker())
    return (prompt, context) if marker else None


def _answer_of(message: dict[str, Any]) -> str | None:
    """The answer an assistant message of text only gives, as a task's output has it (see
    :func:`~ce.crewai._convert.final_answer`)."""
    content = message.get("content")
    if message.get("role") != "assistant" or message.get("tool_calls"):
        return None
    if not isinstance(content, str):
        return None
    return final_answer(content) or None


def _without_quotes(prompt: str, context: str, answers: list[str]) -> str:
    """A task prompt with each of ``answers`` (and the divider next to it) taken out of its
    context; without the marker when nothing is left of the context."""
    divider = context_divider()
    for answer in answers:
        at = _quoted_at(context, answer)
        if at is None:
            continue
        start, end = at
        if context[:start].endswith(divider):
            start -= len(divider)
        elif context[end:].startswith(divider):
            end += len(divider)
        context = context[:start] + context[end:]
    if not context or context.startswith("\n"):
        return prompt + context  # the prompt as CrewAI writes it without a context
    return prompt + context_marker() + context


def said_once(sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``sent`` with each answer that a later task prompt of it quotes in its CrewAI context
    (a task output handed to the next task, an attempt a guardrail rejected, however short)
    said once, in the last prompt that quotes it: the answer's own message is left out (its
    turn's tool calls and results stay) and so is its copy in an earlier prompt (the divider
    next to it too; the context marker when nothing is left of the context). Only text comes
    out, so the request stays within the budget the engine assembled it for. ``sent`` itself
    comes back when nothing is quoted; else fresh dicts, with the authors of the ones kept."""
    contexts = {i: c for i, m in enumerate(sent) if (c := _context_of(m)) is not None}
    if not contexts:
        return sent
    left_out: set[int] = set()
    cuts: dict[int, list[str]] = {}  # an earlier prompt -> the answers its context loses
    for index, message in enumerate(sent):
        answer = _answer_of(message)
        if answer is None:
            continue
        quoting = [i for i, (_, c) in contexts.items() if i > index and _quoted_at(c, answer)]
        if quoting:
            left_out.add(index)
            for i in quoting[:-1]:
                cuts.setdefault(i, []).append(answer)
    if not left_out:
        return sent
    kept = [i for i in range(len(sent)) if i not in left_out]
    out = [
        {**sent[i], "content": _without_quotes(*contexts[i], cuts[i])} if i in cuts else sent[i]
        for i in kept
    ]
    if not isinstance(sent, SentMessages):
        return out
    keys, authors = sent.reconcile_keys, sent.authors
    return SentMessages(
        out,
        [keys[i] for i in kept] if len(keys) == len(sent) else [],
        [authors[i] for i in kept] if len(authors) == len(sent) else [],
    )


def _for_call(sent: list[dict[str, Any]], tools: Any, name: str) -> list[dict[str, Any]]:
    """The engine's messages for a call writing under ``name`` (an agent's role, or
    :data:`~ce.crewai._convert.DIRECT_CALL` for a call of no agent) with ``tools``. What a
    task prompt quotes of the earlier answers is said once, in the prompt (see
    :func:`said_once`). In a session the crew's agents share, the turns another wrote (an
    agent's answer, its tool calls and their results; a direct call's reply) go as that
    writer's: a user message ``[<name> wrote:]`` with them as text, never as the caller's own
    assistant turn (see :func:`~ce.core.integration.peer_turns_as_user`). A call without
    tools gets its own tool calls and results as plain assistant text too: Anthropic and
    Bedrock reject tool blocks in a request that defines no tools (CrewAI itself never sends
    them one)."""
    sent = peer_turns_as_user(said_once(sent), name)
    return sent if tools else tool_chains_as_text(sent)


def _instruction(messages: list[dict[str, Any]]) -> str | None:
    """The instruction the system messages of a call's ``messages`` give, as the engine
    joins them: the one system message, or the distinct texts of several with a blank line
    between; None when there is none."""
    texts: list[str] = [
        content
        for m in messages
        if m.get("role") in ("system", "developer") and isinstance(content := m.get("content"), str)
    ]
    if len(texts) < 2:
        return texts[0] if texts else None
    return "\n\n".join(dict.fromkeys(t for t in texts if t.strip()))


def _leads(system: str, instruction: str) -> bool:
    """Whether the engine's system message ``system`` starts with ``instruction`` as its
    first section (or is all of it)."""
    return system == instruction or system.startswith(instruction + "\n\n")


class AgentPrompts:
    """The instruction each agent's calls give a session (its system prompt, as the engine
    sends it), by session and agent role, to leave out of the calls of no agent in that
    session: the engine sends a call that passes no system prompt the session's newest
    instruction, which a direct ``LLM.call`` made after a crew's agents must not take on.
    Holds the newest ``held`` sessions."""

    def __init__(self, plugin: Plugin, held: int = 1024) -> None:
        self.plugin = plugin
        self._sessions: OrderedDict[str, dict[str, tuple[str, str]]] = OrderedDict()
        self._held = held
        self._lock = threading.Lock()

    def note(
        self,
        session_id: str,
        role: str,
        pending: list[dict[str, Any]],
        sent: list[dict[str, Any]],
    ) -> None:
        """Note the instruction the call of agent ``role`` with the messages ``pending`` gave
        ``session_id``, in the form the engine's messages ``sent`` start with (its prompt,
        redacted when the engine redacted it). A prompt noted already costs a lookup."""
        prompt = _instruction(pending)
        if prompt is None:
            return
        with self._lock:
            noted = self._sessions.get(session_id, {}).get(role)
            if noted is not None and noted[0] == prompt:
                self._sessions.move_to_end(session_id)
                return
        form = self._form(prompt, sent)
        if form is None:
            return
        with self._lock:
            self._sessions.setdefault(session_id, {})[role] = (prompt, form)
            self._sessions.move_to_end(session_id)
            while len(self._sessions) > self._held:
                self._sessions.popitem(last=False)

    def _form(self, prompt: str, sent: list[dict[str, Any]]) -> str | None:
        """``prompt`` as the engine's system message in ``sent`` starts with it (as it
        stands, or redacted); None when it does not."""
        first = sent[0] if sent else None
        content = first.get("content") if first is not None else None
        if first is None or first.get("role") != "system" or not isinstance(content, str):
            return None
        if _leads(content, prompt):
            return prompt
        redactor = self.plugin.engine.redactor_for(self.plugin.config)
        if redactor is None:
            return None
        redacted = redactor.redact_text(prompt).redacted_text
        return redacted if _leads(content, redacted) else None

    def left_out(self, session_id: str, sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``sent`` (the engine's messages for a call of no agent that passes no system
        prompt) without the instruction an agent gave ``session_id`` at the head of its
        system message: the engine's context (the task list, memory, evidence) stays, and
        no system message is left when the instruction was all of it."""
        first = sent[0] if sent else None
        content = first.get("content") if first is not None else None
        if first is None or first.get("role") != "system" or not isinstance(content, str):
            return sent
        with self._lock:
            held = self._sessions.get(session_id)
            forms = [form for _, form in held.values()] if held else []
        for form in forms:
            if content == form:
                return sent[1:]
            if content.startswith(form + "\n\n"):
                return [{**first, "content": content[len(form) + 2 :]}, *sent[1:]]
        return sent


def _role(agent: Any) -> str | None:
    role = getattr(agent, "role", None)
    return str(role) if role else None


class Injector:
    """The LLM call wrappers of one install."""

    def __init__(self, plugin: Plugin, runs: Runs, inject: bool) -> None:
        self.plugin = plugin
        self.runs = runs
        self.inject = inject
        self.prompts = AgentPrompts(plugin)

    def _passes(self) -> bool:
        return not self.plugin.installed or current_call.get() is not None or is_suppressed()

    def _target(self, kwargs: dict[str, Any], messages: Any) -> Target:
        """The call's target: an agent's call in its task's (or the context's) run; a call
        of no agent in a run of its own, nested in the current run if any (a direct
        ``LLM.call`` is top-level). The forced final answer an executor asks for once the
        agent reached ``max_iter`` names neither, yet is a turn of the task at work."""
        task, agent = kwargs.get("from_task"), kwargs.get("from_agent")
        if task is None and agent is None and forced_final_answer(messages):
            task, agent = current_work.get() or (None, None)
        run = self.runs.run_of(task)
        if in_planning.get():  # an agent planning its task: the planner's, not the task's
            return self.runs.target(self.runs.begin(), None, None)
        if run is None or (task is None and agent is None):
            # a direct call, or one of CrewAI's own machinery inside a run (memory,
            # planning, a guardrail): a run of its own, nested in the current one if any
            run = self.runs.begin()
        return self.runs.target(run, task, _role(agent))

    def _chosen(
        self,
        target: Target,
        messages: Any,
        pending: list[dict[str, Any]],
        sent: list[dict[str, Any]] | None,
        tools: Any,
    ) -> Any:
        """What the model gets: the engine's messages for the call (see :func:`_for_call`),
        else the framework's own ``messages`` (the engine's could not be had, or the plugin
        records only). An agent's call notes the instruction it gives the session; a call
        of no agent that passes no system prompt gets none of an agent's
        (:class:`AgentPrompts`)."""
        if sent is None or not self.inject:
            return messages
        if target.role:
            self.prompts.note(target.session_id, target.role, pending, sent)
            return _for_call(sent, tools, target.role)
        chosen = _for_call(sent, tools, DIRECT_CALL)
        if _instruction(pending) is None:
            chosen = self.prompts.left_out(target.session_id, chosen)
        return chosen

    def _note(self, target: Target, reply: Any) -> None:
        for call_id, name, args in reply_tool_calls(reply):
            self.runs.note_call(target, name, call_id, args)

    def _prepare_sync(
        self,
        target: Target,
        messages: list[dict[str, Any]],
        schemas: list[dict[str, Any]] | None,
    ) -> list[dict[str, Any]] | None:
        authors = authors_of(messages, caller(target.role))
        loop = target.run.loop
        if loop is not None and loop.is_running() and not _on_loop(loop):
            work = prepare_openai(self.plugin, target.session_id, messages, schemas, authors)
            return asyncio.run_coroutine_threadsafe(work, loop).result()
        return prepare_openai_sync(self.plugin, target.session_id, messages, schemas, authors)

    def call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        injector = self

        def call(llm: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
            if injector._passes():
                return original(llm, messages, *args, **kwargs)
            target = injector._target(kwargs, messages)
            if _events_pending():
                _settle_events()
            pending = pending_messages(messages)
            tools = kwargs.get("tools", args[0] if args else None)
            sent = injector._prepare_sync(target, pending, tool_schemas(tools))
            chosen = injector._chosen(target, messages, pending, sent, tools)
            run_token = current_run.set(target.run)
            call_token = current_call.set(target)
            try:
                reply = original(llm, chosen, *args, **kwargs)
            finally:
                current_call.reset(call_token)
                current_run.reset(run_token)
            injector._note(target, reply)
            return reply

        return call

    def acall(self, original: Callable[..., Any]) -> Callable[..., Any]:
        injector = self

        async def acall(llm: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
            if injector._passes():
                return await original(llm, messages, *args, **kwargs)
            target = injector._target(kwargs, messages)
            if _events_pending():  # waited for on a worker thread
                await asyncio.to_thread(_settle_events)
            pending = pending_messages(messages)
            tools = kwargs.get("tools", args[0] if args else None)
            sent = await prepare_openai(
                injector.plugin,
                target.session_id,
                pending,
                tool_schemas(tools),
                authors_of(pending, caller(target.role)),
            )
            chosen = injector._chosen(target, messages, pending, sent, tools)
            run_token = current_run.set(target.run)
            call_token = current_call.set(target)
            try:
                reply = await original(llm, chosen, *args, **kwargs)
            finally:
                current_call.reset(call_token)
                current_run.reset(run_token)
            injector._note(target, reply)
            return reply

        return acall

    def wrap_llm_class(self, ledger: PatchLedger, cls: type) -> None:
        """Wrap ``call`` / ``acall`` where ``cls`` defines them itself."""
        if "call" in vars(cls):
            ledger.wrap(cls, "call", self.call)
        if "acall" in vars(cls):
            ledger.wrap(cls, "acall", self.acall)
