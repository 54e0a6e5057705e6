"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for offline tests.

::

    with ScriptedOpenAIServer([ScriptedResponse(tool_calls=[("call_1", "lookup", '{"q": 1}')]),
                               ScriptedResponse(text="done")]) as server:
        client = OpenAI(base_url=server.base_url, api_key="sk-test")
        ...
        assert server.requests[1]["messages"][-1]["role"] == "tool"

It serves ``POST /v1/chat/completions`` (plain JSON, or SSE with ``"stream": true``) and
``GET /v1/models`` from a daemon thread, so sync and async clients alike can call it. Stdlib
only.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["ScriptFunction", "ScriptedOpenAIServer", "ScriptedResponse", "numbered_answer"]

_MODEL = "scripted-model"


@dataclass(frozen=True)
class ScriptedResponse:
    """One reply of the server. ``text`` and/or ``tool_calls`` as ``(id, name,
    arguments_json)``; usage counts; ``finish_reason`` defaults to ``"tool_calls"`` when there
    are tool calls, else ``"stop"``. A ``status`` other than 200 answers with an OpenAI error
    body instead, whose message is ``text``."""

    text: str | None = None
    tool_calls: Sequence[tuple[str, str, str]] = ()
    prompt_tokens: int = 10
    completion_tokens: int = 5
    finish_reason: str | None = None
    status: int = 200

    @property
    def finish(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")


ScriptFunction = Callable[[dict[str, Any]], ScriptedResponse]
"""A script computed from each request body."""


class _RequestError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def _error_body(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _pieces(text: str, count: int = 3) -> list[str]:
    """``text`` cut into up to ``count`` non-empty pieces (word boundaries when it has
    words)."""
    words = re.findall(r"\S+\s*|\s+", text)
    if len(words) < count:
        size = max(1, -(-len(text) // count))
        return [text[i : i + size] for i in range(0, len(text), size)]
    step = -(-len(words) // count)
    return ["".join(words[i : i + step]) for i in range(0, len(words), step)]


def _validate(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _RequestError(400, "the request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _RequestError(400, "'model' is required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _RequestError(400, "'messages' must be a non-empty array")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _RequestError(400, f"messages[{index}] must be an object with a 'role'")
    return body


CITY_GUIDES: dict[str, str] = {
    city: f"The {city} city guide: museums open at nine, the weather in {city} is mild in autumn."
    for city in ("Paris", "Oslo", "Rome", "Lima")
}
"""Retrievable documents, one per city, for tests of RAG apps: a retriever returns those whose
city a query names, and :meth:`ScriptedOpenAIServer.sent_counts` tells which the model got."""


def numbered_answer(body: dict[str, Any]) -> ScriptedResponse:
    """A script function: ``answer <n> to <question>``, where ``n`` counts the assistant
    messages the request holds and ``question`` is the text of its last user message, so a
    test reads from each reply what conversation the model was sent."""
    asked = [m.get("content") for m in body["messages"] if m.get("role") == "user"]
    seen = sum(m.get("role") == "assistant" for m in body["messages"])
    return ScriptedResponse(text=f"answer {seen} to {asked[-1] if asked else ''}")


class ScriptedOpenAIServer:
    """An OpenAI-compatible server answering from a script.

    ``script``: the replies in order (a request after the last one gets HTTP 500), or a
    function of the request body. :attr:`base_url` is ``http://127.0.0.1:<port>/v1`` (an
    ephemeral port); :attr:`requests` holds every chat-completions request body received, in
    arrival order. A malformed request gets a 4xx OpenAI error body. Use it as a context
    manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(self, script: Sequence[ScriptedResponse] | ScriptFunction = ()) -> None:
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._script: list[ScriptedResponse] | ScriptFunction = (
            script if callable(script) else list(script)
        )
        self._ids = itertools.count(1)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> ScriptedOpenAIServer:
        """Start serving (idempotent)."""
        with self._lock:
            if self._httpd is None:
                httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
                httpd.daemon_threads = True
                thread = threading.Thread(
                    target=httpd.serve_forever,
                    args=(0.05,),
                    name="scripted-openai-server",
                    daemon=True,
                )
                thread.start()
                self._httpd, self._thread = httpd, thread
        return self

    def close(self) -> None:
        """Stop serving and free the port."""
        with self._lock:
            httpd, thread = self._httpd, self._thread
            self._httpd = self._thread = None
        if httpd is not None and thread is not None:
            httpd.shutdown()
            httpd.server_close()
            thread.join()

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- what tests read and set --------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``; :class:`RuntimeError` before :meth:`start`."""
        httpd = self._httpd
        if httpd is None:
            raise RuntimeError("the server is not running")
        return f"http://127.0.0.1:{httpd.server_address[1]}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A copy of the chat-completions request bodies received so far."""
        with self._lock:
            return list(self._requests)

    def last_conversation(self) -> list[str]:
        """The text of each message of the last request received, its system messages
        aside: the conversation the model was sent."""
        with self._lock:
            body = self._requests[-1]
        return [str(m.get("content")) for m in body["messages"] if m.get("role") != "system"]

    def sent_counts(self, texts: Mapping[str, str]) -> dict[str, int]:
        """How many times the last request received holds each of ``texts`` (by name; the
        names of those it does not hold are left out): which documents the model was sent,
        and whether any was sent twice."""
        with self._lock:
            body = json.dumps(self._requests[-1]["messages"], ensure_ascii=False)
        counts = {name: body.count(json.dumps(text)[1:-1]) for name, text in texts.items()}
        return {name: n for name, n in counts.items() if n}

    def set_script(self, script: Sequence[ScriptedResponse] | ScriptFunction) -> None:
        """Replace the script (what is left of a list is discarded)."""
        with self._lock:
            self._script = script if callable(script) else list(script)

    # -- answering ----------------------------------------------------------------------------

    def _next(self, body: dict[str, Any]) -> ScriptedResponse:
        with self._lock:
            self._requests.append(body)
            script = self._script
            if not callable(script):
                if not script:
                    raise _RequestError(500, "the script has no response left", "server_error")
                return script.pop(0)
        try:
            return script(body)
        except Exception as exc:
            raise _RequestError(500, f"the script failed: {exc!r}", "server_error") from exc

    def _new_id(self) -> str:
        with self._lock:
            return f"chatcmpl-{next(self._ids)}"

    def completion(self, body: dict[str, Any], reply: ScriptedResponse) -> dict[str, Any]:
        """The ``chat.completion`` object for ``reply`` to ``body``."""
        message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in reply.tool_calls
            ]
        return {
            "id": self._new_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", _MODEL),
            "system_fingerprint": None,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish}
            ],
            "usage": _usage(reply),
        }

    def chunks(self, body: dict[str, Any], reply: ScriptedResponse) -> Iterator[dict[str, Any]]:
        """The ``chat.completion.chunk`` objects streaming ``reply`` to ``body``."""
        options = body.get("stream_options")
        with_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        base = {
            "id": self._new_id(),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model", _MODEL),
            "system_fingerprint": None,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            out = {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if with_usage:
                out["usage"] = None
            return out

        yield chunk({"role": "assistant", "content": ""})
        for piece in _pieces(reply.text or ""):
            yield chunk({"content": piece})
        for index, (cid, name, args) in enumerate(reply.tool_calls):
            head = {"index": index, "id": cid, "type": "function"}
            yield chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
            for piece in _pieces(args):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield chunk({}, reply.finish)
        if with_usage:
            yield {**base, "choices": [], "usage": _usage(reply)}


def _usage(reply: ScriptedResponse) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def _handler_for(server: ScriptedOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: tests read :attr:`ScriptedOpenAIServer.requests` instead."""

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                model = {"id": _MODEL, "object": "model", "created": 0, "owned_by": "ce"}
                self._json(200, {"object": "list", "data": [model]})
            else:
                self._json(404, _error_body(f"no route {self.path}", "invalid_request_error"))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._json(404, _error_body(f"no route {self.path}", "invalid_request_error"))
                return
            try:
                try:
                    parsed = json.loads(raw)
                except ValueError as exc:
                    raise _RequestError(400, f"the body is not JSON: {exc}") from exc
                body = _validate(parsed)
                reply = server._next(body)
            except _RequestError as exc:
                self._json(exc.status, _error_body(str(exc), exc.kind))
                return
            if reply.status != HTTPStatus.OK:
                kind = "invalid_request_error" if reply.status < 500 else "server_error"
                self._json(reply.status, _error_body(reply.text or "scripted error", kind))
            elif body.get("stream"):
                self._stream(body, reply)
            else:
                self._json(200, server.completion(body, reply))

        def _stream(self, body: dict[str, Any], reply: ScriptedResponse) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for chunk in server.chunks(body, reply):
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler
