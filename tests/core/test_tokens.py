"""Token estimation: exact OpenAI counts with tiktoken, the cache, degradation, the fallback."""

from __future__ import annotations

import importlib
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ce.core import tokens as tokens_module
from ce.core.schema import Message, MessagePart, Role, ToolCallRequest
from ce.core.tokens import (
    DEFAULT_ENCODING,
    REPLY_PRIMING_TOKENS,
    TOKENS_PER_MESSAGE,
    CharBasedEstimator,
    TiktokenEstimator,
    TokenEstimator,
    collecting_counts,
    openai_encoding_for,
    remember_counts,
    text_digest,
)

CACHE_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "tiktoken-cache"

try:
    import tiktoken
except ImportError:  # the optional extra is not installed
    tiktoken = None

_HAVE_FILES = CACHE_DIR.is_dir() or bool(os.environ.get("TIKTOKEN_CACHE_DIR"))
needs_tiktoken = pytest.mark.skipif(tiktoken is None, reason="tiktoken (ce-core[tiktoken]) absent")
needs_exact = pytest.mark.skipif(
    tiktoken is None or not _HAVE_FILES,
    reason=f"exact counts need tiktoken and its encoding files ({CACHE_DIR} or TIKTOKEN_CACHE_DIR)",
)


@pytest.fixture(autouse=True)
def _offline_tiktoken_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    if CACHE_DIR.is_dir():
        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(CACHE_DIR))


def _never_degraded(reason: str, detail: str) -> None:
    pytest.fail(f"unexpected degradation {reason}: {detail}")


@pytest.fixture
def exact() -> TiktokenEstimator:
    return TiktokenEstimator(on_degraded=_never_degraded)


def M(role: str, content: str, **kw: Any) -> Message:
    return Message(role=Role(role), content=content, **kw)


