"""What a message's images, files and audio cost in tokens (:func:`part_tokens`): OpenAI's
published image rule for the models it covers, documented estimates otherwise (see
``docs/concepts/multimodal.md``). Re-exported by :mod:`ce.core.tokens`."""

from __future__ import annotations

import binascii
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ce.core.schema import AudioPart, ContentPart, FilePart, ImagePart

__all__ = [
    "AUDIO_TOKENS_PER_SECOND",
    "FILE_BYTES_PER_TOKEN",
    "FILE_PAGE_TOKENS",
    "FILE_UNKNOWN_TOKENS",
    "IMAGE_ESTIMATE_MAX_TOKENS",
    "image_size",
    "openai_image_tokens",
    "part_tokens",
]


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
