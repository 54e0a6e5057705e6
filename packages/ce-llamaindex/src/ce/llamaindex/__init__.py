"""Context Engine for LlamaIndex: ``ce.llamaindex.install(engine)`` records every run and hands
every LLM chat call the engine's assembled input; ``ce.llamaindex.wrap(llm)`` and
:class:`ContextEngineMemory` are the explicit seams."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ce.llamaindex._plugin import LlamaIndexPlugin, install, uninstall, wrap

if TYPE_CHECKING:
    from ce.llamaindex._memory import ContextEngineMemory

__all__ = ["ContextEngineMemory", "LlamaIndexPlugin", "install", "uninstall", "wrap"]


def __getattr__(name: str) -> Any:
    # ContextEngineMemory subclasses LlamaIndex's BaseMemory: imported on first use, so the
    # package imports without LlamaIndex installed.
    if name == "ContextEngineMemory":
        from ce.llamaindex._memory import ContextEngineMemory

        return ContextEngineMemory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
