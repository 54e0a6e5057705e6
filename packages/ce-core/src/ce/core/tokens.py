"""Token estimation (seed 004 §6.2, DESIGN.md §5).

Two estimators implement :class:`TokenEstimator`:

* :class:`TiktokenEstimator` counts exactly with tiktoken for OpenAI-family models, adds
  OpenAI's per-message chat overhead, and hands every other model to a fallback estimator.
  tiktoken is the optional extra ``ce-core[tiktoken]``; without it (or without its encoding
  files) the estimator degrades to the fallback and reports it once per encoding.
* :class:`CharBasedEstimator` approximates from characters and words; it needs no tokenizer.

Both cache text counts by content in a bounded LRU, so a turn costs work proportional to the
text that is new, not to the whole history. Message accounting follows OpenAI's chat format
(the ``num_tokens_from_messages`` rule of the OpenAI cookbook): every message costs
``TOKENS_PER_MESSAGE`` plus its role and content, a ``name`` costs ``TOKENS_PER_NAME`` more,
and every reply is primed with ``REPLY_PRIMING_TOKENS``.

A message's images, files and audio (its ``parts``) cost what :func:`part_tokens` says:
OpenAI's published image rule for the models it covers, documented estimates otherwise (see
that function and ``docs/concepts/multimodal.md``).
"""

from __future__ import annotations

import binascii
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ce.core.schema import (
    AudioPart,
    ContentPart,
    FilePart,
    ImagePart,
    Message,
    MessagePart,
    Role,
    ToolCallRequest,
)

if TYPE_CHECKING:
    from tiktoken import Encoding

__all__ = [
    "AUDIO_TOKENS_PER_SECOND",
    "DEFAULT_ENCODING",
    "FILE_PAGE_TOKENS",
    "FILE_UNKNOWN_TOKENS",
    "IMAGE_ESTIMATE_MAX_TOKENS",
    "REPLY_PRIMING_TOKENS",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_NAME",
    "TOKENS_PER_TOOL_CALL",
    "TOOLS_OVERHEAD_TOKENS",
    "CharBasedEstimator",
    "DegradedCallback",
    "TiktokenEstimator",
    "TokenEstimator",
    "image_size",
    "openai_encoding_for",
    "openai_image_tokens",
    "part_tokens",
]

TOKENS_PER_MESSAGE = 3
"""``<|start|>{role}<|message|>…<|end|>`` framing of one chat message (OpenAI cookbook)."""
TOKENS_PER_NAME = 1
"""Extra cost of a message ``name`` beyond its own text."""
REPLY_PRIMING_TOKENS = 3
"""Every reply is primed with ``<|start|>assistant<|message|>``."""
TOKENS_PER_TOOL_CALL = 3
"""Framing of one assistant tool call, beyond its name and raw JSON arguments (measured
against the API for ``function_call`` messages)."""
TOOLS_OVERHEAD_TOKENS = 9
"""Framing of the rendered function definitions, beyond their text (measured likewise)."""
DEFAULT_ENCODING = "o200k_base"
"""The encoding used when no model hint is given: that of every current OpenAI chat model."""

DegradedCallback = Callable[[str, str], None]
"""``on_degraded(reason, detail)``; reason is ``"tokenizer_unavailable"``."""

# Texts longer than this are tokenized in pieces split before a space, because tiktoken's
# pre-tokenizer panics (a BaseException) on single runs of a few hundred thousand characters.
_ENCODE_CHUNK_CHARS = 65_536
# The cache also bounds the characters its keys keep alive (it holds the texts themselves).
_CACHE_MAX_CHARS = 32 * 1024 * 1024


