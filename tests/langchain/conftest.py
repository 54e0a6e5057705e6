"""Shared fixtures of the ce-langchain tests: they drive the real framework (skipped when
LangChain is not installed, e.g. in the core-only virtualenv)."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain")
