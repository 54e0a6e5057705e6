"""Summary and Gist of a text that has none of its own: a JSON tool result keeps its
structure (every key, scalar values; long strings and arrays elided with counts), prose keeps
its leading sentences."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ce.core import BudgetConfig, ContextEngine, Message, Role, RuntimeConfig
from ce.core.pipeline import _index
from ce.core.pipeline._levels import _sentences, shorten
from ce.core.schema import LevelOfDetail, ModelInvocation
from ce.core.stores import MemoryStore

SUMMARY, GIST = LevelOfDetail.SUMMARY, LevelOfDetail.GIST
INV = ModelInvocation(provider="openai", model="gpt-4o")

ORDER = {
    "order_id": "A-1001",
    "status": "processing",
    "total": 129.5,
    "paid": True,
    "items": [{"sku": f"s{i}", "name": "a long product name " * 4, "qty": i} for i in range(12)],
    "note": "y" * 500,
}


def test_a_json_tool_result_keeps_its_keys_and_scalars_at_every_level() -> None:
    text = json.dumps(ORDER)
    for level in (SUMMARY, GIST):
        reduced = shorten(text, level)
        assert len(reduced) < len(text)
        outline = json.loads(reduced)  # still JSON
        assert set(outline) == set(ORDER)
        assert outline["order_id"] == "A-1001" and outline["status"] == "processing"
        assert outline["total"] == 129.5 and outline["paid"] is True
        assert outline["items"][-1].endswith("more items)")
        assert "…(+" in outline["note"]
    gist = json.loads(shorten(text, GIST))
    assert len(gist["items"]) == 3 and gist["items"][-1] == "…(+10 more items)"
    assert len(shorten(text, GIST)) < len(shorten(text, SUMMARY))


def test_prose_keeps_its_leading_sentences() -> None:
    text = "The order A-1001 is processing. It ships tomorrow from Oslo. " + (
        "Unrelated detail follows here. " * 40
    )
    gist = shorten(text, GIST)
    assert gist.startswith("The order A-1001 is processing. It ships tomorrow from Oslo.")
    assert gist.endswith("more sentences omitted]")
    assert len(gist) < 260
    one_long_sentence = "word " * 400
    cut = shorten(one_long_sentence, GIST)
    assert cut.endswith("more characters omitted]") and len(cut) < 240


def test_short_text_and_live_are_whole() -> None:
    assert shorten("short", GIST) == "short"
    long = "x. " * 1000
    assert shorten(long, LevelOfDetail.LIVE) == long
    assert shorten("{not json at all " + "z" * 400, GIST).endswith("omitted]")


@settings(max_examples=100)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=300),
        lambda children: (
            st.lists(children, max_size=12)
            | st.dictionaries(st.text(min_size=1, max_size=8), children, max_size=6)
        ),
        max_leaves=60,
    )
)
def test_any_json_outline_is_json_and_not_longer(value: object) -> None:
    text = json.dumps(value)
    for level in (SUMMARY, GIST):
        reduced = shorten(text, level)
        assert len(reduced) <= len(text)
        if reduced != text and reduced.lstrip()[:1] in "{[":
            json.loads(reduced)


@settings(max_examples=300)
@given(
    st.lists(
        st.sampled_from([*"ab .!?\n\t\r", "。", "！", "？", "x y", "Dr. X", "\n\n"]),
        max_size=30,
    ).map("".join)
)
def test_sentences_end_after_their_mark_or_at_a_blank_line(text: str) -> None:
    # the reading of sentences as a look-behind split has it: a sentence keeps its closing
    # mark, the white space after it goes, and a blank line ends one too
    expected = [s for s in re.split(r"(?<=[.!?。！？])\s+|\n\s*\n", text) if s]
    assert _sentences(text) == expected
    assert _sentences(text) == expected  # again: the text split last is not split again


async def test_a_block_kept_at_summary_never_renders_its_gist(monkeypatch: Any) -> None:
    """The pruner asks for a cheaper level only when the richer one did not fit: an old
    message that fits at Summary is not also shortened to its Gist."""
    asked: list[LevelOfDetail] = []

    def spy(text: str, level: LevelOfDetail) -> str:
        if text.startswith("Sentence 0 "):
            asked.append(level)
        return shorten(text, level)

    monkeypatch.setattr(_index, "shorten", spy)
    long_text = " ".join(
        f"Sentence {i} tells the story of the order in a few words." for i in range(60)
    )
    engine = ContextEngine(
        MemoryStore(),
        config=RuntimeConfig(
            model_hint="gpt-4o",
            budget=BudgetConfig(max_input_tokens=1_400, reserved_reply_tokens=1_000),
        ),
    )
    result = await engine.prepare_call(
        "s",
        [
            Message(role=Role.USER, content=long_text),
            Message(role=Role.ASSISTANT, content="Noted.", invocation=INV),
            Message(role=Role.USER, content="What did I say first?"),
        ],
    )
    degraded = [d for d in result.report.prune_decisions if d.action == "degraded"]
    assert [d.level for d in degraded] == ["summary"]
    assert SUMMARY in asked and GIST not in asked