# --- model hints ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hint", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("GPT-4o", "o200k_base"),
        ("openai/gpt-4.1-mini", "o200k_base"),
        ("azure/gpt-4.5-preview", "o200k_base"),
        ("ft:gpt-4o-mini:acme::abc123", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("o1", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("o4-mini-2025-04-16", "o200k_base"),
        ("gpt-oss-120b", "o200k_base"),
        ("chatgpt-4o-latest", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-4-0613", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("gpt-35-turbo", "cl100k_base"),
        ("text-embedding-3-small", "cl100k_base"),
        (None, DEFAULT_ENCODING),
        ("claude-sonnet-4", None),
        ("llama-3.1-70b", None),
        ("qwen2.5-72b", None),
        ("pangu-V-7B", None),
        ("o1x", None),
        ("gpt-40", None),
    ],
)
def test_openai_encoding_for(hint: str | None, encoding: str | None) -> None:
    assert openai_encoding_for(hint) == encoding


def test_estimators_satisfy_the_protocol() -> None:
    assert isinstance(CharBasedEstimator(), TokenEstimator)
    assert isinstance(TiktokenEstimator(), TokenEstimator)


# --- exact counts ------------------------------------------------------------------------------

TEXTS = [
    "hello world",
    "tiktoken is great!",
    "上下文工程管理大语言模型所见的内容。",
    "def f(x):\n    return {'a': [1, 2, 3]}\n",
    "emoji 🙂🚀 and accents: déjà vu, Ελληνικά, русский",
    "<|endoftext|> is ordinary text here",
    "   leading and trailing spaces   \n\n\n",
]


@needs_exact
@pytest.mark.parametrize("hint", ["gpt-4o", "gpt-4", None])
@pytest.mark.parametrize("text", TEXTS)
def test_text_counts_are_tiktokens(exact: TiktokenEstimator, hint: str | None, text: str) -> None:
    assert tiktoken is not None
    encoding = tiktoken.get_encoding(openai_encoding_for(hint) or "")
    assert exact.estimate_text(text, hint) == len(encoding.encode_ordinary(text))


@needs_exact
def test_known_counts(exact: TiktokenEstimator) -> None:
    # "tiktoken is great!" -> t|ik|token| is| great|! (the OpenAI cookbook's example)
    assert exact.estimate_text("tiktoken is great!", "gpt-4") == 6
    assert exact.estimate_text("", "gpt-4o") == 0


def _cookbook_num_tokens(messages: list[dict[str, str]], encoding_name: str) -> int:
    """``num_tokens_from_messages`` of the OpenAI cookbook, for current models."""
    assert tiktoken is not None
    encoding = tiktoken.get_encoding(encoding_name)
    num_tokens = 0
    for message in messages:
        num_tokens += 3
        for key, value in message.items():
            num_tokens += len(encoding.encode(value))
            if key == "name":
                num_tokens += 1
    return num_tokens + 3


COOKBOOK_EXAMPLE = [
    (
        "system",
        None,
        "You are a helpful, pattern-following assistant that translates corporate jargon "
        "into plain English.",
    ),
    ("system", "example_user", "New synergies will help drive top-line growth."),
    ("system", "example_assistant", "Things working well together will increase revenue."),
    (
        "system",
        "example_user",
        "Let's circle back when we have more bandwidth to touch base on opportunities for "
        "increased leverage.",
    ),
    (
        "system",
        "example_assistant",
        "Let's talk later when we're less busy about how to do better.",
    ),
    (
        "user",
        None,
        "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    ),
]


@needs_exact
@pytest.mark.parametrize(
    ("hint", "api_prompt_tokens"), [("gpt-3.5-turbo", 129), ("gpt-4", 129), ("gpt-4o", 124)]
)
def test_chat_messages_match_the_cookbook_rule(
    exact: TiktokenEstimator, hint: str, api_prompt_tokens: int
) -> None:
    messages = [M(role, content, name=name) for role, name, content in COOKBOOK_EXAMPLE]
    as_dicts = [
        {"role": role, "content": content, **({"name": name} if name else {})}
        for role, name, content in COOKBOOK_EXAMPLE
    ]
    expected = _cookbook_num_tokens(as_dicts, openai_encoding_for(hint) or "")
    assert exact.estimate_messages(messages, hint) == expected
    # the prompt_tokens the API reported for this example (OpenAI cookbook)
    assert expected == api_prompt_tokens


@needs_exact
@pytest.mark.parametrize(
    ("messages", "api_prompt_tokens"),
    [
        # prompt_tokens reported by the API for gpt-3.5-turbo (hmarr/openai-chat-tokens data)
        ([("user", "hello")], 8),
        ([("user", "hello world")], 9),
        ([("system", "hello:")], 9),
        (
            [
                ("system", "# Important: you're the best robot"),
                ("user", "hello robot"),
                ("assistant", "hello world"),
            ],
            27,
        ),
    ],
)
def test_chat_messages_match_api_figures(
    exact: TiktokenEstimator, messages: list[tuple[str, str]], api_prompt_tokens: int
) -> None:
    msgs = [M(role, content) for role, content in messages]
    assert exact.estimate_messages(msgs, "gpt-3.5-turbo") == api_prompt_tokens
    parts = [MessagePart(role=Role(role), content=content) for role, content in messages]
    total = sum(exact.estimate_part(p, "gpt-3.5-turbo") for p in parts)
    assert total + exact.reply_priming("gpt-3.5-turbo") == api_prompt_tokens


@needs_exact
def test_message_and_part_agree(exact: TiktokenEstimator) -> None:
    part = MessagePart(role=Role.USER, content="What is the weather in Paris?")
    by_message = exact.estimate_message(Role.USER, "What is the weather in Paris?", "gpt-4o")
    assert exact.estimate_part(part, "gpt-4o") == by_message
    named = MessagePart(role=Role.USER, content="hi", name="alice")
    assert exact.estimate_part(named, "gpt-4o") == (
        exact.estimate_message(Role.USER, "hi", "gpt-4o")
        + exact.estimate_text("alice", "gpt-4o")
        + 1
    )


@needs_exact
@pytest.mark.parametrize(
    ("raw_arguments", "api_prompt_tokens"),
    [('{"foo": "bar", "baz": 1.5}', 26), ('{"foo":"bar", "baz":\n\n 1.5}', 25)],
)
def test_assistant_tool_calls(
    exact: TiktokenEstimator, raw_arguments: str, api_prompt_tokens: int
) -> None:
    # API figures for an assistant message calling do_stuff (gpt-3.5-turbo, function_call)
    call = ToolCallRequest(tool_call_id="call_1", name="do_stuff", raw_arguments=raw_arguments)
    part = MessagePart(role=Role.ASSISTANT, content="", tool_calls=[call])
    assert exact.estimate_part(part, "gpt-3.5-turbo") + REPLY_PRIMING_TOKENS == api_prompt_tokens
    message = M("assistant", "", tool_calls=[call])
    assert exact.estimate_messages([message], "gpt-3.5-turbo") == api_prompt_tokens


@needs_exact
def test_tool_call_without_raw_arguments_counts_the_parsed_ones(exact: TiktokenEstimator) -> None:
    raw = ToolCallRequest(tool_call_id="c", name="f", raw_arguments='{"a": 1}')
    parsed = ToolCallRequest(tool_call_id="c", name="f", arguments={"a": 1})
    assert exact.estimate_part(
        MessagePart(role=Role.ASSISTANT, content="", tool_calls=[raw]), "gpt-4o"
    ) == exact.estimate_part(
        MessagePart(role=Role.ASSISTANT, content="", tool_calls=[parsed]), "gpt-4o"
    )


RECIPE = {
    "name": "get_recipe",
    "parameters": {
        "type": "object",
        "required": ["ingredients", "instructions", "time_to_cook"],
        "properties": {
            "ingredients": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "unit", "amount"],
                    "properties": {
                        "name": {"type": "string"},
                        "unit": {
                            "enum": ["grams", "ml", "cups", "pieces", "teaspoons"],
                            "type": "string",
                        },
                        "amount": {"type": "number"},
                    },
                },
            },
            "instructions": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Steps to prepare the recipe (no numbering)",
            },
            "time_to_cook": {
                "type": "number",
                "description": "Total time to prepare the recipe in minutes",
            },
        },
    },
}