@runtime_checkable
class TokenEstimator(Protocol):
    """Counts the tokens a model input costs. Pure computation: synchronous, no I/O.

    ``model_hint`` names the target model (``"gpt-4o"``, ``"claude-sonnet-4"``…); an
    estimator picks its tokenizer from it.
    """

    def estimate_text(self, text: str, model_hint: str | None = None) -> int:
        """Tokens of ``text`` alone; 0 only for the empty string."""
        ...

    def estimate_message(self, role: Role, content: str, model_hint: str | None = None) -> int:
        """One chat message: its content, role and per-message overhead."""
        ...

    def estimate_part(self, part: MessagePart, model_hint: str | None = None) -> int:
        """One chat message of an assembled input, with its overhead, ``name`` and the
        assistant's tool calls (name plus raw JSON arguments each). No reply priming."""
        ...

    def estimate_messages(self, messages: list[Message], model_hint: str | None = None) -> int:
        """A whole prompt of ``messages``: every message plus the reply priming."""
        ...

    def estimate_tools(
        self, tool_schemas: Sequence[dict[str, Any]], model_hint: str | None = None
    ) -> int:
        """What an OpenAI-style ``tools=[{"type": "function", "function": {...}}]`` list
        costs in the prompt (bare function dicts are accepted too); 0 for no tools."""
        ...

    def reply_priming(self, model_hint: str | None = None) -> int:
        """Tokens added once per request to prime the model's reply."""
        ...


class _CountCache:
    """A bounded LRU of token counts keyed by ``(namespace, text)``.

    A hit is a dict lookup plus a move to the recent end; it never re-tokenizes. Entries are
    evicted oldest first when the cache holds more than ``maxsize`` texts or more than
    ``_CACHE_MAX_CHARS`` characters. Safe to share between threads: misses are serialized,
    hits are lock-free.
    """

    __slots__ = ("_chars", "_data", "_lock", "_maxsize")

    def __init__(self, maxsize: int) -> None:
        if maxsize < 0:
            raise ValueError("cache_size must be >= 0")
        self._data: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._maxsize = maxsize
        self._chars = 0
        self._lock = threading.Lock()

    def count(self, namespace: str, text: str, compute: Callable[[str], int]) -> int:
        key = (namespace, text)
        data = self._data
        cached = data.get(key)
        if cached is not None:
            try:  # noqa: SIM105 - contextlib.suppress would triple the cost of a hit
                data.move_to_end(key)
            except KeyError:  # evicted by another thread since the lookup
                pass
            return cached
        value = compute(text)
        size = len(text)
        if self._maxsize == 0 or size > _CACHE_MAX_CHARS:
            return value
        with self._lock:
            if key not in data:
                data[key] = value
                self._chars += size
                while len(data) > self._maxsize or self._chars > _CACHE_MAX_CHARS:
                    (_, old_text), _ = data.popitem(last=False)
                    self._chars -= len(old_text)
        return value


def _role_text(role: Role | str) -> str:
    return role.value if isinstance(role, Role) else role


def _tool_call_arguments(call: ToolCallRequest) -> str:
    if call.raw_arguments or call.arguments is None:
        return call.raw_arguments
    return json.dumps(call.arguments, ensure_ascii=False)


def _message_tokens(
    count: Callable[[str], int],
    role: Role | str,
    content: str,
    name: str | None = None,
    tool_calls: Sequence[ToolCallRequest] | None = None,
    parts: Sequence[ContentPart] | None = None,
    model_hint: str | None = None,
) -> int:
    tokens = TOKENS_PER_MESSAGE + count(_role_text(role)) + count(content)
    if name:
        tokens += count(name) + TOKENS_PER_NAME
    for call in tool_calls or ():
        tokens += TOKENS_PER_TOOL_CALL + count(call.name) + count(_tool_call_arguments(call))
    for part in parts or ():
        if part.type != "text":
            tokens += part_tokens(part, model_hint)
    return tokens


def _tools_tokens(count: Callable[[str], int], tool_schemas: Sequence[dict[str, Any]]) -> int:
    if not tool_schemas:
        return 0
    return count(_render_functions(tool_schemas)) + TOOLS_OVERHEAD_TOKENS


# --- how OpenAI renders function definitions into the prompt --------------------------------
#
# OpenAI does not publish the rendering; the known approximation (inferred from API usage
# figures, see github.com/hmarr/openai-chat-tokens) is a TypeScript-like namespace:
#
#   namespace functions {
#
#   // <description>
#   type <name> = (_: {
#   // <property description>
#   <property>?: <type>,       (no "?" for required properties)
#   }) => any;
#
#   } // namespace functions
#
# plus TOOLS_OVERHEAD_TOKENS. Counts match the API exactly for simple schemas; when the prompt
# also has a system message the API reports 4 tokens fewer (the definitions share it), so
# this errs on the safe side.


