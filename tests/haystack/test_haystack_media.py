"""Pictures and files in Haystack messages (``ImageContent``, ``FileContent``) through the
engine: a user's picture or file is stored with its message, counted against the budget (the
report's ``token_used``) and reaches the model in order with the text, detail kept, as the
app's own message object when the engine keeps it as it is; a later turn the session supplies
sends it again (the real OpenAIChatGenerator on the scripted server, in a Pipeline and an
Agent). A tool result's picture is stored, counted and sent again too (an app's own chat
generator); to an OpenAIChatGenerator, whose chat API takes no media in tool messages, a
stored one goes as its text."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import pytest
from haystack import Pipeline, component
from haystack.components.agents import Agent
from haystack.components.builders import ChatPromptBuilder
from haystack.dataclasses import ChatMessage, FileContent, ImageContent, TextContent
from haystack.tools import Tool
from hs_apps import MODEL, FixedRetriever, generator, wire

import ce.haystack
from ce.core.engine import ContextEngine
from ce.core.integration import SESSION_KEY
from ce.core.schema import EvidenceType, FilePart, ImagePart, Role, TextPart
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.core.tokens import FILE_PAGE_TOKENS, part_tokens

QUESTION = "What is in this picture?"
CANARY = "pic.canary@example.com"


def _png(width: int, height: int) -> bytes:
    """A real PNG of ``width`` x ``height`` black pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * ((width + 1) * height))
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    )


PICTURE = base64.b64encode(_png(2048, 2048)).decode()
PICTURE_URL = f"data:image/png;base64,{PICTURE}"
PDF = base64.b64encode(b"%PDF-1.4\n1 0 obj << /Type /Page >> endobj\n%%EOF\n").decode()
PDF_URL = f"data:application/pdf;base64,{PDF}"


def picture(detail: Any = "high") -> ImageContent:
    return ImageContent(base64_image=PICTURE, mime_type="image/png", detail=detail)


def asked(*extra: Any) -> ChatMessage:
    """The user's question with ``extra`` parts after its text."""
    return ChatMessage.from_user(content_parts=[TextContent(QUESTION), *extra])


def _answer(body: dict[str, Any]) -> ScriptedResponse:
    return ScriptedResponse(text=f"Answer {len(body['messages'])}.")


async def _report_tokens(engine: ContextEngine, session_id: str) -> int:
    return (await engine.get_report(session_id)).token_used


async def test_a_users_picture_is_stored_counted_and_sent_in_a_pipeline(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_answer) as server:
        ce.haystack.install(engine)
        questions = {"plain": ChatMessage.from_user(QUESTION), "pic": asked(picture())}
        for session_id, question in questions.items():
            pipeline = Pipeline(metadata={SESSION_KEY: session_id})
            pipeline.add_component("llm", generator(server))
            pipeline.run({"llm": {"messages": [question]}})
        plain, pictured = server.requests

    image = {"type": "image_url", "image_url": {"url": PICTURE_URL, "detail": "high"}}
    assert plain["messages"][-1]["content"] == QUESTION
    assert pictured["messages"][-1]["content"] == [{"type": "text", "text": QUESTION}, image]
    doc = await engine.get_session("pic")
    (question,) = [m for m in doc.session.messages if m.role is Role.USER]
    assert question.content == QUESTION
    assert question.parts == [TextPart(), ImagePart(url=PICTURE_URL, detail="high")]
    # the picture counts by OpenAI's rule: 2048 x 2048 at high detail is 4 tiles on gpt-4o
    cost = part_tokens(ImagePart(url=PICTURE_URL, detail="high"), MODEL)
    assert cost == 765
    assert await _report_tokens(engine, "pic") == await _report_tokens(engine, "plain") + cost


@pytest.mark.parametrize("path", ["run", "run_async"])
async def test_a_later_agent_turn_gets_the_picture_from_the_session(
    path: str, engine: ContextEngine
) -> None:
    with ScriptedOpenAIServer(_answer) as server:
        agent = Agent(chat_generator=generator(server), system_prompt="You describe pictures.")
        ce.haystack.install(engine)
        for session_id, opening in [("agent-pic", asked(picture("low"))), ("agent-text", asked())]:
            context = {SESSION_KEY: session_id}
            for message in [opening, ChatMessage.from_user("What colour was it?")]:
                if path == "run":
                    agent.run(messages=[message], hook_context=context)
                else:
                    await agent.run_async(messages=[message], hook_context=context)
        first, second, _, _ = server.requests

    image = {"type": "image_url", "image_url": {"url": PICTURE_URL, "detail": "low"}}
    question = {"role": "user", "content": [{"type": "text", "text": QUESTION}, image]}
    assert first["messages"][-1] == question
    # the app passes only its new question: the session supplies the picture's question
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][1] == question
    assert second["messages"][-1]["content"] == "What colour was it?"
    low = part_tokens(ImagePart(url=PICTURE_URL, detail="low"), MODEL)
    doc = await engine.get_session("agent-pic")
    users = [m for m in doc.session.messages if m.role is Role.USER]
    assert [m.parts for m in users] == [
        [TextPart(), ImagePart(url=PICTURE_URL, detail="low")],
        None,
    ]
    # the later turn counts the picture the session sent again
    assert await _report_tokens(engine, "agent-pic") == (
        await _report_tokens(engine, "agent-text") + low
    )


