"""Test support shipped with ce-core.

:class:`StoreContract` is the pytest suite every :class:`~ce.core.stores.Store` implementation
must pass and :class:`PluginContract` the one every framework plugin must pass; they need
``pytest`` and ``pytest-asyncio`` (extra ``ce-core[testing]``). :class:`ScriptedOpenAIServer`
is an OpenAI-compatible chat-completions server on 127.0.0.1 answering from a script (stdlib
only). Everything is imported on first use, so ``import ce.core.testing`` works without
pytest. :mod:`ce.core.testing.records` holds the record factories the store suite uses;
:mod:`ce.core.testing.load` runs many worker processes on shared sessions of one store and
checks what they left (``python -m ce.core.testing.load``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ce.core.testing.engines import NoBlockingEngine, deterministic_engine, no_blocking
    from ce.core.testing.openai_server import (
        CITY_GUIDES,
        ScriptedOpenAIServer,
        ScriptedResponse,
        numbered_answer,
    )
    from ce.core.testing.plugin_contract import InjectedEngineError, PluginContract
    from ce.core.testing.store_contract import InjectedFailure, StoreContract

__all__ = [
    "CITY_GUIDES",
    "InjectedEngineError",
    "InjectedFailure",
    "NoBlockingEngine",
    "PluginContract",
    "ScriptedOpenAIServer",
    "ScriptedResponse",
    "StoreContract",
    "deterministic_engine",
    "no_blocking",
    "numbered_answer",
]

_MODULES = {
    "CITY_GUIDES": "openai_server",
    "InjectedEngineError": "plugin_contract",
    "InjectedFailure": "store_contract",
    "NoBlockingEngine": "engines",
    "PluginContract": "plugin_contract",
    "ScriptedOpenAIServer": "openai_server",
    "ScriptedResponse": "openai_server",
    "StoreContract": "store_contract",
    "deterministic_engine": "engines",
    "no_blocking": "engines",
    "numbered_answer": "openai_server",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
