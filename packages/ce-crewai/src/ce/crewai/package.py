"""The framework range ce-crewai supports: the single source the ``crewai`` extra in
``pyproject.toml`` and the tests agree with."""

from __future__ import annotations

__all__ = ["FRAMEWORK", "LOWEST", "REQUIREMENTS"]

FRAMEWORK = "crewai"
"""The distribution the plugin hooks into."""

REQUIREMENTS: tuple[str, ...] = ("crewai>=1.15,<2",)
"""PEP 508 requirements checked by ``install()`` (and equal to the ``crewai`` extra)."""

LOWEST: dict[str, str] = {"crewai": "1.15.0"}
"""The lowest versions the tests run against (the nox ``tests-crewai`` lowest session)."""