async def test_a_users_pdf_is_stored_counted_and_sent(engine: ContextEngine) -> None:
    report = FileContent(base64_data=PDF, mime_type="application/pdf", filename="report.pdf")
    with ScriptedOpenAIServer(_answer) as server:
        ce.haystack.install(engine)
        questions = {
            "no-pdf": ChatMessage.from_user("Summarise the file."),
            "pdf": ChatMessage.from_user(content_parts=["Summarise the file.", report]),
        }
        for session_id, question in questions.items():
            pipeline = Pipeline(metadata={SESSION_KEY: session_id})
            pipeline.add_component("llm", generator(server))
            pipeline.run({"llm": {"messages": [question]}})
        _, request = server.requests

    file = {"type": "file", "file": {"file_data": PDF_URL, "filename": "report.pdf"}}
    text = {"type": "text", "text": "Summarise the file."}
    assert request["messages"][-1]["content"] == [text, file]
    doc = await engine.get_session("pdf")
    (question,) = [m for m in doc.session.messages if m.role is Role.USER]
    assert question.parts == [TextPart(), FilePart(data=PDF_URL, filename="report.pdf")]
    # a PDF given inline counts per page
    tokens = await _report_tokens(engine, "no-pdf") + FILE_PAGE_TOKENS
    assert await _report_tokens(engine, "pdf") == tokens


@component
class OwnGenerator:
    """An app's own chat generator: asks for the screenshot tool once, then answers; keeps the
    messages of every call."""

    def __init__(self) -> None:
        self.seen: list[list[ChatMessage]] = []

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], tools: Any = None) -> dict[str, Any]:
        from haystack.dataclasses import ToolCall

        self.seen.append(list(messages))
        if tools and messages[-1].is_from("user") and "screen" in (messages[-1].text or ""):
            call = ToolCall(tool_name="screenshot", arguments={}, id=f"call_{len(self.seen)}")
            return {"replies": [ChatMessage.from_assistant(tool_calls=[call])]}
        return {"replies": [ChatMessage.from_assistant(f"Answer {len(self.seen)}.")]}


def _screenshot() -> list[Any]:
    return [TextContent("the screen"), picture()]


SCREENSHOT = Tool(
    name="screenshot",
    description="Take a screenshot.",
    parameters={"type": "object", "properties": {}},
    function=_screenshot,
    outputs_to_string={"raw_result": True},
)


async def test_a_tool_results_picture_is_stored_counted_and_sent_again(
    engine: ContextEngine,
) -> None:
    own = OwnGenerator()
    agent = Agent(chat_generator=own, tools=[SCREENSHOT], system_prompt="You look at screens.")
    ce.haystack.install(engine)
    context = {SESSION_KEY: "screen"}
    question = asked(picture("low"))
    agent.run(messages=[ChatMessage.from_user("Look at my screen.")], hook_context=context)
    agent.run(messages=[question], hook_context=context)

    assert len(own.seen) == 3
    # the tool result (its text fenced by the engine) keeps its picture
    result = own.seen[1][-1].tool_call_result
    assert result is not None and isinstance(result.result, list)
    assert [type(p) for p in result.result] == [TextContent, ImageContent]
    assert result.result[1].base64_image == PICTURE
    # the next turn passes only its question: the session supplies the tool result, picture
    # and all, and the app's question goes as its own object
    later = own.seen[2]
    tool = next(m for m in later if m.tool_call_result is not None).tool_call_result
    assert tool is not None and isinstance(tool.result, list)
    assert [type(p) for p in tool.result] == [TextContent, ImageContent]
    assert tool.result[1].base64_image == PICTURE and tool.result[1].mime_type == "image/png"
    assert tool.result[1].detail == "high"
    assert later[-1] is question
    doc = await engine.get_session("screen")
    (stored,) = [m for m in doc.session.messages if m.role is Role.TOOL]
    assert stored.content == "the screen"
    assert stored.parts == [TextPart(), ImagePart(url=PICTURE_URL, detail="high")]
    # the tool run's recorded result is its text: the picture is the tool message's
    (recorded,) = [e for e in doc.evidences.values() if e.type is EvidenceType.TOOL_RESULT]
    assert recorded.content == "the screen"
    high = part_tokens(ImagePart(url=PICTURE_URL, detail="high"), MODEL)
    low = part_tokens(ImagePart(url=PICTURE_URL, detail="low"), MODEL)
    assert (await engine.get_report("screen")).token_used > high + low


