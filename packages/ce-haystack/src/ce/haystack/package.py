"""The framework range ce-haystack supports: the single source the ``haystack`` extra in
``pyproject.toml`` and the tests agree with."""

from __future__ import annotations

__all__ = ["FRAMEWORK", "LOWEST", "REQUIREMENTS"]

FRAMEWORK = "haystack-ai"
"""The distribution the plugin hooks into."""

REQUIREMENTS: tuple[str, ...] = ("haystack-ai>=3.0,<4",)
"""PEP 508 requirements checked by ``install()`` (and equal to the ``haystack`` extra)."""

LOWEST: dict[str, str] = {"haystack-ai": "3.0.0"}
"""The lowest versions the tests run against (the nox ``tests-haystack`` lowest session):
3.0 is the first release whose ``Agent`` runs ``after_tool`` hooks."""
