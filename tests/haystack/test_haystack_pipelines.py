"""ce-haystack in Pipelines: a retriever's documents are ``rag_doc`` evidence (source, score,
id, metadata) and reach the model once, fenced with their evidence id, also when a
``ChatPromptBuilder`` inlines them; ``Pipeline.run`` and ``run_async`` alike, streamed with
usage; a generator called on its own with a ``str``; a model call inside a tool is nested."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from haystack import Document, Pipeline, component
from haystack.components.agents import Agent
from haystack.components.builders import ChatPromptBuilder
from haystack.dataclasses import ChatMessage
from haystack.tools import Tool
from hs_apps import FixedRetriever, generator, wire

import ce.haystack
from ce.core.engine import ContextEngine
from ce.core.integration import SESSION_KEY
from ce.core.pipeline import document_pointer
from ce.core.schema import EvidenceType, Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, no_blocking

SYSTEM = "Answer from the documents."
DOCS = (
    ("doc://oslo", "Oslo gets 9 C and light rain this weekend.", 0.8),
    ("doc://bergen", "Bergen expects strong wind on Saturday.", 0.3),
)
TEMPLATE = [
    ChatMessage.from_system(SYSTEM),
    ChatMessage.from_user(
        "Documents:\n{% for d in documents %}{{ d.content }}\n{% endfor %}Question: {{ query }}"
    ),
]


def _rag(server: ScriptedOpenAIServer, session_id: str, **llm: Any) -> Pipeline:
    pipeline = Pipeline(metadata={SESSION_KEY: session_id})
    pipeline.add_component("retriever", FixedRetriever(DOCS))
    pipeline.add_component(
        "prompt", ChatPromptBuilder(template=TEMPLATE, required_variables=["documents", "query"])
    )
    pipeline.add_component("llm", generator(server, **llm))
    pipeline.connect("retriever.documents", "prompt.documents")
    pipeline.connect("prompt.prompt", "llm.messages")
    return pipeline


def _data(query: str) -> dict[str, Any]:
    return {"retriever": {"query": query}, "prompt": {"query": query}}


def _answer(_: dict[str, Any]) -> ScriptedResponse:
    return ScriptedResponse(text="Rain in Oslo.", prompt_tokens=42, completion_tokens=4)


@pytest.mark.parametrize("path", ["run", "run_async", "run_stream"])
async def test_inlined_documents_reach_the_model_once_fenced_with_their_id(
    path: str, engine: ContextEngine
) -> None:
    chunks: list[str] = []
    with ScriptedOpenAIServer(_answer) as server:
        llm = (
            {"streaming_callback": lambda c: chunks.append(c.content)}
            if path.endswith("stream")
            else {}
        )
        pipeline = _rag(server, "s-rag", **llm)
        ce.haystack.install(engine)
        if path == "run_async":
            with no_blocking(engine) as blocking:
                result = await pipeline.run_async(_data("Weather in Oslo?"))
            assert blocking.used == []
        else:
            result = pipeline.run(_data("Weather in Oslo?"))
        (request,) = server.requests
    assert result["llm"]["replies"][0].text == "Rain in Oslo."
    if chunks:
        assert "".join(chunks) == "Rain in Oslo."
        assert request["stream_options"] == {"include_usage": True}
    doc = await engine.get_session("s-rag")
    hits = {e.source.uri: e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC}
    assert set(hits) == {uri for uri, _, _ in DOCS}
    for uri, content, score in DOCS:
        evidence = hits[uri]
        assert evidence.content == content and evidence.confidence == pytest.approx(score)
        assert evidence.metadata["doc_id"]
        assert wire(request).count(content) == 1  # once, inside its fenced evidence block
        system = request["messages"][0]["content"]
        block = re.search(
            rf'<evidence id="{evidence.evidence_id}"[^>]*>\n(.*?)\n</evidence>', system, re.S
        )
        assert block is not None and block.group(1) == content
        assert document_pointer(evidence.evidence_id) in request["messages"][-1]["content"]
    assert system.startswith(SYSTEM)
    assert request["messages"][-1]["content"].endswith("Question: Weather in Oslo?")
    (usage,) = doc.session.model_usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.provider) == (42, 4, "openai")
    (user,) = [m for m in doc.session.messages if m.role is Role.USER]
    assert all(content not in user.content for _, content, _ in DOCS)  # stored once too


@component
class ByQuery:
    """A retriever answering each query with the one document ``DOCS`` holds for it."""

    @component.output_types(documents=list[Document])
    def run(self, query: str) -> dict[str, Any]:
        uri, content, score = DOCS[0] if "Oslo" in query else DOCS[1]
        return {"documents": [Document(content=content, meta={"source": uri}, score=score)]}


@pytest.mark.parametrize("kept", ["rendered prompts", "bare questions"])
async def test_conversational_rag_sends_each_turn_and_document_once(
    kept: str, engine: ContextEngine
) -> None:
    # the app's history is what the pipeline sent (the prompt with the turn's documents
    # inline, so turn 2 passes turn 1's document inline again) or the bare questions, and
    # the replies; either way the session holds each turn once, as it was sent
    user = ChatMessage.from_user(
        "Documents:\n{% for d in documents %}{{ d.content }}\n{% endfor %}Question: {{ query }}"
    )
    replies = iter(["Rain.", "Windy."])
    with ScriptedOpenAIServer(lambda _: ScriptedResponse(text=next(replies))) as server:
        pipeline = Pipeline(metadata={SESSION_KEY: "s-conv"})
        pipeline.add_component("retriever", ByQuery())
        pipeline.add_component("prompt", ChatPromptBuilder(variables=["documents", "query"]))
        pipeline.add_component("llm", generator(server))
        pipeline.connect("retriever.documents", "prompt.documents")
        pipeline.connect("prompt.prompt", "llm.messages")
        ce.haystack.install(engine)
        history = [ChatMessage.from_system(SYSTEM)]
        for query in ("Weather in Oslo?", "Wind in Bergen?"):
            result = pipeline.run(
                {
                    "retriever": {"query": query},
                    "prompt": {"template": [*history, user], "query": query},
                },
                include_outputs_from={"prompt"},
            )
            reply = result["llm"]["replies"][0]
            if kept == "rendered prompts":
                history = [*result["prompt"]["prompt"], reply]
            else:
                history = [*history, ChatMessage.from_user(query), reply]
        _, second = server.requests
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    for _, content, _ in DOCS:
        assert wire(second).count(content) == 1  # fenced once, never inline
    assert (DOCS[0][1] in history[1].text) is (kept == "rendered prompts")  # the app's own
    doc = await engine.get_session("s-conv")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert [u.rsplit("Question: ", 1)[1] for u in users] == ["Weather in Oslo?", "Wind in Bergen?"]


async def test_without_the_plugin_the_prompt_inlines_the_documents(engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(_answer) as server:
        _rag(server, "s-plain").run(_data("Weather in Oslo?"))
        (request,) = server.requests
    assert all(content in request["messages"][-1]["content"] for _, content, _ in DOCS)


async def test_a_generator_called_on_its_own_with_a_str_is_its_own_run(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_answer) as server:
        llm = generator(server)
        ce.haystack.install(engine)
        await engine.update_notebook("s-own", "MARK-OWN")
        with engine.session("s-own"):
            llm.run(messages="Weather?")
            await llm.run_async(messages="And tomorrow?")
        llm.run(messages="Unscoped?")
        requests = server.requests
    assert [r["messages"][-1]["content"] for r in requests] == [
        "Weather?",
        "And tomorrow?",
        "Unscoped?",
    ]
    assert all("MARK-OWN" in r["messages"][0]["content"] for r in requests[:2])
    assert "Weather?" in wire(requests[1]) and "Weather?" not in wire(requests[2])
    doc = await engine.get_session("s-own")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        "Weather?",
        "And tomorrow?",
    ]
    assert len(doc.session.model_usage) == 2


def _summarising_agent(server: ScriptedOpenAIServer, summarise: Any) -> Agent:
    """An Agent whose one tool, ``summarise(topic)``, runs ``summarise``."""
    tool = Tool(
        name="summarise",
        description="Summarise a topic.",
        parameters={"type": "object", "properties": {"topic": {"type": "string"}}},
        function=summarise,
    )
    return Agent(chat_generator=generator(server), tools=[tool], system_prompt=SYSTEM)


async def test_a_model_call_inside_a_tool_is_nested(engine: ContextEngine) -> None:
    """An LLM-backed tool: its model call goes to ``<outer>/<call id>``, never gets the outer
    conversation and never adds to it."""

    def script(body: dict[str, Any]) -> ScriptedResponse:
        last = body["messages"][-1]
        if last["role"] == "user" and str(last["content"]).startswith("Summarise"):
            return ScriptedResponse(text="A short summary.")
        if last["role"] == "tool":
            return ScriptedResponse(text="Done.")
        args = json.dumps({"topic": "rain"})
        return ScriptedResponse(tool_calls=[("call_sum", "summarise", args)])

    with ScriptedOpenAIServer(script) as server:
        inner = generator(server)

        def summarise(topic: str) -> str:
            """Summarise a topic."""
            return str(inner.run(messages=f"Summarise {topic}")["replies"][0].text)

        agent = _summarising_agent(server, summarise)
        ce.haystack.install(engine)
        agent.run([ChatMessage.from_user("Outer question")], hook_context={SESSION_KEY: "s-out"})
        requests = server.requests
    nested = [r for r in requests if r["messages"][-1]["content"] == "Summarise rain"]
    (request,) = nested
    assert "Outer question" not in wire(request)
    outer = await engine.get_session("s-out")
    assert all("Summarise" not in (m.content or "") for m in outer.session.messages)
    assert len(outer.session.model_usage) == 2
    (run,) = outer.session.tool_state.tool_calls
    assert run.tool_call_id == "call_sum"
    child = await engine.get_session("s-out/call_sum")
    assert [m.content for m in child.session.messages if m.role is Role.USER] == ["Summarise rain"]
    assert len(child.session.model_usage) == 1


async def test_a_reused_tool_call_id_nests_each_turn_in_a_child_of_its_own(
    engine: ContextEngine,
) -> None:
    """A model that names its tool call ``call_0`` on every turn: the second turn's nested
    model call goes to ``<outer>/call_0~2``, a child of its own, and receives nothing of the
    first turn's nested conversation."""
    inner_system = "Inner summariser."

    def script(body: dict[str, Any]) -> ScriptedResponse:
        messages = body["messages"]
        if messages[0]["content"] == inner_system:
            return ScriptedResponse(text=f"Summary of {messages[-1]['content']}.")
        if messages[-1]["role"] == "tool":
            return ScriptedResponse(text="Done.")
        args = json.dumps({"topic": messages[-1]["content"]})
        return ScriptedResponse(tool_calls=[("call_0", "summarise", args)])

    with ScriptedOpenAIServer(script) as server:
        inner = generator(server)

        def summarise(topic: str) -> str:
            """Summarise a topic."""
            messages = [ChatMessage.from_system(inner_system), ChatMessage.from_user(topic)]
            return str(inner.run(messages=messages)["replies"][0].text)

        agent = _summarising_agent(server, summarise)
        ce.haystack.install(engine)
        context = {SESSION_KEY: "s-out"}
        first = agent.run([ChatMessage.from_user("first topic")], hook_context=context)
        history = [*first["messages"], ChatMessage.from_user("second topic")]
        agent.run(history, hook_context=context)
        requests = server.requests
    nested = [r for r in requests if r["messages"][0]["content"] == inner_system]
    assert [[m["content"] for m in r["messages"]] for r in nested] == [
        [inner_system, "first topic"],
        [inner_system, "second topic"],
    ]
    outer = await engine.get_session("s-out")
    assert [r.tool_call_id for r in outer.session.tool_state.tool_calls] == ["call_0", "call_0~2"]
    for child_id, topic in (("s-out/call_0", "first topic"), ("s-out/call_0~2", "second topic")):
        child = await engine.get_session(child_id)
        assert [m.content for m in child.session.messages if m.role is Role.USER] == [topic]