def _function_of(tool: dict[str, Any]) -> dict[str, Any]:
    inner = tool.get("function")
    return inner if isinstance(inner, dict) else tool


def _render_functions(tool_schemas: Sequence[dict[str, Any]]) -> str:
    lines = ["namespace functions {", ""]
    for tool in tool_schemas:
        function = _function_of(tool)
        description = function.get("description")
        if description:
            lines.append(f"// {description}")
        parameters = function.get("parameters")
        name = function.get("name", "")
        if isinstance(parameters, dict) and parameters.get("properties"):
            lines.append(f"type {name} = (_: {{")
            lines.append(_render_properties(parameters, 0))
            lines.append("}) => any;")
        else:
            lines.append(f"type {name} = () => any;")
        lines.append("")
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _render_properties(schema: dict[str, Any], indent: int) -> str:
    required = schema.get("required") or ()
    lines: list[str] = []
    for prop_name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        if prop.get("description"):
            lines.append(f"// {prop['description']}")
        optional = "" if prop_name in required else "?"
        lines.append(f"{prop_name}{optional}: {_render_type(prop, indent)},")
    return "\n".join(" " * indent + line for line in lines)


def _render_type(prop: dict[str, Any], indent: int) -> str:
    if "enum" in prop and isinstance(prop["enum"], list):
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in prop["enum"])
    for key in ("anyOf", "oneOf"):
        if isinstance(prop.get(key), list):
            return " | ".join(
                _render_type(p if isinstance(p, dict) else {}, indent) for p in prop[key]
            )
    kind = prop.get("type")
    if isinstance(kind, list):
        return " | ".join(_render_type({**prop, "type": k}, indent) for k in kind)
    if kind in ("string", "boolean", "null"):
        return str(kind)
    if kind in ("number", "integer"):
        return "number"
    if kind == "array":
        items = prop.get("items")
        return f"{_render_type(items, indent)}[]" if isinstance(items, dict) else "any[]"
    if kind == "object" and prop.get("properties"):
        return "\n".join(["{", _render_properties(prop, indent + 2), "}"])
    if kind == "object":
        return "object"
    return "any"


# --- the character-based estimator -----------------------------------------------------------

_CJK_RANGES = (
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\U00020000-\U0002fa1f"  # CJK extensions B-F, compatibility supplement
)
_PIECE = re.compile(
    rf"(?P<cjk>[{_CJK_RANGES}])"
    r"|(?P<ascii>[A-Za-z]+)"
    r"|(?P<digits>[0-9]+)"
    rf"|(?P<letters>[^\W\d_{_CJK_RANGES}]+)"
    r"|(?P<other>\S)"
)
_CJK_TOKENS = 1.2  # per character: o200k ~0.7, cl100k ~1.05, byte-fallback vocabularies ~2
_ASCII_CHARS_PER_TOKEN = 8  # an ASCII word costs 1 token per started 8 letters
_DIGITS_PER_TOKEN = 3  # BPE vocabularies split numbers into groups of up to 3 digits
_LETTER_CHARS_PER_TOKEN = 2  # accented / Cyrillic / Greek / Arabic… words


def _char_based_count(text: str) -> int:
    total = 0.0
    for match in _PIECE.finditer(text):
        kind = match.lastgroup
        size = match.end() - match.start()
        if kind == "cjk":
            total += _CJK_TOKENS
        elif kind == "ascii":
            total += 1 + (size - 1) // _ASCII_CHARS_PER_TOKEN
        elif kind == "digits":
            total += math.ceil(size / _DIGITS_PER_TOKEN)
        elif kind == "letters":
            total += math.ceil(size / _LETTER_CHARS_PER_TOKEN)
        else:
            total += 1
    return max(1, math.ceil(total)) if text else 0


