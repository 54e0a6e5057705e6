"""The current version of the persisted session document."""

from __future__ import annotations

__all__ = ["SCHEMA_VERSION"]

SCHEMA_VERSION = "1.0"
