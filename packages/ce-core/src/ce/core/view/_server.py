"""The viewer's HTTP server: the page and its JSON API over one store, on 127.0.0.1.

The store is asynchronous and stays on the event loop that :func:`serve` runs on; the server's
request threads hand each read to that loop and wait for it, so the store is only ever used from
its own loop."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ce.core.cli._common import CliError
from ce.core.errors import ContextEngineError
from ce.core.stores import Store
from ce.core.view import _api

__all__ = ["DEFAULT_PORT", "HOST", "ViewerHTTPServer", "serve"]

HOST = "127.0.0.1"
DEFAULT_PORT = 8765
_REQUEST_TIMEOUT = 120.0  # seconds one API read may take before the request fails
_WAKE_SECONDS = 0.25  # how long a Ctrl-C can wait at most (see serve)
_STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
# The page loads only its own files and talks only to this server; session text is untrusted.
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _static_files() -> dict[str, tuple[bytes, str]]:
    """The page's files by URL path, read once from the package data."""
    folder = resources.files("ce.core.view").joinpath("static")
    files: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _STATIC_TYPES:
            files[f"/static/{entry.name}"] = (entry.read_bytes(), _STATIC_TYPES[suffix])
    files["/"] = files["/static/index.html"]
    return files


class _HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _int_param(query: dict[str, list[str]], name: str, *, minimum: int) -> int | None:
    values = query.get(name)
    if not values or not values[0].strip():
        return None
    try:
        number = int(values[0])
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise _HttpError(
            HTTPStatus.BAD_REQUEST, f"{name} must be an integer >= {minimum}, got {values[0]!r}"
        )
    return number


class ViewerHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that answers the viewer's routes from ``store`` on ``loop``."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], store: Store, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.store = store
        self.loop = loop
        self.static = _static_files()
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"

    def read(self, coroutine: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        """Run ``coroutine`` on the store's loop and wait for its result."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout=_REQUEST_TIMEOUT)

    def route(self, path: str, query: dict[str, list[str]]) -> dict[str, Any]:
        """The JSON document of an ``/api/...`` path (segments percent-decoded)."""
        parts = [unquote(p) for p in path.split("/")[2:]]
        store = self.store
        api: Coroutine[Any, Any, dict[str, Any]] | None = None
        missing = HTTPStatus.NOT_FOUND
        if parts == ["sessions"]:
            user = query.get("user", [None])[0]
            api = _api.sessions_json(store, user)
        elif len(parts) == 2 and parts[0] == "sessions":
            api = _api.session_json(store, parts[1])
        elif len(parts) == 4 and parts[0] == "sessions" and parts[2] == "turns":
            api = _api.turn_json(store, parts[1], parts[3])
        elif len(parts) == 5 and parts[0] == "sessions" and parts[2:5:2] == ["turns", "replay"]:
            budget = _int_param(query, "budget", minimum=1)
            if budget is None:
                raise _HttpError(HTTPStatus.BAD_REQUEST, "replay needs ?budget=N (tokens)")
            reserve = _int_param(query, "reserve", minimum=0)
            model = (query.get("model") or [""])[0].strip() or None
            api = _api.replay_json(store, parts[1], parts[3], budget, model, reserve)
            missing = HTTPStatus.BAD_REQUEST
        if api is None:
            raise _HttpError(HTTPStatus.NOT_FOUND, f"no such API path: {path}")
        try:
            return self.read(api)
        except CliError as exc:
            raise _HttpError(missing, str(exc)) from None


class _Handler(BaseHTTPRequestHandler):
    server: ViewerHTTPServer
    server_version = "ce-view"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the CLI prints the URL once; failures answer as JSON."""

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in _SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: HTTPStatus, document: dict[str, Any]) -> None:
        body = json.dumps(document, ensure_ascii=False).encode()
        self._send(status, body, "application/json; charset=utf-8")

    def _host_ok(self) -> bool:
        """Only requests addressed to this server by a loopback name (a page elsewhere cannot
        reach it through DNS rebinding)."""
        host = (self.headers.get("Host") or "").rpartition(":")[0] or self.headers.get("Host")
        return host in ("127.0.0.1", "localhost", "[::1]")

    def do_GET(self) -> None:
        split = urlsplit(self.path)
        if not self._host_ok():
            self._json(HTTPStatus.FORBIDDEN, {"error": "only loopback host names are served"})
            return
        if not split.path.startswith("/api/"):
            found = self.server.static.get(split.path)
            if found is None:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {split.path}"})
            else:
                self._send(HTTPStatus.OK, *found)
            return
        try:
            document = self.server.route(split.path, parse_qs(split.query))
        except _HttpError as exc:
            self._json(exc.status, {"error": str(exc)})
        except (ContextEngineError, TimeoutError) as exc:
            message = " ".join(str(exc).splitlines()) or type(exc).__name__
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": message})
        else:
            self._json(HTTPStatus.OK, document)

    do_HEAD = do_GET


async def serve(
    store: Store,
    port: int = DEFAULT_PORT,
    *,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the viewer over ``store`` on ``127.0.0.1:port`` (``0``: any free port) until
    cancelled; ``ready`` gets the page's URL once the server listens. The store is read on
    the running loop only, never written. Raises :class:`OSError` when the port is taken."""
    httpd = ViewerHTTPServer((HOST, port), store, asyncio.get_running_loop())
    thread = threading.Thread(target=httpd.serve_forever, name="ce-view", daemon=True)
    thread.start()
    try:
        if ready is not None:
            ready(httpd.url)
        while True:
            # the main thread wakes now and then: Python runs a signal's handler on it once it
            # runs, and a Ctrl-C the kernel delivered to another thread (the server's) would
            # wait for as long as it slept in the loop's select
            await asyncio.sleep(_WAKE_SECONDS)
    finally:
        await asyncio.to_thread(httpd.shutdown)
        httpd.server_close()