@needs_exact
@pytest.mark.parametrize(
    ("function", "api_prompt_tokens"),
    [
        # prompt_tokens the API reported for [user "hello"] + one function (gpt-3.5-turbo)
        ({"name": "foo", "parameters": {"type": "object", "properties": {}}}, 31),
        (
            {
                "name": "foo",
                "description": "Do a foo",
                "parameters": {"type": "object", "properties": {}},
            },
            36,
        ),
        (
            {
                "name": "bing_bong",
                "description": "Do a bing bong",
                "parameters": {"type": "object", "properties": {"foo": {"type": "string"}}},
            },
            49,
        ),
        (
            {
                "name": "bing_bong",
                "description": "Do a bing bong",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "foo": {"type": "string"},
                        "bar": {"type": "number", "description": "A number"},
                    },
                },
            },
            57,
        ),
        (
            {
                "name": "bing_bong",
                "description": "Do a bing bong",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "foo": {
                            "type": "object",
                            "properties": {
                                "bar": {"type": "string", "enum": ["a", "b", "c"]},
                                "baz": {"type": "boolean"},
                            },
                        }
                    },
                },
            },
            68,
        ),
        (RECIPE, 106),
    ],
)
def test_tool_schemas_match_api_figures(
    exact: TiktokenEstimator, function: dict[str, Any], api_prompt_tokens: int
) -> None:
    hint = "gpt-3.5-turbo"
    messages = exact.estimate_messages([M("user", "hello")], hint)
    tools = [{"type": "function", "function": function}]
    assert messages + exact.estimate_tools(tools, hint) == api_prompt_tokens
    assert exact.estimate_tools([function], hint) == exact.estimate_tools(tools, hint)


def test_no_tools_cost_nothing() -> None:
    assert CharBasedEstimator().estimate_tools([]) == 0
    assert TiktokenEstimator().estimate_tools([], "claude-3") == 0


def test_tools_with_unusual_schemas_are_estimated() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "q": {"type": ["string", "null"]},
                        "mode": {"anyOf": [{"type": "integer"}, {"enum": ["fast", "slow"]}]},
                        "opts": {"type": "object"},
                        "tags": {"type": "array"},
                        "x": {},
                    },
                },
            },
        },
        {"type": "function", "function": {"name": "ping"}},
    ]
    assert CharBasedEstimator().estimate_tools(tools) > CharBasedEstimator().estimate_tools(
        tools[1:]
    )


@needs_exact
def test_long_text_is_counted_exactly_in_pieces(exact: TiktokenEstimator) -> None:
    assert tiktoken is not None
    sentence = "The engine assembles context within budget; 预算内装配上下文。 x=1  \n"
    text = sentence * 6000  # ~400k characters: counted in chunks cut before spaces
    encoding = tiktoken.get_encoding("o200k_base")
    assert exact.estimate_text(text, "gpt-4o") == len(encoding.encode_ordinary(text))


_PARAGRAPH_BITS = [*"ab Z9.,;:!?/'-_()[]{}\n\t 预算。", "  ", "\n\n", "'s", "word", " word"]
_PARAGRAPH_TEXT = st.lists(
    st.lists(st.sampled_from(_PARAGRAPH_BITS), max_size=60).map("".join), min_size=1, max_size=30
).map("\n\n".join)


@needs_exact
@given(text=_PARAGRAPH_TEXT)
def test_a_text_cut_into_paragraph_pieces_counts_as_the_whole(text: str) -> None:
    assert tiktoken is not None
    pieces = tokens_module._paragraph_pieces(text)
    assert "".join(pieces) == text
    for name in ("o200k_base", "cl100k_base"):
        encoding = tiktoken.get_encoding(name)
        whole = len(encoding.encode_ordinary(text))
        assert sum(len(encoding.encode_ordinary(p)) for p in pieces) == whole


def test_a_long_text_changed_in_one_paragraph_is_tokenized_only_there(
    counting: dict[str, _CountingEncoding],
) -> None:
    estimator = TiktokenEstimator(on_degraded=_never_degraded)
    instruction = "\n\n".join(f"Rule {i}: answer in the user's language, cite." for i in range(60))
    first = f"{instruction}\n\n## Tasks\n\n- [ ] plan the trip"
    second = f"{instruction}\n\n## Tasks\n\n- [x] plan the trip"
    assert len(first) >= tokens_module._PARAGRAPH_MIN_CHARS
    estimator.estimate_text(first, "gpt-4o")
    encoder = counting["o200k_base"]
    expected = len(encoder.encode_ordinary(second))
    encoder.calls.clear()
    assert estimator.estimate_text(second, "gpt-4o") == expected
    assert encoder.calls == [" [x] plan the trip"]  # the changed piece alone


@needs_exact
def test_a_huge_run_without_spaces_does_not_crash_the_tokenizer(exact: TiktokenEstimator) -> None:
    # one 2 MB run of punctuation makes tiktoken panic when encoded in one piece
    assert exact.estimate_text("." * 2_000_000, "gpt-4o") > 0


# --- the cache ---------------------------------------------------------------------------------


class _CountingEncoding:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.name = inner.name
        self.calls: list[str] = []

    def encode_ordinary(self, text: str) -> list[int]:
        self.calls.append(text)
        return list(self._inner.encode_ordinary(text))


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, _CountingEncoding]:
    if tiktoken is None or not _HAVE_FILES:
        pytest.skip(f"needs tiktoken and its encoding files ({CACHE_DIR} or TIKTOKEN_CACHE_DIR)")
    real = tiktoken.get_encoding
    wrappers: dict[str, _CountingEncoding] = {}

    def get_encoding(name: str) -> _CountingEncoding:
        return wrappers.setdefault(name, _CountingEncoding(real(name)))

    monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
    return wrappers