class CharBasedEstimator:
    """Approximates tokens without a tokenizer: 1.2 per CJK character (Han, kana, Hangul),
    one per started 8 letters of an ASCII word, one per started 3 digits, one per started 2
    letters of a word in another script, one per punctuation mark or symbol; whitespace is
    free. Never 0 for non-empty text. Message and tool overheads follow OpenAI's chat format.

    Calibrated to err slightly high: on English prose, Python code and Chinese text it gives
    5-15% more than tiktoken's cl100k_base. (Seed 004 suggests 2 tokens per Chinese
    character and 0.75 per English word; measured BPE vocabularies need 0.7-1.05 per Chinese
    character and about 1.3 per English word.)
    """

    def __init__(self, *, cache_size: int = 100_000) -> None:
        self._cache = _CountCache(cache_size)

    def _count(self, text: str) -> int:
        if not text:
            return 0
        return self._cache.count("chars", text, _char_based_count)

    def estimate_text(self, text: str, model_hint: str | None = None) -> int:
        return self._count(text)

    def estimate_message(self, role: Role, content: str, model_hint: str | None = None) -> int:
        return _message_tokens(self._count, role, content)

    def estimate_part(self, part: MessagePart, model_hint: str | None = None) -> int:
        return _message_tokens(
            self._count, part.role, part.content, part.name, part.tool_calls, part.parts, model_hint
        )

    def estimate_messages(self, messages: list[Message], model_hint: str | None = None) -> int:
        total = sum(
            _message_tokens(
                self._count, m.role, m.content, m.name, m.tool_calls, m.parts, model_hint
            )
            for m in messages
        )
        return total + REPLY_PRIMING_TOKENS

    def estimate_tools(
        self, tool_schemas: Sequence[dict[str, Any]], model_hint: str | None = None
    ) -> int:
        return _tools_tokens(self._count, tool_schemas)

    def reply_priming(self, model_hint: str | None = None) -> int:
        return REPLY_PRIMING_TOKENS


# --- the tiktoken estimator -------------------------------------------------------------------

_O200K_HINT = re.compile(r"(?:gpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-oss|chatgpt-|o[1-9](?:-|$))")
_CL100K_HINT = re.compile(
    r"(?:gpt-4(?:-|$)|gpt-3\.5|gpt-35|text-embedding-|davinci-002|babbage-002)"
)


def openai_encoding_for(model_hint: str | None) -> str | None:
    """The tiktoken encoding of an OpenAI-family model hint, or ``None`` for other models.

    ``o200k_base`` for gpt-4o, gpt-4.1, gpt-4.5, gpt-5, gpt-oss, chatgpt-* and the o-series
    (o1, o3, o4-mini…); ``cl100k_base`` for gpt-4 / gpt-4-turbo, gpt-3.5, text-embedding-*;
    ``DEFAULT_ENCODING`` (o200k_base) when there is no hint. A provider prefix
    (``openai/``, ``azure/``) and a fine-tune prefix (``ft:``) are ignored; matching is
    case-insensitive. Any other hint (``claude-…``, ``llama…``, ``qwen…``) gives ``None``.
    """
    if model_hint is None:
        return DEFAULT_ENCODING
    hint = model_hint.strip().lower().rsplit("/", 1)[-1].removeprefix("ft:")
    if _O200K_HINT.match(hint):
        return "o200k_base"
    if _CL100K_HINT.match(hint):
        return "cl100k_base"
    return None


def _split_for_encoding(text: str) -> list[str]:
    """Cut a long text into pieces of at most ``_ENCODE_CHUNK_CHARS``, each cut just before a
    space that follows a non-space character (where tiktoken's pre-tokenizer splits anyway,
    so the sum of the pieces' counts equals the whole text's). Only a run longer than a chunk
    without such a space is cut inside it."""
    pieces: list[str] = []
    start = 0
    while len(text) - start > _ENCODE_CHUNK_CHARS:
        end = start + _ENCODE_CHUNK_CHARS
        cut = text.rfind(" ", start + 1, end)
        while cut > start and text[cut - 1].isspace():
            cut = text.rfind(" ", start + 1, cut)
        if cut <= start:
            cut = end
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


