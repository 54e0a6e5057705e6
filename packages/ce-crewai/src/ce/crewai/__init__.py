"""Context Engine for CrewAI 1.x: ``ce.crewai.install(engine)`` hands every agent LLM call of
every crew (each step of the ReAct text loop and of native tool calling, ``kickoff`` and
``akickoff``) the engine's assembled input and records tasks, model calls and tool runs from
CrewAI's event bus."""

from __future__ import annotations

from ce.crewai._plugin import CrewAIPlugin, install, uninstall

__all__ = ["CrewAIPlugin", "install", "uninstall"]
