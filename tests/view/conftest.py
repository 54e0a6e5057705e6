"""Fixtures of the viewer's tests: the demo sessions in an SQLite store, and ``ce view``'s
server over it on a free loopback port."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from view_demo import build
from view_support import fetch, running_viewer


@pytest.fixture(scope="session")
def demo_store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An SQLite store holding the demo sessions (built once per test run)."""
    path = tmp_path_factory.mktemp("view") / "sessions.db"
    url = f"sqlite:///{path}"
    asyncio.run(build(url))
    return url


@pytest.fixture(scope="session")
def viewer_url(demo_store_url: str) -> Iterator[str]:
    with running_viewer(demo_store_url) as page:
        yield page


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
    target = os.environ.get("CE_VIEW_SCREENSHOTS")
    return Path(target) if target else None