class TiktokenEstimator:
    """Exact token counts with tiktoken for OpenAI-family models (see
    :func:`openai_encoding_for`), including the chat-format overheads; every other model
    hint is estimated entirely by ``fallback`` (default :class:`CharBasedEstimator`).

    Encodings are loaded lazily, once each. Offline, tiktoken reads them from
    ``TIKTOKEN_CACHE_DIR``; a missing file makes tiktoken try to download it. A load runs in a
    daemon thread bounded by ``load_timeout`` seconds, so a stalled network cannot block the
    caller longer than that. When tiktoken is not installed or an encoding cannot be loaded,
    that encoding's estimates come from ``fallback`` for the lifetime of this estimator and
    ``on_degraded("tokenizer_unavailable", detail)`` is called once for it.

    Text counts are cached per ``(encoding, text)`` in an LRU of ``cache_size`` texts, so
    unchanged text is never re-tokenized. Thread-safe.
    """

    def __init__(
        self,
        *,
        fallback: TokenEstimator | None = None,
        on_degraded: DegradedCallback | None = None,
        cache_size: int = 100_000,
        load_timeout: float = 10.0,
    ) -> None:
        self._fallback: TokenEstimator = fallback or CharBasedEstimator()
        self._on_degraded = on_degraded
        self._cache = _CountCache(cache_size)
        self._load_timeout = load_timeout
        self._counters: dict[str, Callable[[str], int] | None] = {}
        self._hints: dict[str | None, str | None] = {}
        self._load_lock = threading.Lock()

    def _counter(self, model_hint: str | None) -> Callable[[str], int] | None:
        """The cached text counter of the hint's encoding; ``None``: use the fallback."""
        try:
            name = self._hints[model_hint]
        except KeyError:
            name = self._hints[model_hint] = openai_encoding_for(model_hint)
        if name is None:
            return None
        try:
            return self._counters[name]
        except KeyError:
            return self._load(name)

    def _load(self, name: str) -> Callable[[str], int] | None:
        with self._load_lock:
            if name in self._counters:
                return self._counters[name]
            encoding, problem = _load_encoding(name, self._load_timeout)
            counter = None if encoding is None else self._make_counter(name, encoding)
            self._counters[name] = counter
        if problem is not None and self._on_degraded is not None:
            self._on_degraded("tokenizer_unavailable", problem)
        return counter

    def _make_counter(self, name: str, encoding: Encoding) -> Callable[[str], int]:
        cached = self._cache.count

        def encode(text: str) -> int:
            return sum(len(encoding.encode_ordinary(p)) for p in _split_for_encoding(text))

        def counter(text: str) -> int:
            return cached(name, text, encode) if text else 0

        return counter

    # TokenEstimator

    def estimate_text(self, text: str, model_hint: str | None = None) -> int:
        count = self._counter(model_hint)
        if count is None:
            return self._fallback.estimate_text(text, model_hint)
        return count(text)

    def estimate_message(self, role: Role, content: str, model_hint: str | None = None) -> int:
        count = self._counter(model_hint)
        if count is None:
            return self._fallback.estimate_message(role, content, model_hint)
        return _message_tokens(count, role, content)

    def estimate_part(self, part: MessagePart, model_hint: str | None = None) -> int:
        count = self._counter(model_hint)
        if count is None:
            return self._fallback.estimate_part(part, model_hint)
        return _message_tokens(
            count, part.role, part.content, part.name, part.tool_calls, part.parts, model_hint
        )

    def estimate_messages(self, messages: list[Message], model_hint: str | None = None) -> int:
        count = self._counter(model_hint)
        if count is None:
            return self._fallback.estimate_messages(messages, model_hint)
        total = sum(
            _message_tokens(count, m.role, m.content, m.name, m.tool_calls, m.parts, model_hint)
            for m in messages
        )
        return total + REPLY_PRIMING_TOKENS

    def estimate_tools(
        self, tool_schemas: Sequence[dict[str, Any]], model_hint: str | None = None
    ) -> int:
        count = self._counter(model_hint)
        if count is None:
            return self._fallback.estimate_tools(tool_schemas, model_hint)
        return _tools_tokens(count, tool_schemas)

    def reply_priming(self, model_hint: str | None = None) -> int:
        if self._counter(model_hint) is None:
            return self._fallback.reply_priming(model_hint)
        return REPLY_PRIMING_TOKENS


