"""The framework range ce-autogen supports: the single source the ``autogen`` extra in
``pyproject.toml`` and the tests agree with."""

from __future__ import annotations

__all__ = ["FRAMEWORK", "LOWEST", "REQUIREMENTS"]

FRAMEWORK = "autogen-agentchat"
"""The distribution the plugin hooks into (what ``pip install pyautogen`` installs today)."""

REQUIREMENTS: tuple[str, ...] = ("autogen-agentchat>=0.7,<0.8", "autogen-core>=0.7,<0.8")
"""PEP 508 requirements checked by ``install()`` (and equal to the ``autogen`` extra)."""

LOWEST: dict[str, str] = {
    "autogen-agentchat": "0.7.0",
    "autogen-core": "0.7.0",
    "autogen-ext": "0.7.0",
}
"""The lowest versions the tests run against (the nox ``tests-autogen`` lowest session)."""