async def test_a_chat_completions_generator_gets_a_stored_tool_picture_as_text(
    engine: ContextEngine,
) -> None:
    """OpenAI's chat API takes no media in tool messages (Haystack refuses to write them): a
    session's tool result with a picture reaches an OpenAIChatGenerator as its text."""
    agent = Agent(chat_generator=OwnGenerator(), tools=[SCREENSHOT])
    ce.haystack.install(engine)
    context = {SESSION_KEY: "screen-then-chat"}
    agent.run(messages=[ChatMessage.from_user("Look at my screen.")], hook_context=context)
    with ScriptedOpenAIServer(_answer) as server:
        chat = Agent(chat_generator=generator(server), tools=[SCREENSHOT])
        result = chat.run(messages=[ChatMessage.from_user("And now?")], hook_context=context)
        (request,) = server.requests

    assert result["last_message"].text == f"Answer {len(request['messages'])}."
    (tool,) = [m for m in request["messages"] if m["role"] == "tool"]
    assert isinstance(tool["content"], str) and "the screen" in tool["content"]
    assert "image_url" not in wire(request)


async def test_a_session_supplied_picture_goes_as_a_haystack_image(engine: ContextEngine) -> None:
    """The rebuilt message holds a Haystack ``ImageContent`` (mime type and detail from the
    stored picture), so any generator can send it."""
    own = OwnGenerator()
    agent = Agent(chat_generator=own, system_prompt="You describe pictures.")
    ce.haystack.install(engine)
    context = {SESSION_KEY: "own-pic"}
    first = asked(picture("high"))
    agent.run(messages=[first], hook_context=context)
    agent.run(messages=[ChatMessage.from_user("And the colour?")], hook_context=context)

    assert own.seen[0][-1] is first  # kept as it is: the app's very object
    rebuilt = own.seen[1][1]
    assert rebuilt.is_from("user") and rebuilt.text == QUESTION
    (image,) = rebuilt.images
    assert (image.base64_image, image.mime_type, image.detail) == (PICTURE, "image/png", "high")


PICTURE_TEMPLATE = """
{% message role="user" %}
Documents:
{% for d in documents %}{{ d.content }}
{% endfor %}Question: {{ query }}
{{ image | templatize_part }}
{% endmessage %}
"""


async def test_a_prompt_with_a_picture_sends_its_documents_once(engine: ContextEngine) -> None:
    """A RAG prompt that inlines the retrieved documents beside a picture: the inline copy is
    replaced by a pointer to the document's evidence, the picture stays."""
    docs = (("doc://oslo", "Oslo gets 9 C and light rain this weekend.", 0.8),)
    with ScriptedOpenAIServer(_answer) as server:
        pipeline = Pipeline(metadata={SESSION_KEY: "rag-pic"})
        pipeline.add_component("retriever", FixedRetriever(docs))
        pipeline.add_component("prompt", ChatPromptBuilder(template=PICTURE_TEMPLATE))
        pipeline.add_component("llm", generator(server))
        pipeline.connect("retriever.documents", "prompt.documents")
        pipeline.connect("prompt.prompt", "llm.messages")
        ce.haystack.install(engine)
        query = "Is this Oslo?"
        pipeline.run(
            {"retriever": {"query": query}, "prompt": {"query": query, "image": picture()}}
        )
        (request,) = server.requests

    content = request["messages"][-1]["content"]
    assert [p["type"] for p in content] == ["text", "image_url"]
    assert content[1]["image_url"] == {"url": PICTURE_URL, "detail": "high"}
    assert "[retrieved document: evidence " in content[0]["text"]
    assert wire(request).count(docs[0][1]) == 1  # once, as the session's evidence


async def test_a_redacted_question_keeps_its_picture(engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(_answer) as server:
        agent = Agent(chat_generator=generator(server), system_prompt="You describe pictures.")
        ce.haystack.install(engine)
        question = ChatMessage.from_user(content_parts=[f"Mail it to {CANARY}.", picture()])
        agent.run(messages=[question], hook_context={SESSION_KEY: "redacted-pic"})
        (request,) = server.requests

    text, image = request["messages"][-1]["content"]
    assert CANARY not in text["text"] and "[REDACTED:email]" in text["text"]
    assert image == {"type": "image_url", "image_url": {"url": PICTURE_URL, "detail": "high"}}
    assert question.text == f"Mail it to {CANARY}."  # the app's own message is not changed
