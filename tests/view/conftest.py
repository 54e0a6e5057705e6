"""Fixtures of the viewer's tests: the demo sessions in an SQLite store, and ``ce view``'s
server over it on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from view_demo import build

from ce.core.stores import open_store
from ce.core.view import serve


@pytest.fixture(scope="session")
def demo_store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An SQLite store holding the demo sessions (built once per test run)."""
    path = tmp_path_factory.mktemp("view") / "sessions.db"
    url = f"sqlite:///{path}"
    asyncio.run(build(url))
    return url


@contextlib.contextmanager
def running_viewer(url: str) -> Iterator[str]:
    """``ce view``'s server over the store at ``url`` on a free port (its own loop thread,
    as the CLI's main loop would be); yields the page's URL, then stops it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="viewer-loop", daemon=True)
    thread.start()
    ready: queue.Queue[str | None] = queue.Queue()

    async def main() -> None:
        store = open_store(url)
        try:
            await serve(store, 0, ready=ready.put)
        finally:
            await store.close()

    future = asyncio.run_coroutine_threadsafe(main(), loop)
    future.add_done_callback(lambda _: ready.put(None))
    try:
        page = ready.get(timeout=60)
        if page is None:
            future.result()  # the server failed to start: raise why
            raise RuntimeError("the viewer stopped before it served")
        yield page
    finally:
        future.cancel()
        with contextlib.suppress(Exception):
            future.result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=60)
        loop.close()


@pytest.fixture(scope="session")
def viewer_url(demo_store_url: str) -> Iterator[str]:
    with running_viewer(demo_store_url) as page:
        yield page


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    """GET ``url``: status, the body (parsed when JSON) and the headers."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, body, head = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        status, body, head = exc.code, exc.read(), dict(exc.headers)
    if head.get("Content-Type", "").startswith("application/json"):
        return status, json.loads(body), head
    return status, body.decode(), head


@pytest.fixture
def api(viewer_url: str) -> Callable[[str], Any]:
    """GET an API path of the running viewer; its JSON (the status must be 200)."""

    def get(path: str) -> Any:
        status, body, _ = fetch(viewer_url.rstrip("/") + path)
        assert status == 200, body
        return body

    return get


@pytest.fixture(scope="session")
def screenshots_dir() -> Path | None:
    """Where the browser test saves its screenshots: ``$CE_VIEW_SCREENSHOTS`` (e.g.
    ``docs/images``), else nowhere."""
    import os

    target = os.environ.get("CE_VIEW_SCREENSHOTS")
    return Path(target) if target else None
