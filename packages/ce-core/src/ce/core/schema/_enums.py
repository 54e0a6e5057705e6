"""Enumerations of the session schema.

Every enum is a ``str`` enum and serializes as its string value.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "AuthorKind",
    "BlockType",
    "EvidenceType",
    "LevelOfDetail",
    "ModelUsageStage",
    "ModelUsageStatus",
    "Priority",
    "ProviderKind",
    "Role",
    "RunStatus",
    "SourceKind",
    "TaskStatus",
    "ToolCallStatus",
    "ToolType",
]


class Role(str, Enum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


ROLE_TEXT: dict[Role | str, str] = {role: role.value for role in Role}
"""Each role's text, read without the enum's ``value`` descriptor (slow on a per-message
path); a plain string maps to nothing."""


class AuthorKind(str, Enum):
    USER = "user"
    AGENT = "agent"
    TOOL = "tool"
    SYSTEM = "system"


class EvidenceType(str, Enum):
    RAG_DOC = "rag_doc"
    TOOL_RESULT = "tool_result"
    SKILL_OUTPUT = "skill_output"
    LLM_OUTPUT = "llm_output"
    USER_INPUT = "user_input"
    OTHER = "other"


class SourceKind(str, Enum):
    RAG = "rag"
    TOOL = "tool"
    SKILL = "skill"
    LLM = "llm"
    USER = "user"
    SYSTEM = "system"


class BlockType(str, Enum):
    INSTRUCTION = "instruction"
    CONVERSATION = "conversation"
    STATE = "state"
    PLAN = "plan"
    EVIDENCE = "evidence"
    MEMORY = "memory"


class Priority(str, Enum):
    MUST = "must"
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class ToolCallStatus(str, Enum):
    SUCCESS = "success"
    TIMEOUT = "timeout"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    ERROR = "error"


class ProviderKind(str, Enum):
    BUILTIN = "builtin"
    MCP = "mcp"
    OTHER = "other"


class ToolType(str, Enum):
    TOOL = "tool"
    SKILL = "skill"
    FUNCTION_CALL = "function_call"


class ModelUsageStage(str, Enum):
    ROUTE = "route"
    PLAN = "plan"
    TOOL_CALL = "tool_call"
    ANSWER = "answer"
    SUMMARIZE = "summarize"
    OTHER = "other"


class ModelUsageStatus(str, Enum):
    SUCCESS = "success"
    ERROR = "error"


class TaskStatus(str, Enum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class RunStatus(str, Enum):
    """The status of a session's current run."""

    IDLE = "idle"
    PREPARING = "preparing"
    MODEL_RUNNING = "model_running"
    TOOL_RUNNING = "tool_running"
    AWAITING_HUMAN = "awaiting_human"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"


class LevelOfDetail(str, Enum):
    """How much of a history entry to show: Live > Summary > Gist."""

    LIVE = "live"
    SUMMARY = "summary"
    GIST = "gist"
