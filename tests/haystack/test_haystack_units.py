"""The plugin's readers on their own: usage normalised across generators (OpenAI's
``prompt_tokens`` / ``completion_tokens``, Anthropic's ``input_tokens`` / ``output_tokens``),
Haystack documents read as hits (source, score, id, small metadata under snake_case keys),
inline documents replaced by a pointer to their evidence, earlier turns rendered into a
prompt replaced by a pointer to the conversation, and what counts as a chat generator."""

from __future__ import annotations

from types import SimpleNamespace

from haystack import Document
from haystack.components.agents import Agent
from haystack.components.builders import ChatPromptBuilder
from haystack.components.generators.chat import OpenAIChatGenerator

from ce.haystack._convert import hits_from_documents, normalise_usage
from ce.haystack._inject import inline_evidence
from ce.haystack._patch import is_chat_generator
from ce.haystack._rendered import TURNS_POINTER, held_turns, without_rendered_turns


def test_usage_is_normalised_across_generators() -> None:
    assert normalise_usage({"prompt_tokens": 12, "completion_tokens": 3}) == (12, 3)
    assert normalise_usage({"input_tokens": 7, "output_tokens": 2}) == (7, 2)
    assert normalise_usage(SimpleNamespace(input_tokens=5, output_tokens=1)) == (5, 1)
    assert normalise_usage(None) == (0, 0)
    assert normalise_usage({"prompt_tokens": True}) == (0, 0)


def test_documents_are_read_as_hits() -> None:
    docs = [
        Document(
            id="d1",
            content="Bergen gets rain.",
            meta={"file_path": "b.md", "pageNumber": 3, "big": "x" * 600, "tags": ["a"]},
            score=0.42,
        ),
        Document(id="d2", content="No source here."),
        Document(id="d3", content=None),
    ]
    first, second = hits_from_documents(docs)
    assert (first.content, first.uri, first.score, first.doc_id) == (
        "Bergen gets rain.",
        "b.md",
        0.42,
        "d1",
    )
    assert dict(first.metadata) == {"page_number": 3}
    assert (second.uri, second.score) == ("haystack://document/d2", None)


def test_inline_documents_become_pointers_to_their_evidence() -> None:
    doc = "Oslo gets 9 C and light rain."
    dicts = [
        {"role": "system", "content": "Use the documents."},
        {"role": "user", "content": f"Documents:\n{doc}\nQuestion: rain?"},
        {"role": "assistant", "content": doc},
        {"role": "tool", "content": doc, "tool_call_id": "c1"},
    ]
    out = inline_evidence(dicts, [(doc, "ev-1"), ("short", "ev-2")])
    assert out[1]["content"] == "Documents:\n[retrieved document: evidence ev-1]\nQuestion: rain?"
    assert out[0] == dicts[0] and out[2] == dicts[2] and out[3] == dicts[3]
    assert dicts[1]["content"].startswith("Documents:\nOslo")  # the app's dicts unchanged


def test_what_counts_as_a_chat_generator() -> None:
    assert is_chat_generator(OpenAIChatGenerator)
    assert not is_chat_generator(Agent)  # returns messages, not replies
    assert not is_chat_generator(ChatPromptBuilder)


def test_only_the_held_turns_of_a_rendered_conversation_are_left_out() -> None:
    held = {"A2 is the second answer.", "A3 is the third answer."}
    conversation = (
        ("user", "Q1 is an older question?"),
        ("assistant", "A1 is an older answer."),
        ("user", "Q2 is the second question?"),
        ("assistant", "A2 is the second answer."),
        ("user", "Q3 is the third question?"),
        ("assistant", "A3 is the third answer."),
    )
    assert held_turns(conversation, held.__contains__) == conversation[2:]
    text = "History:\n" + "\n".join(f"{r}: {t}" for r, t in conversation) + "\nQuestion: Q4?"
    (out,) = without_rendered_turns(
        [{"role": "user", "content": text}], [conversation], held.__contains__
    )
    assert out["content"] == (
        "History:\nuser: Q1 is an older question?\nassistant: A1 is an older answer.\n"
        f"{TURNS_POINTER}\nQuestion: Q4?"
    )
    reformatted = text.upper()  # a template filter changed the texts: left as it is
    (same,) = without_rendered_turns(
        [{"role": "user", "content": reformatted}], [conversation], held.__contains__
    )
    assert same["content"] == reformatted
    replies_only = tuple(t for t in conversation if t[0] == "assistant")
    assert held_turns(replies_only, held.__contains__) == ()  # quoted answers, no conversation
