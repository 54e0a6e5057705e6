"""The persisted session document."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    model_serializer,
    model_validator,
)

from ce.core.schema._enums import (
    AuthorKind,
    BlockType,
    EvidenceType,
    LevelOfDetail,
    ModelUsageStage,
    ModelUsageStatus,
    Priority,
    ProviderKind,
    Role,
    RunStatus,
    SourceKind,
    TaskStatus,
    ToolCallStatus,
    ToolType,
)

__all__ = [
    "Actor",
    "AgentInfo",
    "AudioPart",
    "Author",
    "ContentPart",
    "ContextBlock",
    "Evidence",
    "EvidenceLinks",
    "EvidenceSource",
    "FilePart",
    "ImagePart",
    "LodSections",
    "Message",
    "MessageIndexRange",
    "Meta",
    "ModelInvocation",
    "ModelUsage",
    "Ref",
    "RunState",
    "Section",
    "Session",
    "SessionDocument",
    "Summary",
    "Task",
    "TaskState",
    "TextPart",
    "TodoList",
    "ToolCall",
    "ToolCallRequest",
    "ToolProvider",
    "ToolState",
    "sections_to_text",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


class Author(_Model):
    """Who produced a message (kept for multi-agent audit)."""

    kind: AuthorKind
    id: str


class Ref(_Model):
    """A reference to an evidence of the same session, optionally narrowed by a selector."""

    evidence_id: str
    selector: str | None = None


class Section(_Model):
    """One titled piece of a message at one level of detail."""

    title: str = ""
    body: str


def sections_to_text(sections: list[Section]) -> str:
    """Join sections as Markdown-ish plain text: ``title`` on its own line, then the body."""
    parts = [f"{s.title}\n{s.body}" if s.title else s.body for s in sections]
    return "\n\n".join(parts)


class LodSections(_Model):
    """Live / Summary / Gist renderings of one history entry.

    ``live`` is the full content; ``summary`` and ``gist`` are cheaper renderings. A level that
    is not given falls back to the next richer one.
    """

    live: list[Section] = Field(default_factory=list)
    summary: list[Section] | None = None
    gist: list[Section] | None = None

    def get(self, level: LevelOfDetail) -> list[Section]:
        """The sections for ``level``, falling back gist -> summary -> live."""
        if level is LevelOfDetail.GIST and self.gist is not None:
            return self.gist
        if level in (LevelOfDetail.GIST, LevelOfDetail.SUMMARY) and self.summary is not None:
            return self.summary
        return self.live


class ToolCallRequest(_Model):
    """A tool call declared by an assistant message.

    ``raw_arguments`` always keeps the text the model produced; ``arguments`` holds the parsed
    JSON object when it parsed, else ``parse_error`` says why it did not.
    """

    tool_call_id: str
    name: str
    raw_arguments: str = ""
    arguments: dict[str, Any] | None = None
    parse_error: str | None = None


# -- non-text content (images, files, audio) -------------------------------------------------
#
# A message's text is kept once, in ``content`` (where redaction, Levels of Detail, search and
# the token counter read it). ``parts`` adds what is not text, in order with the text: a
# ``TextPart`` marks where the message's text goes among the other parts (at most one; without
# one, the text comes first). Parts hold their data as the app gave it (a URL, a data URL, the
# provider's base64): nothing is decoded or copied on the way to the model.

MESSAGES_BEFORE = "messages_before"
"""The evidence metadata key under which the engine stores how many messages the session
held when the evidence was stored: the turn it came with (see
:meth:`Summary.withdraws_evidence`)."""

_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)?((?:;[\w.+-]+=[^;,]*)*)(;base64)?,", re.ASCII)


def _check_url(url: str, what: str, media: str | None = None) -> str:
    """``url`` when it is an http(s) URL or a well-formed data URL (of ``media``/* when
    given), else a ValueError naming ``what``."""
    if url.startswith(("https://", "http://")):
        return url
    if url.startswith("data:"):
        match = _DATA_URL.match(url)
        if match is None:
            raise ValueError(f"{what}: malformed data URL")
        mime = match.group(1) or ""
        if media is not None and not mime.startswith(f"{media}/"):
            raise ValueError(f"{what}: a data URL of {media}/* expected, got {mime or 'none'!r}")
        return url
    raise ValueError(f"{what}: an http(s) URL or a data: URL expected, got {url[:40]!r}")


class TextPart(_Model):
    """Where the message's text (its ``content``) goes among its other parts."""

    type: Literal["text"] = "text"


class ImagePart(_Model):
    """An image: ``url`` is an ``https://`` URL or a ``data:image/...;base64,...`` URL;
    ``detail`` is OpenAI's (``auto``, ``low``, ``high``); ``width`` and ``height`` (pixels),
    when known, let the token counter price a remote image exactly (for a data URL it reads
    them from the PNG, JPEG, GIF or WebP header)."""

    type: Literal["image"] = "image"
    url: str
    detail: Literal["auto", "low", "high"] = "auto"
    width: int | None = Field(default=None, gt=0)
    height: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> ImagePart:
        _check_url(self.url, "image part", "image")
        if (self.width is None) != (self.height is None):
            raise ValueError("image part: give both width and height, or neither")
        return self


class FilePart(_Model):
    """A file (a PDF…): inline as ``data`` (a ``data:<mime>;base64,...`` URL), by ``url``,
    or by a provider's ``file_id``; ``filename`` as the app named it."""

    type: Literal["file"] = "file"
    data: str | None = None
    url: str | None = None
    file_id: str | None = None
    filename: str | None = None

    @model_validator(mode="after")
    def _check(self) -> FilePart:
        given = [v for v in (self.data, self.url, self.file_id) if v]
        if len(given) != 1:
            raise ValueError("file part: give exactly one of data, url, file_id")
        if self.data is not None:
            if not self.data.startswith("data:"):
                raise ValueError("file part: data must be a data: URL")
            _check_url(self.data, "file part")
        if self.url is not None and not self.url.startswith(("https://", "http://")):
            raise ValueError("file part: url must be an http(s) URL")
        return self


class AudioPart(_Model):
    """Audio: base64 ``data`` in ``format`` (``wav``, ``mp3``…), as OpenAI's ``input_audio``."""

    type: Literal["audio"] = "audio"
    data: str = Field(min_length=1)
    format: str = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> AudioPart:
        if self.data.startswith("data:"):
            raise ValueError("audio part: data is base64, not a data: URL")
        return self


ContentPart = Annotated[TextPart | ImagePart | FilePart | AudioPart, Field(discriminator="type")]
"""One entry of a message's ``parts``."""


def check_parts(parts: list[ContentPart], info: ValidationInfo) -> list[ContentPart]:
    """``parts`` when well formed for the message being validated, else ValueError: at most
    one text part, and no parts on a system message. Runs only on a list of parts (never for
    ``None``), so text-only messages pay nothing for it."""
    if parts and info.data.get("role") is Role.SYSTEM:
        raise ValueError("a system message cannot carry parts")
    if sum(1 for p in parts if p.type == "text") > 1:
        raise ValueError("parts: at most one text part (it stands for the message's content)")
    return parts


Parts = Annotated[list[ContentPart], AfterValidator(check_parts)]
"""A message's ``parts``: its images, files and audio in order with its text."""


def without_media(text: str, parts: list[ContentPart]) -> str:
    """A message's text when its images, files and audio are left out (at a cheaper Level of
    Detail): a note per part says so (``[image omitted]``)."""
    notes = [f"[{p.type} omitted]" for p in parts if p.type != "text"]
    return "\n".join([text, *notes]) if text else "\n".join(notes)


class ModelInvocation(_Model):
    """Which model produced an output."""

    provider: str
    model: str
    specification: str = ""


class Message(_Model):
    """One entry of the conversation history.

    ``role``, ``content``, ``author``, ``at`` and ``refs``, plus what the history needs: a
    stable ``message_id``; ``tool_calls`` on assistant messages;
    ``tool_call_id`` (and the tool ``name``) on tool messages; optional Level-of-Detail
    sections; the ``invocation`` that produced an assistant message; small ``meta`` data;
    ``parts``, the images, files and audio that go with the text, in order (see
    :class:`TextPart`; ``None`` for a text-only message).
    """

    role: Role
    content: str = ""
    author: Author | None = None
    at: str | None = None
    refs: list[Ref] | None = None
    message_id: str | None = None
    tool_calls: list[ToolCallRequest] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    lod: LodSections | None = None
    invocation: ModelInvocation | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    parts: Parts | None = None

    @model_validator(mode="after")
    def _check_tool_structure(self) -> Message:
        if self.tool_calls and self.role is not Role.ASSISTANT:
            raise ValueError("tool_calls are only allowed on assistant messages")
        if self.role is Role.TOOL and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        if self.tool_call_id is not None and self.role is not Role.TOOL:
            raise ValueError("tool_call_id is only allowed on tool messages")
        return self

    def text_at(self, level: LevelOfDetail) -> str:
        """The message text at ``level`` (the full content when it has no LoD sections)."""
        if self.lod is None or level is LevelOfDetail.LIVE:
            return self.content
        return sections_to_text(self.lod.get(level))


class MessageIndexRange(_Model):
    from_index: int
    to_index: int


class ClearedHistory(_Model):
    """What the session held when the app cleared its history to start over (see
    ``ContextEngine.clear_history``): its first ``messages`` messages and first ``evidences``
    evidences are no longer sent, and what the app passes after the clear is matched only
    against the messages after them (a message it held before, passed again, is new)."""

    messages: int = Field(ge=0)
    evidences: int = Field(ge=0)


class WithdrawnTurns(_Model):
    """Turns the app took back by going back in its conversation (an answer it asked again
    for, a message it edited, a conversation resumed from an earlier point: see
    ``ContextEngine.prepare_call(..., rewind=True)``): ``session.messages[from_index:to_index]``
    are no longer sent (they stay stored) and are not matched against what the app passes
    (a message among them, passed again, is new).

    The evidences stored while the session held ``from_index`` to ``to_index - 1`` messages
    (the documents retrieved for those turns: ``metadata["messages_before"]``, see
    :meth:`withdraws_evidence`) are withdrawn with them, but for ``kept_evidences``: those
    the app's conversation as it went back still quotes (a document retrieved again for the
    message that replaced them)."""

    from_index: int = Field(ge=0)
    to_index: int = Field(ge=0)
    kept_evidences: list[str] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _without_empty_kept(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and "kept_evidences" in data and not data["kept_evidences"]:
            del data["kept_evidences"]
        return data


class Summary(_Model):
    """What stands for the oldest messages of the session: ``session.messages[:to_index+1]``
    are no longer sent to the model (they stay stored).

    ``source="engine"``: the engine's rolling summary, which renders as a summary block in
    place of ``messages[from_index:to_index+1]``; the engine's input leaves out the messages
    before ``from_index`` too (none, unless the app cut its history before the engine
    summarized: those the app removed).
    ``source="app"``: the app removed ``messages[:to_index+1]`` from its own history (see
    ``ContextEngine.cut_history``); it carries what it keeps of them in its own prompt, so
    nothing renders in their place and ``content`` is empty. A document without ``source``
    reads as ``"engine"``, and an engine summary is stored without it.
    ``cleared``: the app's latest clear of its whole history, if any (stored only then).
    ``withdrawn``: the turns the app took back, oldest first, apart (stored only when there
    are some); a session whose app only took turns back has a summary with ``source="app"``
    that removes no message (``to_index`` -1)."""

    content: str
    updated_at: str
    message_index_range: MessageIndexRange
    evidence_ids: list[str] = Field(default_factory=list)
    source: Literal["engine", "app"] = "engine"
    cleared: ClearedHistory | None = None
    withdrawn: list[WithdrawnTurns] = Field(default_factory=list)

    def withdraws(self, position: int) -> bool:
        """Whether the message at ``position`` is in turns the app took back."""
        return any(w.from_index <= position < w.to_index for w in self.withdrawn)

    def withdraws_evidence(self, evidence: Evidence) -> bool:
        """Whether ``evidence`` came with turns the app took back: stored while the session
        held the messages before one of them (``metadata["messages_before"]``, written by
        the engine) and not among the span's ``kept_evidences``."""
        held = evidence.metadata.get(MESSAGES_BEFORE)
        if not isinstance(held, int) or isinstance(held, bool):
            return False
        for span in self.withdrawn:
            if span.from_index <= held < span.to_index:
                return evidence.evidence_id not in span.kept_evidences
        return False

    @property
    def removed_by_app(self) -> int:
        """How many of the session's first messages the app removed from its history: every
        message the summary stands for when the app made it, those before its range when
        the engine did."""
        if self.source == "app":
            return self.message_index_range.to_index + 1
        return self.message_index_range.from_index

    @model_serializer(mode="wrap")
    def _without_default_source(self, handler: SerializerFunctionWrapHandler) -> Any:
        # an engine summary is stored as before the field existed: a process of an older
        # ce-core (whose models forbid unknown fields) still reads the session
        data = handler(self)
        if isinstance(data, dict):
            if data.get("source") == "engine":
                del data["source"]
            if "cleared" in data and data["cleared"] is None:
                del data["cleared"]
            if "withdrawn" in data and not data["withdrawn"]:
                del data["withdrawn"]
        return data


class Task(_Model):
    task_id: str
    name: str
    status: TaskStatus = TaskStatus.PENDING
    depends_on: list[str] = Field(default_factory=list)
    result_evidence_ids: list[str] = Field(default_factory=list)
    error: str = ""


class TodoList(_Model):
    tasks: list[Task] = Field(default_factory=list)


class TaskState(_Model):
    todo_list: TodoList = Field(default_factory=TodoList)


class ToolProvider(_Model):
    kind: ProviderKind
    name: str = ""
    uri: str = ""


class ToolCall(_Model):
    """The record of one tool run with its terminal status."""

    tool_call_id: str
    tool: str
    provider: ToolProvider
    type: ToolType = ToolType.TOOL
    called_at: str = ""
    args_digest: dict[str, Any] = Field(default_factory=dict)
    status: ToolCallStatus = ToolCallStatus.SUCCESS
    duration_ms: int = 0
    result_evidence_ids: list[str] = Field(default_factory=list)
    task_id: str | None = None


class ToolState(_Model):
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ModelUsage(_Model):
    model_usage_id: str
    provider: str
    model: str
    stage: ModelUsageStage = ModelUsageStage.OTHER
    params: dict[str, Any] = Field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    first_token_latency_ms: int | None = None
    latency_ms: int = 0
    status: ModelUsageStatus = ModelUsageStatus.SUCCESS
    error: str = ""
    task_id: str | None = None


class RunState(_Model):
    """The current run of the session."""

    run_id: str | None = None
    status: RunStatus = RunStatus.IDLE
    last_error: str = ""


class Session(_Model):
    session_id: str = Field(min_length=1)
    messages: list[Message] = Field(default_factory=list)
    summary: Summary | None = None
    task_state: TaskState = Field(default_factory=TaskState)
    tool_state: ToolState = Field(default_factory=ToolState)
    model_usage: list[ModelUsage] = Field(default_factory=list)
    run: RunState = Field(default_factory=RunState)


class EvidenceSource(_Model):
    kind: SourceKind
    name: str = ""
    uri: str = ""


class EvidenceLinks(_Model):
    model_usage_id: str | None = None
    tool_call_id: str | None = None


class Evidence(_Model):
    evidence_id: str
    type: EvidenceType
    source: EvidenceSource
    content: str = ""
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    metadata: dict[str, Any] = Field(default_factory=dict)
    links: EvidenceLinks = Field(default_factory=EvidenceLinks)
    created_at: str | None = None


_JSON_START = re.compile(r"\s*[\[{]")  # what str.lstrip() skips, then [ or {


def may_state_facts(evidence: Evidence) -> bool:
    """Whether conflict detection may read facts from ``evidence``: JSON content (an object
    or array) or a document's ``entity`` / ``field`` metadata; never a model's own output or
    the unredacted original of another evidence. Stores keep this per evidence so a reader
    of part of a session can still take in every evidence that states facts."""
    if evidence.type is EvidenceType.LLM_OUTPUT or "original_of" in evidence.metadata:
        return False
    meta = evidence.metadata
    entity, name = meta.get("entity"), meta.get("field")
    if isinstance(entity, str) and isinstance(name, str) and entity and name:
        return True
    return _JSON_START.match(evidence.content) is not None


def evidence_link(evidence: Evidence) -> str | None:
    """What ``evidence`` belongs to in the history, if anything: the tool call it is the
    result (or a retrieved document) of, or the message it summarizes (an ``llm_output``
    whose metadata ``summary_of`` names the message's id). Stores keep this per evidence so
    a reader of the newest messages finds the evidence that goes with them."""
    if evidence.links.tool_call_id:
        return evidence.links.tool_call_id
    summarized = evidence.metadata.get("summary_of")
    return summarized if isinstance(summarized, str) and summarized else None


class ContextBlock(_Model):
    block_id: str
    block_type: BlockType
    priority: Priority
    token_estimate: int = 0
    content: str = ""
    refs: list[Ref] = Field(default_factory=list)


class AgentInfo(_Model):
    agent_id: str
    name: str = ""
    version: str = ""


class Actor(_Model):
    user_id: str = ""
    user_role: str = ""
    agent: AgentInfo | None = None


class Meta(_Model):
    locale: str = ""
    created_at: str = ""
    updated_at: str = ""
    actor: Actor | None = None


class SessionDocument(_Model):
    """The whole persisted state of one session."""

    schema_version: str
    session: Session
    evidences: dict[str, Evidence] = Field(default_factory=dict)
    context_blocks: list[ContextBlock] = Field(default_factory=list)
    meta: Meta | None = None

    @model_validator(mode="after")
    def _check_ids(self) -> SessionDocument:
        for key, evidence in self.evidences.items():
            if key != evidence.evidence_id:
                raise ValueError(
                    f"evidences key {key!r} differs from its evidence_id {evidence.evidence_id!r}"
                )
        seen: set[str] = set()
        for block in self.context_blocks:
            if block.block_id in seen:
                raise ValueError(f"duplicate context block id {block.block_id!r}")
            seen.add(block.block_id)
        return self
