"""PatchLedger: every change a plugin makes to a framework, recorded so it can be undone."""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["LedgerEntry", "PatchLedger", "marking"]

logger = logging.getLogger("ce.core.integration")

_MISSING = object()


@dataclass(frozen=True)
class LedgerEntry:
    """One recorded change: ``what`` says what it was (for logs and tests), ``undo`` reverts
    it."""

    what: str
    undo: Callable[[], None]


def _describe(owner: object, attr: str) -> str:
    name = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", None)
    return f"{name or type(owner).__qualname__}.{attr}"


class PatchLedger:
    """Records wraps, callback registrations and subscriptions; :meth:`undo` reverts them all
    in reverse order.

    ``wrap`` restores the exact object that was there: an attribute the owner held itself is
    set back to that very object; one it only inherited (a method defined on a base class, a
    class attribute seen through an instance) is deleted again, so lookup falls through to
    the base as before. Thread-safe.
    """

    def __init__(self) -> None:
        self._entries: list[LedgerEntry] = []
        self._wrapped: dict[tuple[int, str], object] = {}
        self._lock = threading.Lock()

    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        """What is recorded now, oldest first."""
        with self._lock:
            return tuple(self._entries)

    def wrap(self, owner: Any, attr: str, make_replacement: Callable[[Any], Any]) -> Any:
        """Replace ``owner.attr`` with ``make_replacement(original)`` and return ``original``
        (``getattr(owner, attr)``: for a class, the plain function of a method; wrap static
        or class methods yourself). Wrapping the same ``(owner, attr)`` twice without an
        :meth:`undo` in between raises :class:`ValueError`; a missing attribute raises
        :class:`AttributeError`."""
        key = (id(owner), attr)
        with self._lock:
            if key in self._wrapped:
                raise ValueError(f"{_describe(owner, attr)} is already wrapped by this ledger")
            original = getattr(owner, attr)
            own = getattr(owner, "__dict__", None)
            stored = own.get(attr, _MISSING) if own is not None else original
            replacement = make_replacement(original)
            setattr(owner, attr, replacement)
            self._wrapped[key] = owner

            def undo() -> None:
                # what the owner holds itself: getattr would bind a method or a descriptor
                # (a classmethod, a span wrapper) and never be the replacement
                own_now = getattr(owner, "__dict__", None)
                current = (
                    own_now.get(attr, _MISSING)
                    if own_now is not None
                    else getattr(owner, attr, _MISSING)
                )
                if current is not replacement:
                    logger.warning(
                        "%s was replaced by someone else after it was wrapped; restoring the "
                        "original anyway",
                        _describe(owner, attr),
                    )
                if stored is _MISSING:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, stored)
                with self._lock:
                    self._wrapped.pop(key, None)

            self._entries.append(LedgerEntry(f"wrap {_describe(owner, attr)}", undo))
        return original

    def replace(self, owner: type, attr: str, new: Any) -> None:
        """Set the class attribute ``owner.attr`` to ``new`` as it is (a classmethod, a
        staticmethod, a descriptor: what the class holds, not what ``getattr`` returns, unlike
        :meth:`wrap`); undo puts back the very object the class held itself, or deletes
        ``new`` when it held none (lookup falls through to a base class again)."""
        old = vars(owner).get(attr, _MISSING)
        setattr(owner, attr, new)

        def undo() -> None:
            if vars(owner).get(attr, _MISSING) is not new:
                logger.warning(
                    "%s was replaced by someone else after it was wrapped; restoring the "
                    "original anyway",
                    _describe(owner, attr),
                )
            if old is _MISSING:
                if attr in vars(owner):
                    delattr(owner, attr)
            else:
                setattr(owner, attr, old)

        self.register(undo, f"wrap {_describe(owner, attr)}")

    def for_subclasses(self, base: type, add: Callable[[type], None]) -> None:
        """Call ``add(cls)`` for every subclass of ``base`` there is and, until :meth:`undo`,
        for every one created later (through ``base.__init_subclass__``, replaced with
        :meth:`replace`; the class's own hook still runs first). A failing ``add`` is
        logged and never keeps a class from being created."""

        def each(cls: type) -> None:
            try:
                add(cls)
            except Exception:
                logger.warning("cannot patch %s", cls.__qualname__, exc_info=True)

        own = vars(base).get("__init_subclass__")

        def init_subclass(cls: type, /, **kwargs: Any) -> None:
            if isinstance(own, classmethod):
                own.__func__(cls, **kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)  # type: ignore[arg-type]
            each(cls)

        self.replace(base, "__init_subclass__", classmethod(init_subclass))
        seen: set[type] = set()
        stack: list[type] = list(base.__subclasses__())
        while stack:
            sub = stack.pop()
            if sub not in seen:
                seen.add(sub)
                stack.extend(sub.__subclasses__())
                each(sub)

    def register(self, undo: Callable[[], None], what: str) -> None:
        """Record a registration the plugin just made (a callback, a handler, an event-bus
        subscription) with the function that removes it."""
        with self._lock:
            self._entries.append(LedgerEntry(what, undo))

    def undo(self) -> None:
        """Revert everything recorded, newest first, and forget it. Every entry is undone even
        when one fails; the first failure is then raised."""
        with self._lock:
            entries, self._entries = self._entries, []
        first: Exception | None = None
        for entry in reversed(entries):
            try:
                entry.undo()
            except Exception as exc:
                logger.exception("undoing %s failed", entry.what)
                first = first or exc
        if first is not None:
            raise first


class Settable(Protocol):
    """A context variable, or a wrapper of one: ``set`` returns the token ``reset`` takes."""

    def set(self, value: Any, /) -> Any: ...

    def reset(self, token: Any, /) -> None: ...


def marking(var: Settable, value: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A replacement factory for :meth:`PatchLedger.wrap`: the original function (sync or
    async) runs with ``var`` (a ``ContextVar`` or a wrapper of one) set to ``value``, so a
    hook further down (a model call the framework makes there) knows where it runs, e.g. in a
    memory's own work."""

    def factory(original: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(original):

            @functools.wraps(original)
            async def marked_async(*args: Any, **kwargs: Any) -> Any:
                token = var.set(value)
                try:
                    return await original(*args, **kwargs)
                finally:
                    var.reset(token)

            return marked_async

        @functools.wraps(original)
        def marked(*args: Any, **kwargs: Any) -> Any:
            token = var.set(value)
            try:
                return original(*args, **kwargs)
            finally:
                var.reset(token)

        return marked

    return factory
