"""ScriptedOpenAIServer: the OpenAI chat-completions wire shapes, driven with urllib."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, numbered_answer

USER = [{"role": "user", "content": "hi"}]


def post(server: ScriptedOpenAIServer, body: Any, raw: bytes | None = None) -> Any:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(
        server.base_url + "/chat/completions",
        data=data,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        if response.headers["Content-Type"] == "text/event-stream":
            return response.read().decode()
        return json.loads(response.read())


def post_error(server: ScriptedOpenAIServer, body: Any, raw: bytes | None = None) -> Any:
    with pytest.raises(urllib.error.HTTPError) as info:
        post(server, body, raw)
    return info.value.code, json.loads(info.value.read())


def events(stream: str) -> list[Any]:
    lines = [line for line in stream.split("\n\n") if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as running:
        yield running


def test_a_text_reply_is_a_chat_completion(server: ScriptedOpenAIServer) -> None:
    server.set_script([ScriptedResponse(text="hello there", prompt_tokens=7, completion_tokens=2)])
    body = {"model": "gpt-4o", "messages": USER}
    reply = post(server, body)
    assert reply["object"] == "chat.completion"
    assert reply["model"] == "gpt-4o"
    (choice,) = reply["choices"]
    assert choice["message"] == {"role": "assistant", "content": "hello there", "refusal": None}
    assert choice["finish_reason"] == "stop"
    assert reply["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    assert server.requests == [body]


def test_parallel_tool_calls_and_their_finish_reason(server: ScriptedOpenAIServer) -> None:
    calls = [("call_1", "lookup", '{"q": "a"}'), ("call_2", "search", '{"q": "b"}')]
    server.set_script([ScriptedResponse(tool_calls=calls)])
    (choice,) = post(server, {"model": "m", "messages": USER})["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert [
        (c["id"], c["type"], c["function"]["name"], c["function"]["arguments"])
        for c in choice["message"]["tool_calls"]
    ] == [(cid, "function", name, args) for cid, name, args in calls]


def test_streaming_sends_role_deltas_finish_usage_and_done(server: ScriptedOpenAIServer) -> None:
    calls = [("call_1", "lookup", '{"q": "alpha beta"}'), ("call_2", "search", "{}")]
    server.set_script([ScriptedResponse(text="one two three four", tool_calls=calls)])
    chunks = events(
        post(
            server,
            {
                "model": "m",
                "messages": USER,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    )
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    texts = [d["content"] for d in deltas[1:] if d.get("content")]
    assert len(texts) > 1
    assert "".join(texts) == "one two three four"
    rebuilt: dict[int, dict[str, str]] = {}
    for delta in deltas:
        for call in delta.get("tool_calls", ()):
            slot = rebuilt.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
            slot["id"] += call.get("id", "")
            slot["name"] += call.get("function", {}).get("name", "")
            slot["arguments"] += call["function"]["arguments"]
    assert [(s["id"], s["name"], s["arguments"]) for _, s in sorted(rebuilt.items())] == calls
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in finish] == ["tool_calls"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert all(c["usage"] is None for c in chunks[:-1])


def test_streaming_without_include_usage_sends_no_usage(server: ScriptedOpenAIServer) -> None:
    server.set_script([ScriptedResponse(text="x")])
    chunks = events(post(server, {"model": "m", "messages": USER, "stream": True}))
    assert all("usage" not in c and c["choices"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_script_function_answers_from_the_request(server: ScriptedOpenAIServer) -> None:
    server.set_script(lambda body: ScriptedResponse(text=f"{len(body['messages'])} messages"))
    reply = post(server, {"model": "m", "messages": [*USER, *USER]})
    assert reply["choices"][0]["message"]["content"] == "2 messages"


def test_numbered_answers_tell_what_conversation_was_sent(server: ScriptedOpenAIServer) -> None:
    server.set_script(numbered_answer)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer 0 to first"},
        {"role": "user", "content": "second"},
    ]
    reply = post(server, {"model": "m", "messages": messages})
    assert reply["choices"][0]["message"]["content"] == "answer 1 to second"
    assert server.last_conversation() == ["first", "answer 0 to first", "second"]


def test_list_script_is_consumed_in_order_then_exhausted(server: ScriptedOpenAIServer) -> None:
    server.set_script([ScriptedResponse(text="a"), ScriptedResponse(text="b")])
    body = {"model": "m", "messages": USER}
    assert [post(server, body)["choices"][0]["message"]["content"] for _ in "ab"] == ["a", "b"]
    status, error = post_error(server, body)
    assert status == 500
    assert error["error"]["type"] == "server_error"
    assert len(server.requests) == 3


def test_a_scripted_error_status(server: ScriptedOpenAIServer) -> None:
    server.set_script([ScriptedResponse(text="rate limited", status=429)])
    status, error = post_error(server, {"model": "m", "messages": USER})
    assert (status, error["error"]["message"]) == (429, "rate limited")


@pytest.mark.parametrize(
    ("body", "raw"),
    [
        (None, b"{not json"),
        ([], None),
        ({"messages": USER}, None),
        ({"model": "m", "messages": []}, None),
        ({"model": "m", "messages": [{"content": "no role"}]}, None),
    ],
)
def test_malformed_requests_get_a_400_error_body(
    server: ScriptedOpenAIServer, body: Any, raw: bytes | None
) -> None:
    server.set_script([ScriptedResponse(text="unused")])
    status, error = post_error(server, body, raw)
    assert status == 400
    assert error["error"]["type"] == "invalid_request_error"
    assert server.requests == []


def test_models_and_unknown_routes(server: ScriptedOpenAIServer) -> None:
    with urllib.request.urlopen(server.base_url + "/models", timeout=10) as response:
        models = json.loads(response.read())
    assert models["object"] == "list"
    assert models["data"][0]["object"] == "model"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.base_url + "/nothing", timeout=10)
    assert info.value.code == 404


def test_binds_loopback_on_an_ephemeral_port_and_stops() -> None:
    server = ScriptedOpenAIServer([ScriptedResponse(text="x")])
    with pytest.raises(RuntimeError):
        _ = server.base_url
    with server:
        assert server.base_url.startswith("http://127.0.0.1:")
        assert server.base_url.endswith("/v1")
        url = server.base_url
        assert not url.endswith(":0/v1")
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/models", timeout=10)


async def test_serves_concurrent_calls_from_async_code(server: ScriptedOpenAIServer) -> None:
    server.set_script(lambda body: ScriptedResponse(text=body["messages"][0]["content"]))

    def ask(text: str) -> str:
        body = {"model": "m", "messages": [{"role": "user", "content": text}]}
        return str(post(server, body)["choices"][0]["message"]["content"])

    answers = await asyncio.gather(*(asyncio.to_thread(ask, f"q{i}") for i in range(8)))
    assert answers == [f"q{i}" for i in range(8)]
    assert len(server.requests) == 8
