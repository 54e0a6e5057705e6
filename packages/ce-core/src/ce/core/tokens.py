"""Token estimation.

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

Counts that cost a tokenizer run are kept with the stored records (see
:func:`collecting_counts` and :func:`remember_counts`): a process that reads a session it has
not seen takes the counts another process computed, keyed by a digest of each text, instead
of tokenizing the text again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ce.core._media_tokens import (
    AUDIO_TOKENS_PER_SECOND,
    FILE_PAGE_TOKENS,
    FILE_UNKNOWN_TOKENS,
    IMAGE_ESTIMATE_MAX_TOKENS,
    image_size,
    openai_image_tokens,
    part_tokens,
)
from ce.core._tool_tokens import render_functions
from ce.core.schema import (
    ContentPart,
    Message,
    MessagePart,
    Role,
    ToolCallRequest,
)
from ce.core.schema._enums import ROLE_TEXT

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
    "StoredCounts",
    "TiktokenEstimator",
    "TokenEstimator",
    "collecting_counts",
    "image_size",
    "openai_encoding_for",
    "openai_image_tokens",
    "part_tokens",
    "remember_counts",
    "text_digest",
    "tokenizer_name",
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
# Texts at least this long are counted paragraph by paragraph, each piece's count cached: a
# long text that changed in one place (a system message whose instruction stays and whose
# Live Screen or evidence changes) is tokenized only where it changed.
_PARAGRAPH_MIN_CHARS = 2048
# a blank line and what follows it up to the first space after a non-space (where a
# pre-token starts): the match ends where the text may be cut
_PARAGRAPH_CUT = re.compile(r"\n\n[\s\S]*?\S(?= )")


StoredCounts = dict[str, dict[str, int]]
"""Token counts as stored with records: tokenizer (``tiktoken:<encoding>``) -> text digest
(:func:`text_digest`) -> count."""

_FRESH: ContextVar[StoredCounts | None] = ContextVar("ce_fresh_counts", default=None)
_MEMO: dict[tuple[str, str], int] = {}
_MEMO_LOCK = threading.Lock()
_MEMO_MAX = 50_000
"""How many counts read from a store wait for their text at most (oldest dropped first)."""
_FRESH_MAX = 4_096
"""How many counts one store write keeps at most."""


def text_digest(text: str) -> str:
    """The key a stored count of ``text`` is kept under (80 bits of BLAKE2b)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()


@contextmanager
def collecting_counts(into: StoredCounts | None = None) -> Iterator[StoredCounts]:
    """Within the block, every count a tokenizer computes (not one taken from a cache or from
    :func:`remember_counts`) is added to the dict it yields (``into``, or a new one), to be
    stored with what the block writes."""
    fresh: StoredCounts = {} if into is None else into
    token = _FRESH.set(fresh)
    try:
        yield fresh
    finally:
        _FRESH.reset(token)


def remember_counts(counts: Mapping[str, Mapping[str, int]]) -> None:
    """Take counts read from a store: the next time a tokenizer named in ``counts`` meets a
    text of one of the digests, it uses the count instead of tokenizing the text. Entries
    that are not a digest and a non-negative count are ignored (a stored count is a hint)."""
    with _MEMO_LOCK:
        for tokenizer, by_digest in counts.items():
            if not isinstance(tokenizer, str) or not isinstance(by_digest, Mapping):
                continue
            for digest, count in by_digest.items():
                if isinstance(digest, str) and type(count) is int and count >= 0:
                    _MEMO[(tokenizer, digest)] = count
        while len(_MEMO) > _MEMO_MAX:
            try:  # the oldest first; a count taken meanwhile by another thread is retried
                _MEMO.pop(next(iter(_MEMO)), None)
            except (RuntimeError, StopIteration):
                continue


def _counted(tokenizer: str, text: str, compute: Callable[[str], int]) -> int:
    """``compute(text)``, unless a stored count of the text was remembered; a computed count
    joins the block of :func:`collecting_counts` around the call, if any."""
    fresh = _FRESH.get()
    if fresh is None and not _MEMO:
        return compute(text)
    digest = text_digest(text)
    value = _MEMO.pop((tokenizer, digest), None) if _MEMO else None
    if value is not None:
        return value
    value = compute(text)
    if fresh is not None:
        by_digest = fresh.setdefault(tokenizer, {})
        if len(by_digest) < _FRESH_MAX:
            by_digest[digest] = value
    return value


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
    return ROLE_TEXT.get(role, role)


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
    return count(render_functions(tool_schemas)) + TOOLS_OVERHEAD_TOKENS


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
    5-15% more than tiktoken's cl100k_base. (Measured BPE vocabularies need 0.7-1.05 tokens
    per Chinese character and about 1.3 per English word.)
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


def _paragraph_pieces(text: str) -> list[str]:
    """``text`` cut once per paragraph: at each blank line, just before the first space that
    follows a non-space character after it (see :func:`_split_for_encoding`: the sum of the
    pieces' counts is the whole text's). A cut depends only on the text around it, so an edit
    changes the pieces it falls in, not the others."""
    cuts = [0, *(match.end() for match in _PARAGRAPH_CUT.finditer(text)), len(text)]
    return [text[start:end] for start, end in itertools.pairwise(cuts)]


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
    unchanged text is never re-tokenized; a text of 2,048 characters or more is counted
    paragraph by paragraph, each piece cached too, so a long text that changed in one place
    (a system message whose Live Screen or evidence changed) is tokenized only there.
    Thread-safe.
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
        tokenizer = f"tiktoken:{name}"

        def tokenize(text: str) -> int:
            return sum(len(encoding.encode_ordinary(p)) for p in _split_for_encoding(text))

        def by_paragraph(text: str) -> int:
            if len(text) < _PARAGRAPH_MIN_CHARS:
                return tokenize(text)
            return sum(cached(name, piece, tokenize) for piece in _paragraph_pieces(text))

        def encode(text: str) -> int:
            return _counted(tokenizer, text, by_paragraph)

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

    def tokenizer_for(self, model_hint: str | None = None) -> str:
        """The tokenizer this estimator counts ``model_hint``'s tokens with (see
        :func:`tokenizer_name`): ``tiktoken:<encoding>``, else its fallback's."""
        if self._counter(model_hint) is None:
            return tokenizer_name(self._fallback, model_hint)
        return f"tiktoken:{self._hints[model_hint]}"


def tokenizer_name(estimator: object, model_hint: str | None = None) -> str:
    """What counts ``model_hint``'s tokens in ``estimator``, as a turn record keeps it:
    ``tiktoken:<encoding>`` (exact), ``chars`` (:class:`CharBasedEstimator`), or for another
    estimator its ``tokenizer_for(model_hint)`` when it has one, else its class name."""
    if isinstance(estimator, CharBasedEstimator):
        return "chars"
    describe = getattr(estimator, "tokenizer_for", None)
    if callable(describe):
        return str(describe(model_hint))
    return type(estimator).__name__


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
