"""The framework range ce-semantic-kernel supports: the single source the ``semantic-kernel``
extra in ``pyproject.toml`` and the tests agree with."""

from __future__ import annotations

__all__ = ["FRAMEWORK", "LOWEST", "REQUIREMENTS"]

FRAMEWORK = "semantic-kernel"
"""The distribution the plugin hooks into."""

REQUIREMENTS: tuple[str, ...] = ("semantic-kernel>=1.35,<2",)
"""PEP 508 requirements checked by ``install()`` (and equal to the ``semantic-kernel`` extra)."""

LOWEST: dict[str, str] = {"semantic-kernel": "1.35.0"}
"""The lowest versions the tests run against (the nox ``tests-semantic-kernel`` lowest
session)."""
