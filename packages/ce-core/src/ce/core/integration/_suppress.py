"""Suppression: calls made inside :func:`suppressed` pass through every plugin untouched."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["is_suppressed", "suppressed"]

_suppressed: ContextVar[bool] = ContextVar("ce_integration_suppressed", default=False)


@contextmanager
def suppressed() -> Iterator[None]:
    """Within this block (this thread / task and what it spawns with a copied context), no
    plugin records or rewrites anything: for the engine's own model calls (the summarizer)
    and helper calls the application wants left alone. Nests."""
    token = _suppressed.set(True)
    try:
        yield
    finally:
        _suppressed.reset(token)


def is_suppressed() -> bool:
    """Whether the current context is inside :func:`suppressed`; every hook checks it first."""
    return _suppressed.get()
