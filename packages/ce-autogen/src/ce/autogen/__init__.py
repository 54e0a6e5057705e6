"""Context Engine for AutoGen (autogen-agentchat 0.7, what ``pip install pyautogen``
installs): ``ce.autogen.install(engine)`` hands every model call of every ``AssistantAgent``
(tool loops, reflection, teams) the engine's assembled input and records the run;
``install(engine, target=agent_or_team)`` does it for one agent or team."""

from __future__ import annotations

from ce.autogen._plugin import AutoGenPlugin, install, uninstall

__all__ = ["AutoGenPlugin", "install", "uninstall"]
