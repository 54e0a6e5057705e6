"""The framework range ce-langchain supports: the single source the ``langchain`` extra in
``pyproject.toml`` and the tests agree with."""

from __future__ import annotations

__all__ = ["FRAMEWORK", "LOWEST", "REQUIREMENTS"]

FRAMEWORK = "langchain-core"
"""The distribution the plugin hooks into."""

REQUIREMENTS: tuple[str, ...] = ("langchain-core>=1.0,<2",)
"""PEP 508 requirements checked by ``install()`` (and equal to the ``langchain`` extra)."""

LOWEST: dict[str, str] = {"langchain-core": "1.0.0", "langchain": "1.0.0"}
"""The lowest versions the tests run against (the nox ``tests-langchain`` lowest session)."""
