"""What the viewer's tests share besides fixtures: its server in a thread, and GET."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from ce.core.stores import open_store
from ce.core.view import serve


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

    async def start() -> asyncio.Task[None]:
        task = asyncio.create_task(main())
        task.add_done_callback(lambda _: ready.put(None))
        return task

    async def stop(task: asyncio.Task[None]) -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    task = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=60)
    try:
        page = ready.get(timeout=60)
        if page is None:
            task.result()  # the server failed to start: raise why
            raise RuntimeError("the viewer stopped before it served")
        yield page
    finally:
        asyncio.run_coroutine_threadsafe(stop(task), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=60)
        loop.close()


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
