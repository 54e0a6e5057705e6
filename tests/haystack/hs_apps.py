"""What the ce-haystack tests share: Haystack's OpenAIChatGenerator on the scripted server, a
retriever returning fixed documents, the ``lookup`` tool, and request readers."""

from __future__ import annotations

import json
from typing import Any

from haystack import Document, component
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.tools import Tool
from haystack.utils import Secret

from ce.core.testing import ScriptedOpenAIServer

MODEL = "gpt-4o"


def generator(
    server: ScriptedOpenAIServer, api_key: Secret | None = None, **kwargs: Any
) -> OpenAIChatGenerator:
    """Haystack's own OpenAI chat generator talking to ``server`` (a new one per use: its
    async client belongs to the event loop that first uses it)."""
    return OpenAIChatGenerator(
        api_key=api_key or Secret.from_token("sk-test"),
        model=MODEL,
        api_base_url=server.base_url,
        max_retries=0,
        **kwargs,
    )


def lookup(q: str) -> str:
    """Look something up."""
    return f"result for {q}"


LOOKUP = Tool(
    name="lookup",
    description="Look something up.",
    parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    function=lookup,
)


@component
class FixedRetriever:
    """A retriever answering every query with the same documents: ``(uri, content, score)``."""

    def __init__(self, docs: tuple[tuple[str, str, float], ...]) -> None:
        self.docs = docs

    @component.output_types(documents=list[Document])
    def run(self, query: str) -> dict[str, Any]:
        return {
            "documents": [
                Document(content=content, meta={"source": uri}, score=score)
                for uri, content, score in self.docs
            ]
        }


def wire(request: dict[str, Any]) -> str:
    """A request body as the text that went over the wire."""
    return json.dumps(request)


def roles(request: dict[str, Any]) -> list[str]:
    return [m["role"] for m in request["messages"]]
