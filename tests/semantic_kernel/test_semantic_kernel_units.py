"""Usage normalised across SK's connectors (OpenAI's ``CompletionUsage``, Anthropic's
``input_tokens`` / ``output_tokens`` as an object or a dict, Mistral's 1-tuple), and search
results read as retrieval hits (SK's ``TextSearchResult`` and ``VectorSearchResult``, as
objects or the JSON ``create_search_function`` returns; anything else is no retrieval), and a
summarization reducer's summary read by SK's own marker."""

from __future__ import annotations

import json
from types import SimpleNamespace

from semantic_kernel.connectors.ai.completion_usage import CompletionUsage
from semantic_kernel.contents import AuthorRole, ChatMessageContent
from semantic_kernel.contents.history_reducer.chat_history_reducer_utils import (
    SUMMARY_METADATA_KEY,
)
from semantic_kernel.data.text_search import TextSearchResult

from ce.semantic_kernel._convert import SUMMARY_KEY, conversation, normalise_usage
from ce.semantic_kernel._record import hits_from_result


def test_usage_is_normalised_across_connectors() -> None:
    openai = CompletionUsage(prompt_tokens=12, completion_tokens=3)
    assert normalise_usage(openai) == (12, 3)
    assert normalise_usage((openai,)) == (12, 3)  # Mistral's stray tuple
    assert normalise_usage(SimpleNamespace(input_tokens=7, output_tokens=2)) == (7, 2)
    assert normalise_usage({"input_tokens": 5, "output_tokens": 1}) == (5, 1)
    assert normalise_usage(None) == (0, 0)


def test_search_results_are_read_as_hits() -> None:
    text = TextSearchResult(name="Oslo", value="9 C in Oslo.", link="https://example.com/oslo")
    (hit,) = hits_from_result([text])
    assert (hit.content, hit.uri, hit.metadata) == (
        "9 C in Oslo.",
        "https://example.com/oslo",
        {"name": "Oslo"},
    )
    (hit,) = hits_from_result([text.model_dump_json()])
    assert hit.uri == "https://example.com/oslo"
    record = {"id": "d1", "content": "Bergen gets rain.", "source": "file://b.md", "year": 2024}
    (hit,) = hits_from_result([json.dumps({"record": record, "score": 0.42})])
    assert (hit.content, hit.uri, hit.score, hit.doc_id, dict(hit.metadata)) == (
        "Bergen gets rain.",
        "file://b.md",
        0.42,
        "d1",
        {"year": 2024},
    )
    assert hits_from_result("sunny in Oslo") == []
    assert hits_from_result(["sunny", json.dumps({"record": record, "score": 1})]) == []
    assert hits_from_result(42) == []


def test_a_summary_is_left_out_of_the_conversation() -> None:
    assert SUMMARY_KEY == SUMMARY_METADATA_KEY
    question = ChatMessageContent(role=AuthorRole.USER, content="q")
    summary = ChatMessageContent(role=AuthorRole.ASSISTANT, content="s")
    summary.metadata[SUMMARY_METADATA_KEY] = True
    answer = ChatMessageContent(role=AuthorRole.ASSISTANT, content="a")
    kept = conversation([summary, question, answer])
    assert len(kept) == 2 and kept[0] is question and kept[1] is answer
