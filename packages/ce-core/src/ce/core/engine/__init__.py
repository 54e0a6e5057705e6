"""The ContextEngine: two-phase turns, budgeted assembly, evidence, redaction, events."""

from ce.core.engine._engine import ContextEngine, current_session_id
from ce.core.engine._sync import SyncEngine

__all__ = ["ContextEngine", "SyncEngine", "current_session_id"]