def test_cache_hits_never_call_the_encoder(counting: dict[str, _CountingEncoding]) -> None:
    estimator = TiktokenEstimator(on_degraded=_never_degraded)
    text = "An unchanged message is never tokenized twice."
    first = estimator.estimate_text(text, "gpt-4o")
    encoder = counting["o200k_base"]
    assert encoder.calls == [text]
    for _ in range(3):
        assert estimator.estimate_text(text, "gpt-4o") == first
    assert estimator.estimate_text(text, "gpt-4.1") == first  # same encoding, same entry
    part = MessagePart(role=Role.USER, content=text)
    estimator.estimate_part(part, "gpt-4o")
    estimator.estimate_part(part, "gpt-4o")
    assert encoder.calls == [text, "user"]
    estimator.estimate_text(text, "gpt-4")  # another encoding: its own entry
    assert counting["cl100k_base"].calls == [text]


def test_cache_is_a_bounded_lru(counting: dict[str, _CountingEncoding]) -> None:
    estimator = TiktokenEstimator(on_degraded=_never_degraded, cache_size=2)
    for text in ("a a", "b b", "a a", "c c"):  # "a a" was used last: "b b" is evicted
        estimator.estimate_text(text, "gpt-4o")
    encoder = counting["o200k_base"]
    assert encoder.calls == ["a a", "b b", "c c"]
    estimator.estimate_text("a a", "gpt-4o")
    assert encoder.calls == ["a a", "b b", "c c"]
    estimator.estimate_text("b b", "gpt-4o")
    assert encoder.calls == ["a a", "b b", "c c", "b b"]


def test_cache_size_zero_disables_caching(counting: dict[str, _CountingEncoding]) -> None:
    estimator = TiktokenEstimator(on_degraded=_never_degraded, cache_size=0)
    estimator.estimate_text("same", "gpt-4o")
    estimator.estimate_text("same", "gpt-4o")
    assert counting["o200k_base"].calls == ["same", "same"]


def test_negative_cache_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="cache_size"):
        CharBasedEstimator(cache_size=-1)


# --- degradation -------------------------------------------------------------------------------


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def __call__(self, reason: str, detail: str) -> None:
        self.events.append((reason, detail))


def test_without_tiktoken_it_degrades_once_per_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # makes `import tiktoken` fail
    recorder = _Recorder()
    estimator = TiktokenEstimator(on_degraded=recorder)
    chars = CharBasedEstimator()
    text = "Budget = model input limit - reserved reply - tool schemas."
    assert estimator.estimate_text(text, "gpt-4o") == chars.estimate_text(text)
    assert estimator.estimate_messages([M("user", text)], "gpt-4o") == chars.estimate_messages(
        [M("user", text)]
    )
    assert estimator.estimate_text(text) == chars.estimate_text(text)  # None -> o200k_base too
    assert [reason for reason, _ in recorder.events] == ["tokenizer_unavailable"]
    assert "ce-core[tiktoken]" in recorder.events[0][1]
    estimator.estimate_text(text, "gpt-4")
    assert len(recorder.events) == 2
    assert "cl100k_base" in recorder.events[1][1]


