"""The framework-independent kit every plugin is built on.

:class:`Plugin` (install / uninstall template methods, one instance per class, version
check), :class:`PatchLedger` (every hook recorded and undone), :func:`suppressed`,
:func:`guarded` (fail-open), :func:`resolve_scope` (which session a call belongs to), the
neutral records and their :class:`Recorder` (:func:`record_sync` from blocking hooks),
conversion between assembled input and OpenAI-style message dicts, and
:func:`prepare_openai` / :func:`prepare_openai_sync` (a guarded ``prepare_call`` on such
dicts, falling back to the framework's own messages redacted), and
:func:`tool_chains_as_text` (tool calls and results as plain text, for a request without
tools), and :func:`peer_turns_as_user` (in a session several agents share, another agent's
turns shown to an agent as that agent's, not its own).
"""

from ce.core._flatten import peer_turns_as_user, tool_chains_as_text
from ce.core.integration._asked import AskedToolCalls, arguments_key
from ce.core.integration._convert import (
    assembled_to_openai,
    content_with_media,
    message_from_openai,
    message_from_part,
    openai_to_messages,
)
from ce.core.integration._guard import (
    INTEGRATION_FAILED,
    REDACTION_FAILED,
    emit_failure,
    emit_failure_sync,
    fail_open,
    fail_open_sync,
    guarded,
    guarded_sync,
    redacted_or_reported,
    redacted_or_reported_sync,
)
from ce.core.integration._history import History, HistoryMemo
from ce.core.integration._inject import (
    augment_openai,
    prepare_openai,
    prepare_openai_sync,
    redact_openai,
)
from ce.core.integration._ledger import LedgerEntry, PatchLedger, marking
from ce.core.integration._mappers import (
    CLEAR_HISTORY,
    EvidenceDraft,
    ModelCall,
    Recorder,
    RetrievalHit,
    ToolRun,
    clear_sessions,
    clear_sessions_sync,
    error_text,
    evidence_from_hit,
    llm_output_evidence,
    model_usage_from_call,
    provider_of,
    record_awaited,
    record_run_ended,
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
from ce.core.integration._reconcile import (
    Reconciled,
    SentMessages,
    openai_key,
    reconcile_openai,
)
from ce.core.integration._rewrites import RewriteMemo
from ce.core.integration._runs import RunConversations
from ce.core.integration._sessions import (
    RUN_SESSION_PREFIX,
    SESSION_KEY,
    ObjectSessions,
    Scope,
    ScopeSource,
    ToolScopeIds,
    child_session_id,
    resolve_scope,
    run_session_id,
)
from ce.core.integration._suppress import is_suppressed, suppressed

__all__ = [
    "CLEAR_HISTORY",
    "INTEGRATION_FAILED",
    "REDACTION_FAILED",
    "RUN_SESSION_PREFIX",
    "SESSION_KEY",
    "AskedToolCalls",
    "EvidenceDraft",
    "History",
    "HistoryMemo",
    "InjectMode",
    "LedgerEntry",
    "ModelCall",
    "ObjectSessions",
    "PatchLedger",
    "Plugin",
    "PluginVersionError",
    "Reconciled",
    "Recorder",
    "RetrievalHit",
    "RewriteMemo",
    "RunConversations",
    "Scope",
    "ScopeSource",
    "SentMessages",
    "ToolRun",
    "ToolScopeIds",
    "arguments_key",
    "assembled_to_openai",
    "augment_openai",
    "child_session_id",
    "clear_sessions",
    "clear_sessions_sync",
    "content_with_media",
    "emit_failure",
    "emit_failure_sync",
    "error_text",
    "evidence_from_hit",
    "fail_open",
    "fail_open_sync",
    "guarded",
    "guarded_sync",
    "is_suppressed",
    "llm_output_evidence",
    "marking",
    "message_from_openai",
    "message_from_part",
    "model_usage_from_call",
    "openai_key",
    "openai_to_messages",
    "peer_turns_as_user",
    "prepare_openai",
    "prepare_openai_sync",
    "provider_of",
    "reconcile_openai",
    "record_awaited",
    "record_run_ended",
    "record_sync",
    "redact_openai",
    "redacted_or_reported",
    "redacted_or_reported_sync",
    "requirement_conflicts",
    "resolve_scope",
    "run_session_id",
    "suppressed",
    "tool_call_from_run",
    "tool_chains_as_text",
    "tool_result_evidence",
    "tool_status",
]