def _load_encoding(name: str, timeout: float) -> tuple[Encoding | None, str | None]:
    """``(encoding, None)`` or ``(None, why it is unavailable)``; never raises, never blocks
    longer than ``timeout`` seconds."""
    try:
        import tiktoken
    except ImportError:
        return None, f"tiktoken is not installed (pip install 'ce-core[tiktoken]'); {name} unused"

    outcome: list[Encoding | BaseException] = []

    def load() -> None:
        try:
            outcome.append(tiktoken.get_encoding(name))
        except BaseException as exc:  # reported to the caller below, whatever it is
            outcome.append(exc)

    worker = threading.Thread(target=load, name=f"ce-tiktoken-load-{name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        return None, f"loading tiktoken encoding {name} took longer than {timeout:g}s"
    result = outcome[0]
    if isinstance(result, BaseException):
        # the first line of the cause only: a network error's text runs to hundreds of chars
        cause = (str(result).strip().splitlines() or [""])[0]
        if len(cause) > 100:
            cause = cause[:99] + "…"
        return None, (
            f"cannot load tiktoken encoding {name} ({type(result).__name__}: {cause}); "
            "character-based estimates are used; set TIKTOKEN_CACHE_DIR to a directory "
            "holding its file for exact counts"
        )
    return result, None


# --- images, files and audio ------------------------------------------------------------------
#
# OpenAI's published rule for images ("Calculating costs", platform.openai.com/docs/guides/
# images-vision): a ``low`` detail image costs the model's base tokens; a ``high`` or ``auto``
# one is scaled to fit in 2048 x 2048, then (when its shortest side is over 768 px) so that its
# shortest side is 768 px, and costs the base tokens plus a price per 512 px tile covering it.
# gpt-4.1-mini, gpt-4.1-nano and o4-mini price 32 px patches instead (at most 1536, the image
# scaled down to fit), times a model multiplier, whatever the detail.

_TILE_RULES: tuple[tuple[re.Pattern[str], tuple[int, int]], ...] = (
    (re.compile(r"gpt-4o-mini"), (2833, 5667)),
    (re.compile(r"(?:gpt-4o|chatgpt-4o|gpt-4\.5|gpt-4-turbo|gpt-4-vision)"), (85, 170)),
    (re.compile(r"gpt-4\.1(?!-mini|-nano)"), (85, 170)),
)
"""``(base, per 512 px tile)`` tokens of OpenAI's tile-priced models."""
_PATCH_RULES: tuple[tuple[re.Pattern[str], float], ...] = (
    (re.compile(r"gpt-4\.1-mini"), 1.62),
    (re.compile(r"gpt-4\.1-nano"), 2.46),
    (re.compile(r"o4-mini"), 1.72),
)
"""Token multiplier per 32 px patch of OpenAI's patch-priced models."""
_MAX_TILES = 8  # a high-detail image covers at most 4 x 2 tiles (2048 x 768 after scaling)
_MAX_PATCHES = 1536

IMAGE_ESTIMATE_MAX_TOKENS = 1600
"""The estimate for an image on a model OpenAI's rule does not cover: ``width * height / 750``
(Anthropic's published formula) at most this (larger images are scaled down to about 1,600
tokens by Anthropic; Gemini charges 258 per 768 px tile); this much when the size is unknown."""
FILE_PAGE_TOKENS = 1500
"""The estimate per PDF page (OpenAI and Anthropic give the model each page's text and an
image of it: a high-detail 768 x 1024 page image alone is 765 tokens on gpt-4o)."""
FILE_UNKNOWN_TOKENS = 6000
"""The estimate for a file sent by URL or provider file id (its size is not known here)."""
FILE_BYTES_PER_TOKEN = 4
"""The estimate for an inline file that is not a PDF: one token per 4 bytes (text-like)."""
AUDIO_TOKENS_PER_SECOND = 32
"""The estimate per second of audio (Gemini's published rate; OpenAI's is about 10). The
duration comes from a WAV header, or from the data size at 128 kbit/s for other formats."""
_AUDIO_BYTES_PER_SECOND = 16_000

# Enough of a data URL's payload to hold an image header (a JPEG's size marker may follow
# tens of kilobytes of EXIF data); a multiple of 4 base64 characters.
_HEADER_CHARS = 87_384


def _normalized_hint(model_hint: str | None) -> str:
    if model_hint is None:
        return "gpt-4o"  # the default encoding's model, as for text
    return model_hint.strip().lower().rsplit("/", 1)[-1].removeprefix("ft:")


def _scaled_tiles(width: int, height: int) -> int:
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    return math.ceil(w / 512) * math.ceil(h / 512)


def _patches(width: int, height: int) -> int:
    patches = math.ceil(width / 32) * math.ceil(height / 32)
    if patches <= _MAX_PATCHES:
        return patches
    shrink = math.sqrt(32 * 32 * _MAX_PATCHES / (width * height))
    w_tiles, h_tiles = width * shrink / 32, height * shrink / 32
    shrink *= min(math.floor(w_tiles) / w_tiles, math.floor(h_tiles) / h_tiles)
    scaled = math.ceil(int(width * shrink) / 32) * math.ceil(int(height * shrink) / 32)
    return min(scaled, _MAX_PATCHES)


def openai_image_tokens(
    width: int | None, height: int | None, detail: str = "auto", model_hint: str | None = None
) -> int | None:
    """What OpenAI charges for one image of ``width`` x ``height`` px at ``detail`` on
    ``model_hint`` (``None``: gpt-4o), by its published rule: tile-priced models (gpt-4o,
    gpt-4.1, gpt-4.5, gpt-4-turbo: 85 base + 170 per tile; gpt-4o-mini: 2833 + 5667 per tile)
    and patch-priced ones (gpt-4.1-mini x1.62, gpt-4.1-nano x2.46, o4-mini x1.72 per 32 px
    patch, at most 1536 patches). An unknown size is priced at the rule's maximum (8 tiles,
    1536 patches) unless ``detail`` is ``low``. ``None`` when the rule does not cover the model.
    """
    hint = _normalized_hint(model_hint)
    for pattern, (base, per_tile) in _TILE_RULES:
        if pattern.match(hint):
            if detail == "low":
                return base
            if width is None or height is None:
                return base + per_tile * _MAX_TILES
            return base + per_tile * _scaled_tiles(width, height)
    for pattern, multiplier in _PATCH_RULES:
        if pattern.match(hint):
            patches = _MAX_PATCHES if width is None or height is None else _patches(width, height)
            return math.ceil(patches * multiplier)
    return None


def _data_payload(url: str) -> tuple[str, str] | None:
    """``(mime type, base64 payload)`` of a base64 data URL, else None."""
    if not url.startswith("data:"):
        return None
    comma = url.find(",", 0, 512)
    header = url[5:comma] if comma > 0 else ""
    if not header.endswith(";base64"):
        return None
    return header.split(";", 1)[0].lower(), url[comma + 1 :]


def _decode_head(payload: str, chars: int = _HEADER_CHARS) -> bytes:
    head = payload[:chars]
    head = head[: len(head) - len(head) % 4]
    try:
        return binascii.a2b_base64(head)
    except (binascii.Error, ValueError):
        return b""


def _decoded_size(payload: str) -> int:
    return len(payload) * 3 // 4 - payload[-2:].count("=")


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height = int.from_bytes(data[i + 5 : i + 7], "big")
            width = int.from_bytes(data[i + 7 : i + 9], "big")
            return (width, height) if width and height else None
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        width = int.from_bytes(data[26:28], "little") & 0x3FFF
        height = int.from_bytes(data[28:30], "little") & 0x3FFF
        return (width, height) if width and height else None
    if chunk == b"VP8L" and len(data) >= 25:
        b0, b1, b2, b3 = data[21:25]
        width = 1 + (((b1 & 0x3F) << 8) | b0)
        height = 1 + (((b3 & 0x0F) << 10) | (b2 << 2) | ((b1 & 0xC0) >> 6))
        return width, height
    if chunk == b"VP8X" and len(data) >= 30:
        return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
    return None


def image_size(url: str) -> tuple[int, int] | None:
    """``(width, height)`` in pixels of a base64 ``data:`` image URL, read from its PNG, JPEG,
    GIF or WebP header (only the header is decoded); ``None`` for a remote URL or an image
    whose header does not say."""
    payload = _data_payload(url)
    if payload is None:
        return None
    data = _decode_head(payload[1])
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        return (width, height) if width and height else None
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
        return (width, height) if width and height else None
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return _webp_size(data)
    return None


def _image_tokens(part: ImagePart, model_hint: str | None) -> int:
    if part.width is not None and part.height is not None:
        size: tuple[int, int] | None = (part.width, part.height)
    else:
        size = image_size(part.url)
    width, height = size if size is not None else (None, None)
    tokens = openai_image_tokens(width, height, part.detail, model_hint)
    if tokens is not None:
        return tokens
    if width is None or height is None:
        return IMAGE_ESTIMATE_MAX_TOKENS
    return max(1, min(IMAGE_ESTIMATE_MAX_TOKENS, math.ceil(width * height / 750)))


_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")


def _file_tokens(part: FilePart) -> int:
    payload = _data_payload(part.data) if part.data else None
    if payload is None:
        return FILE_UNKNOWN_TOKENS
    mime, data = payload
    if mime == "application/pdf" or (part.filename or "").lower().endswith(".pdf"):
        pages = len(_PDF_PAGE.findall(_decode_head(data, len(data))))
        return FILE_PAGE_TOKENS * max(1, pages)
    return max(1, math.ceil(_decoded_size(data) / FILE_BYTES_PER_TOKEN))


def _audio_tokens(part: AudioPart) -> int:
    size = _decoded_size(part.data)
    per_second = _AUDIO_BYTES_PER_SECOND
    if part.format.lower() == "wav":
        head = _decode_head(part.data, 64)
        if head[:4] == b"RIFF" and head[8:12] == b"WAVE" and len(head) >= 32:
            per_second = int.from_bytes(head[28:32], "little") or per_second
            size = max(0, size - 44)
    return max(1, math.ceil(size / per_second * AUDIO_TOKENS_PER_SECOND))


class _PartCache:
    """Token counts of media parts by a cheap identity of their data (its length, ends and
    hash: a string's hash is computed once per string object), bounded by entry count. It
    keeps no reference to the data, so large images are never held alive by it."""

    __slots__ = ("_data", "_lock", "_maxsize")

    def __init__(self, maxsize: int) -> None:
        self._data: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        self._maxsize = maxsize
        self._lock = threading.Lock()

    def count(self, key: tuple[Any, ...], compute: Callable[[], int]) -> int:
        cached = self._data.get(key)
        if cached is not None:
            return cached
        value = compute()
        with self._lock:
            self._data[key] = value
            while len(self._data) > self._maxsize:
                self._data.popitem(last=False)
        return value


_part_cache = _PartCache(4096)


def _data_key(data: str) -> tuple[int, str, str, int]:
    return (len(data), data[:64], data[-64:], hash(data))


def part_tokens(part: ContentPart, model_hint: str | None = None) -> int:
    """What one image, file or audio part of a message costs on ``model_hint`` (a text part
    costs nothing: the message's content is counted as text).

    * image: :func:`openai_image_tokens` for the OpenAI models its rule covers (the size from
      ``width``/``height``, else from the data URL's header, else the rule's maximum); any
      other model: ``width * height / 750`` up to :data:`IMAGE_ESTIMATE_MAX_TOKENS` (that
      much when the size is unknown);
    * file: a PDF given inline costs :data:`FILE_PAGE_TOKENS` per page (pages counted in
      the PDF), another inline file one token per :data:`FILE_BYTES_PER_TOKEN` bytes, a file
      by URL or id :data:`FILE_UNKNOWN_TOKENS`;
    * audio: :data:`AUDIO_TOKENS_PER_SECOND` per second (duration from a WAV header, else
      from the size at 128 kbit/s).

    Counts are cached by the part's data, so a base64 payload is decoded once, not per call.
    """
    if isinstance(part, ImagePart):
        rule = _normalized_hint(model_hint)
        key: tuple[Any, ...] = ("image", rule, part.detail, part.width, part.height)
        key += _data_key(part.url)
        return _part_cache.count(key, lambda: _image_tokens(part, model_hint))
    if isinstance(part, FilePart):
        data = part.data or part.url or part.file_id or ""
        key = ("file", part.filename, *_data_key(data))
        return _part_cache.count(key, lambda: _file_tokens(part))
    if isinstance(part, AudioPart):
        key = ("audio", part.format, *_data_key(part.data))
        return _part_cache.count(key, lambda: _audio_tokens(part))
    return 0
