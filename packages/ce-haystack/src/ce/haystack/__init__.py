"""Context Engine for Haystack 3.x: ``ce.haystack.install(engine)`` hands every chat-generator
call of every Pipeline and Agent (sync, ``run_async`` and streamed; each step of an Agent's
tool loop) the engine's assembled input and records the runs through a tracer chained to the
app's own and the Agent's ``after_tool`` hook; ``install(engine, target=pipeline_or_agent)``
does it for one Pipeline or Agent."""

from __future__ import annotations

from ce.haystack._plugin import HaystackPlugin, install, uninstall

__all__ = ["HaystackPlugin", "install", "uninstall"]
