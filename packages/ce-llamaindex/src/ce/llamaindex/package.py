"""The framework range ce-llamaindex supports: the single source the ``llamaindex`` extra in
``pyproject.toml`` and the tests agree with."""

from __future__ import annotations

__all__ = ["FRAMEWORK", "LOWEST", "REQUIREMENTS"]

FRAMEWORK = "llama-index-core"
"""The distribution the plugin hooks into."""

REQUIREMENTS: tuple[str, ...] = ("llama-index-core>=0.14,<0.15",)
"""PEP 508 requirements checked by ``install()`` (and equal to the ``llamaindex`` extra)."""

LOWEST: dict[str, str] = {
    "llama-index-core": "0.14.0",
    "llama-index-workflows": "2.0.0",
    "llama-index-llms-openai": "0.5.6",  # the newest that imports with llama-index-core 0.14.0
}
"""The lowest versions the tests run against (the nox ``tests-llamaindex`` lowest session)."""
