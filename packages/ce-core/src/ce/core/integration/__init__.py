"""The framework-independent kit every plugin is built on.

:class:`Plugin` (install / uninstall template methods, one instance per class, version
check), :class:`PatchLedger` (every hook recorded and undone), :func:`suppressed`,
:func:`guarded` (fail-open), :func:`resolve_session`, the neutral records and their
:class:`Recorder` (:func:`record_sync` from blocking hooks), conversion between assembled
input and OpenAI-style message dicts, and :func:`prepare_openai` /
:func:`prepare_openai_sync` (a guarded ``prepare_call`` on such dicts).
"""

from ce.core.integration._convert import (
    assembled_to_openai,
    message_from_openai,
    message_from_part,
    openai_to_messages,
)
from ce.core.integration._guard import INTEGRATION_FAILED, guarded, guarded_sync
from ce.core.integration._inject import augment_openai, prepare_openai, prepare_openai_sync
from ce.core.integration._ledger import LedgerEntry, PatchLedger
from ce.core.integration._mappers import (
    EvidenceDraft,
    ModelCall,
    Recorder,
    RetrievalHit,
    ToolRun,
    error_text,
    evidence_from_hit,
    llm_output_evidence,
    model_usage_from_call,
    record_sync,
    tool_call_from_run,
    tool_result_evidence,
    tool_status,
)
from ce.core.integration._plugin import (
    InjectMode,
    Plugin,
    PluginVersionError,
    requirement_conflicts,
)
from ce.core.integration._sessions import DEFAULT_SESSION_ID, resolve_session
from ce.core.integration._suppress import is_suppressed, suppressed

__all__ = [
    "DEFAULT_SESSION_ID",
    "INTEGRATION_FAILED",
    "EvidenceDraft",
    "InjectMode",
    "LedgerEntry",
    "ModelCall",
    "PatchLedger",
    "Plugin",
    "PluginVersionError",
    "Recorder",
    "RetrievalHit",
    "ToolRun",
    "assembled_to_openai",
    "augment_openai",
    "error_text",
    "evidence_from_hit",
    "guarded",
    "guarded_sync",
    "is_suppressed",
    "llm_output_evidence",
    "message_from_openai",
    "message_from_part",
    "model_usage_from_call",
    "openai_to_messages",
    "prepare_openai",
    "prepare_openai_sync",
    "record_sync",
    "requirement_conflicts",
    "resolve_session",
    "suppressed",
    "tool_call_from_run",
    "tool_result_evidence",
    "tool_status",
]