def _search_agent(
    engine: ContextEngine, docs: tuple[tuple[str, str, float], ...], session_id: str
) -> list[dict[str, Any]]:
    """An Agent whose ``search_docs`` tool is a retriever returning ``docs``, asked one
    question in ``session_id`` (the model calls the tool, then answers); its request bodies."""
    from haystack.tools import ComponentTool

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text="From the documents.")
        args = json.dumps({"query": "the question"})
        return ScriptedResponse(tool_calls=[("call_docs", "search_docs", args)])

    with ScriptedOpenAIServer(script) as server:
        tool = ComponentTool(
            component=FixedRetriever(docs), name="search_docs", description="Search."
        )
        agent = Agent(chat_generator=generator(server), tools=[tool], system_prompt=SYSTEM)
        ce.haystack.install(engine)
        agent.run([ChatMessage.from_user("The question?")], hook_context={SESSION_KEY: session_id})
        return server.requests


async def test_a_retriever_behind_a_component_tool_is_linked_to_its_call(
    engine: ContextEngine,
) -> None:
    _search_agent(engine, DOCS, "s-tool")
    doc = await engine.get_session("s-tool")
    hits = [e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert {h.source.uri for h in hits} == {uri for uri, _, _ in DOCS}
    assert all(h.links.tool_call_id == "call_docs" for h in hits)
    (run,) = doc.session.tool_state.tool_calls
    assert (run.tool_call_id, run.tool, run.status.value) == ("call_docs", "search_docs", "success")


async def test_a_retriever_tool_over_two_indexes_sends_a_passage_once(
    engine: ContextEngine,
) -> None:
    """An agent's retriever tool returning one passage from two sources: the call's result
    carries it once, the other source's copy as its own block pointing to it."""
    policy = "REFUND-7731: annual plans are refunded within 30 days of purchase, prorated after."
    docs = (("kb://handbook", policy, 0.9), ("faq://returns", policy, 0.7))
    _, after_tool = _search_agent(engine, docs, "s-twice")
    assert wire(after_tool).count("REFUND-7731") == 1
    (result,) = [m["content"] for m in after_tool["messages"] if m["role"] == "tool"]
    assert 'uri="kb://handbook"' in result and 'uri="faq://returns"' in result
    assert "[same text as evidence " in result


async def test_a_second_generator_improving_the_first_ones_draft_reads_it_once(
    engine: ContextEngine,
) -> None:
    """Two generators chained in one pipeline (a draft, then a prompt that quotes it to be
    improved): the editor's request carries the draft once, in its prompt; the session's copy
    of the drafter's answer goes as a pointer to it."""
    draft = (
        "DRAFT-5521: Oslo gets nine degrees and light rain this weekend, so bring a jacket "
        "and an umbrella."
    )

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if "Improve" in json.dumps(body["messages"]):
            return ScriptedResponse(text="Pack a jacket.")
        return ScriptedResponse(text=draft)

    ce.haystack.install(engine)
    with ScriptedOpenAIServer(script) as server:
        pipeline = Pipeline(metadata={SESSION_KEY: "chain"})
        write = [ChatMessage.from_user("Write about {{topic}}")]
        improve = [ChatMessage.from_user("Improve this draft:\n{{replies[0].text}}")]
        pipeline.add_component("draft_prompt", ChatPromptBuilder(template=write))
        pipeline.add_component("drafter", generator(server))
        pipeline.add_component("improve_prompt", ChatPromptBuilder(template=improve))
        pipeline.add_component("editor", generator(server))
        pipeline.connect("draft_prompt.prompt", "drafter.messages")
        pipeline.connect("drafter.replies", "improve_prompt.replies")
        pipeline.connect("improve_prompt.prompt", "editor.messages")
        result = pipeline.run({"draft_prompt": {"topic": "Oslo weather"}})
        requests = server.requests
    assert result["editor"]["replies"][0].text == "Pack a jacket."
    editor = requests[-1]["messages"]
    assert wire(requests[-1]).count(draft) == 1
    assert editor[-1] == {"role": "user", "content": f"Improve this draft:\n{draft}"}
    doc = await engine.get_session("chain")
    assert doc is not None
    answers = [m.content for m in doc.session.messages if m.role is Role.ASSISTANT]
    assert answers == [draft, "Pack a jacket."]


def rewrite_script(body: dict[str, Any]) -> ScriptedResponse:
    last = str(body["messages"][-1]["content"])
    return ScriptedResponse(text="a better query" if last.startswith("Rewrite") else "The answer.")


def _rewrite_then_answer(server: ScriptedOpenAIServer) -> Pipeline:
    """A query rewriter's generator, then the answering one, each with its own prompt."""
    pipeline = Pipeline()
    rewrite = [ChatMessage.from_user("Rewrite: {{q}}")]
    answer = [
        ChatMessage.from_system("You answer."),
        ChatMessage.from_user("Answer: {{r[0].text}}"),
    ]
    pipeline.add_component("rewrite_prompt", ChatPromptBuilder(rewrite, required_variables=["q"]))
    pipeline.add_component("rewriter", generator(server))
    pipeline.add_component("answer_prompt", ChatPromptBuilder(answer, required_variables=["r"]))
    pipeline.add_component("answerer", generator(server))
    pipeline.connect("rewrite_prompt.prompt", "rewriter.messages")
    pipeline.connect("rewriter.replies", "answer_prompt.r")
    pipeline.connect("answer_prompt.prompt", "answerer.messages")
    return pipeline


async def test_two_generators_of_a_run_with_no_session_each_get_their_own_prompt(
    engine: ContextEngine,
) -> None:
    """A pipeline run that names no session, with a query rewriter before the answering
    generator: the answer's request is its own prompt, as without the plugin, not the
    rewriter's exchange before it; each call is recorded in the run's session or a child."""

    def bodies(install: bool) -> list[Any]:
        with ScriptedOpenAIServer(rewrite_script) as server:
            pipeline = _rewrite_then_answer(server)
            if install:
                ce.haystack.install(engine)
            for question in ("cats?", "dogs?"):
                pipeline.run({"rewrite_prompt": {"q": question}})
            if install:
                ce.haystack.uninstall()
            return [r["messages"] for r in server.requests]

    native = bodies(False)
    assert bodies(True) == native
    runs = [s for s in await engine.list_sessions() if s.startswith("run:")]
    assert len(runs) == 4 and sum("/" in s for s in runs) == 2


def router_script(body: dict[str, Any]) -> ScriptedResponse:
    first = body["messages"][0]
    if first["role"] == "system" and str(first["content"]).startswith("Classify"):
        return ScriptedResponse(text="safe")
    return ScriptedResponse(text=f"The answer, from {len(body['messages'])} messages.")


def _classify_then_answer(server: ScriptedOpenAIServer) -> Pipeline:
    """A guard generator classifies the question; the answering generator and a second model
    each get the question itself (the same messages, another system prompt or none)."""
    pipeline = Pipeline()
    classify = [
        ChatMessage.from_system("Classify as safe or unsafe."),
        ChatMessage.from_user("{{q}}"),
    ]
    pipeline.add_component("classify_prompt", ChatPromptBuilder(classify, required_variables=["q"]))
    pipeline.add_component("guard", generator(server))
    pipeline.add_component("answer_prompt", ChatPromptBuilder([ChatMessage.from_user("{{q}}")]))
    pipeline.add_component("answerer", generator(server))
    pipeline.add_component("second", generator(server))
    pipeline.connect("classify_prompt.prompt", "guard.messages")
    pipeline.connect("answer_prompt.prompt", "answerer.messages")
    pipeline.connect("answer_prompt.prompt", "second.messages")
    return pipeline


async def test_calls_on_the_same_question_in_a_run_with_no_session_get_their_own_messages(
    engine: ContextEngine,
) -> None:
    """A guard's classification, then the answer to the same question, and a second model
    given the very same prompt: each request is what Haystack sends, never the classifier's
    prompt and verdict nor the first model's answer; each call in a session of its own."""

    def bodies(install: bool) -> list[Any]:
        with ScriptedOpenAIServer(router_script) as server:
            pipeline = _classify_then_answer(server)
            if install:
                ce.haystack.install(engine)
            question = "What is the capital of France?"
            pipeline.run({"classify_prompt": {"q": question}, "answer_prompt": {"q": question}})
            if install:
                ce.haystack.uninstall()
            return sorted(json.dumps(r["messages"]) for r in server.requests)

    native = bodies(False)
    assert bodies(True) == native
    assert all("safe" not in body for body in native if "Classify" not in body)
    runs = [s for s in await engine.list_sessions() if s.startswith("run:")]
    assert len(runs) == 3 and sum("/" in s for s in runs) == 2


async def test_a_routers_own_call_is_no_turn_of_the_named_conversation(
    engine: ContextEngine,
) -> None:
    """An ``LLMMessagesRouter`` classifies the user's message with its own generator before
    the answering generator gets it, in a session the pipeline names: the router's call is
    the router's work (a run of its own under the session), so the answer's request is the
    user's message alone, as without the plugin (not the classifier's prompt and verdict),
    and the session holds the question and the answer only."""
    routers = pytest.importorskip("haystack.components.routers")
    utils = pytest.importorskip("haystack.components.generators.utils")
    if not hasattr(utils, "_trace_chat_generator_run"):
        pytest.skip("this Haystack does not mark a component's own generator calls")

    def script(body: dict[str, Any]) -> ScriptedResponse:
        first = body["messages"][0]
        if first["role"] == "system" and "Classify" in str(first["content"]):
            return ScriptedResponse(text="safe")
        return ScriptedResponse(text="Paris.")

    question = "What is the capital of France?"

    def bodies(install: bool) -> list[Any]:
        with ScriptedOpenAIServer(script) as server:
            pipeline = Pipeline(metadata={SESSION_KEY: "s-router"})
            router = routers.LLMMessagesRouter(
                chat_generator=generator(server),
                output_names=["unsafe", "safe"],
                output_patterns=["unsafe", "safe"],
                system_prompt="Classify the user message as safe or unsafe.",
            )
            pipeline.add_component("router", router)
            pipeline.add_component("llm", generator(server))
            pipeline.connect("router.safe", "llm.messages")
            if install:
                ce.haystack.install(engine)
            result = pipeline.run({"router": {"messages": [ChatMessage.from_user(question)]}})
            if install:
                ce.haystack.uninstall()
            assert result["llm"]["replies"][0].text == "Paris."
            return [r["messages"] for r in server.requests]

    native = bodies(False)
    assert bodies(True) == native
    assert native[1] == [{"role": "user", "content": question}]
    doc = await engine.get_session("s-router")
    held = [(m.role, m.content) for m in doc.session.messages]
    assert held == [(Role.USER, question), (Role.ASSISTANT, "Paris.")]
    (child,) = [s for s in await engine.list_sessions() if s.startswith("s-router/router-")]
    routed = await engine.get_session(child)
    assert [m.content for m in routed.session.messages][-1] == "safe"