@pytest.fixture
def no_encoding_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An empty tiktoken cache dir, no encoding loaded in this process yet."""
    if tiktoken is None:
        pytest.skip("tiktoken (ce-core[tiktoken]) absent")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(importlib.import_module("tiktoken.registry"), "ENCODINGS", {})


def test_missing_encoding_without_network_fails_fast_and_degrades(
    no_encoding_files: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def blocked(*args: Any, **kwargs: Any) -> Any:
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket, "getaddrinfo", blocked)
    monkeypatch.setattr(socket.socket, "connect", blocked)
    recorder = _Recorder()
    estimator = TiktokenEstimator(on_degraded=recorder, load_timeout=60)
    text = "no tokenizer files here"
    assert estimator.estimate_text(text, "gpt-4o") == CharBasedEstimator().estimate_text(text)
    assert len(recorder.events) == 1
    reason, detail = recorder.events[0]
    assert reason == "tokenizer_unavailable"
    # the download failed (fast) rather than running into the load timeout
    assert "cannot load tiktoken encoding o200k_base" in detail
    assert "TIKTOKEN_CACHE_DIR" in detail
    assert len(detail) < 300 and "\n" not in detail  # one short line, whatever the cause said


def test_a_stalled_download_is_abandoned_after_the_load_timeout(
    no_encoding_files: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def stalled_read_file(blobpath: str) -> bytes:
        release.wait(60)
        raise OSError("released by the test")

    monkeypatch.setattr(importlib.import_module("tiktoken.load"), "read_file", stalled_read_file)
    recorder = _Recorder()
    estimator = TiktokenEstimator(on_degraded=recorder, load_timeout=0.2)
    try:
        assert estimator.estimate_text("x y z", "gpt-4o") == CharBasedEstimator().estimate_text(
            "x y z"
        )
        assert recorder.events == [
            ("tokenizer_unavailable", "loading tiktoken encoding o200k_base took longer than 0.2s")
        ]
    finally:
        release.set()
        for thread in threading.enumerate():
            if thread.name.startswith("ce-tiktoken-load-"):
                thread.join(10)


class _FakeEstimator:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    def estimate_text(self, text: str, model_hint: str | None = None) -> int:
        self.calls.append(("text", model_hint))
        return 101

    def estimate_message(self, role: Role, content: str, model_hint: str | None = None) -> int:
        self.calls.append(("message", model_hint))
        return 102

    def estimate_part(self, part: MessagePart, model_hint: str | None = None) -> int:
        self.calls.append(("part", model_hint))
        return 103

    def estimate_messages(self, messages: list[Message], model_hint: str | None = None) -> int:
        self.calls.append(("messages", model_hint))
        return 104

    def estimate_tools(self, tool_schemas: Any, model_hint: str | None = None) -> int:
        self.calls.append(("tools", model_hint))
        return 105

    def reply_priming(self, model_hint: str | None = None) -> int:
        self.calls.append(("priming", model_hint))
        return 106


def test_other_models_go_to_the_fallback_without_degrading() -> None:
    fallback = _FakeEstimator()
    recorder = _Recorder()
    estimator = TiktokenEstimator(fallback=fallback, on_degraded=recorder)
    hint = "claude-sonnet-4"
    part = MessagePart(role=Role.USER, content="x")
    assert estimator.estimate_text("x", hint) == 101
    assert estimator.estimate_message(Role.USER, "x", hint) == 102
    assert estimator.estimate_part(part, hint) == 103
    assert estimator.estimate_messages([M("user", "x")], hint) == 104
    assert estimator.estimate_tools([{"name": "f"}], hint) == 105
    assert estimator.reply_priming(hint) == 106
    assert [kind for kind, _ in fallback.calls] == [
        "text",
        "message",
        "part",
        "messages",
        "tools",
        "priming",
    ]
    assert all(h == hint for _, h in fallback.calls)
    assert recorder.events == []


# --- the character-based estimator -------------------------------------------------------------


def test_char_estimator_basics() -> None:
    chars = CharBasedEstimator()
    assert chars.estimate_text("") == 0
    assert chars.estimate_text(" ") == 1
    assert chars.estimate_text("hello world") == 2
    assert chars.estimate_text("internationalization") == 3  # started 8-letter blocks
    assert chars.estimate_text("2026") == 2  # digits: one token per started 3
    assert chars.estimate_text("你好世界") == 5  # 4 x 1.2, rounded up
    assert chars.estimate_text("a, b!") == 4
    assert chars.estimate_message(Role.USER, "hello") == TOKENS_PER_MESSAGE + 1 + 1
    assert chars.estimate_messages([M("user", "hello")]) == 5 + REPLY_PRIMING_TOKENS
    assert chars.reply_priming() == REPLY_PRIMING_TOKENS


def test_char_estimator_weighs_cjk_above_english_per_character() -> None:
    chars = CharBasedEstimator()
    chinese = "上下文工程是一门管理大语言模型所见内容的学问"
    english = "context engineering governs what a language model gets to see"
    assert chars.estimate_text(chinese) / len(chinese) > chars.estimate_text(english) / len(english)


@needs_exact
@pytest.mark.parametrize(
    "text",
    [
        (Path(__file__).resolve().parents[3] / "shared" / "DESIGN.md"),
        Path(__file__),
        "上下文工程是一门管理大语言模型所见内容的学问。我们需要在预算内装配最相关的证据，"
        "并保证工具调用的完整性。" * 20,
    ],
    ids=["english-prose", "python-code", "chinese"],
)
def test_char_estimator_stays_near_real_tokenizers(
    exact: TiktokenEstimator, text: str | Path
) -> None:
    if isinstance(text, Path):
        if not text.is_file():
            pytest.skip(f"{text} not found")
        text = text.read_text(encoding="utf-8")
    estimate = CharBasedEstimator().estimate_text(text)
    real = max(exact.estimate_text(text, "gpt-4"), exact.estimate_text(text, "gpt-4o"))
    assert real * 0.9 <= estimate <= real * 1.6


@given(st.text(min_size=1))
def test_char_estimator_is_never_zero_for_text(text: str) -> None:
    assert CharBasedEstimator().estimate_text(text) >= 1


# -- counts stored with records ----------------------------------------------------------------


@needs_exact
def test_a_block_collects_the_counts_its_tokenizer_computed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tokens_module, "_MEMO", {})
    estimator = TiktokenEstimator(on_degraded=_never_degraded)
    estimator.estimate_text("counted before the block")
    with collecting_counts() as fresh:
        first = estimator.estimate_text("a new text of the call")
        estimator.estimate_text("counted before the block")  # a cache hit: not computed here
    estimator.estimate_text("after the block")
    assert fresh == {"tiktoken:o200k_base": {text_digest("a new text of the call"): first}}
    kept: dict[str, dict[str, int]] = {}
    with collecting_counts(kept) as same:
        estimator.estimate_text("another one")
    assert same is kept and list(kept["tiktoken:o200k_base"]) == [text_digest("another one")]


@needs_exact
def test_a_remembered_count_replaces_tokenizing_that_text_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tokens_module, "_MEMO", {})
    encoded: list[str] = []
    encode = tiktoken.Encoding.encode_ordinary

    def counting(self: Any, text: str) -> list[int]:
        encoded.append(text)
        return list(encode(self, text))

    monkeypatch.setattr(tiktoken.Encoding, "encode_ordinary", counting)
    text, other = "a text another process counted", "a text nobody counted"
    true = TiktokenEstimator(on_degraded=_never_degraded).estimate_text(text)
    encoded.clear()
    remember_counts(
        {
            "tiktoken:o200k_base": {text_digest(text): true, "not-a-digest": -1},
            "tiktoken:cl100k_base": {text_digest(other): 1},  # another tokenizer's
            "broken": 5,  # type: ignore[dict-item]
        }
    )
    estimator = TiktokenEstimator(on_degraded=_never_degraded)
    with collecting_counts() as fresh:
        assert estimator.estimate_text(text) == true
        assert estimator.estimate_text(other) > 1
    assert encoded == [other]  # the remembered text was not tokenized
    assert list(fresh["tiktoken:o200k_base"]) == [text_digest(other)]  # only what it computed
    assert estimator.estimate_text(text) == true  # now in the estimator's own cache


def test_stored_counts_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens_module, "_MEMO", {})
    monkeypatch.setattr(tokens_module, "_MEMO_MAX", 3)
    remember_counts({"t": {f"d{i}": i for i in range(5)}})
    assert list(tokens_module._MEMO) == [("t", "d2"), ("t", "d3"), ("t", "d4")]
