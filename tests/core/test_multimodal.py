"""Images, files and audio through the engine (issue 11): the schema's parts (validation,
backwards compatibility), what they cost (OpenAI's image rule, the documented estimates, the
per-part cache), the wire formats (OpenAI, Anthropic, Gemini) and the budget: a history with
images never assembles over budget by the engine's own count, and an old image-heavy message
goes before the newest."""

from __future__ import annotations

import asyncio
import base64
import math
import random
import re
import struct
import zlib
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import ce.core._media_tokens as media_tokens
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.errors import BudgetExceededError
from ce.core.formats import (
    from_openai_messages,
    to_anthropic_messages,
    to_gemini_request,
    to_openai_messages,
)
from ce.core.integration import assembled_to_openai, openai_to_messages
from ce.core.schema import (
    AudioPart,
    FilePart,
    ImagePart,
    Message,
    MessagePart,
    Role,
    TextPart,
)
from ce.core.testing import deterministic_engine
from ce.core.testing.histories import write_random_history
from ce.core.testing.payloads import anthropic_problems, gemini_problems, openai_problems
from ce.core.tokens import (
    FILE_PAGE_TOKENS,
    FILE_UNKNOWN_TOKENS,
    IMAGE_ESTIMATE_MAX_TOKENS,
    CharBasedEstimator,
    TiktokenEstimator,
    image_size,
    openai_image_tokens,
    part_tokens,
)

# -- images of a given size (headers only: that is all the counter reads) -------------------


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png(width: int, height: int) -> str:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    body = struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return _data_url("image/png", b"\x89PNG\r\n\x1a\n" + body + b"\x00" * 32)


def gif(width: int, height: int) -> str:
    return _data_url("image/gif", b"GIF89a" + struct.pack("<HH", width, height) + b"\x00" * 16)


def jpeg(width: int, height: int, exif: int = 0) -> str:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9
    app1 = b"\xff\xe1" + struct.pack(">H", exif + 2) + b"\x00" * exif if exif else b""
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x00" * 9
    return _data_url("image/jpeg", b"\xff\xd8" + app0 + app1 + sof + b"\xff\xd9")


def webp(width: int, height: int, kind: str) -> str:
    if kind == "VP8X":
        body = b"\x00" * 4 + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    elif kind == "VP8L":
        bits = (width - 1) | ((height - 1) << 14)
        body = b"\x2f" + bits.to_bytes(4, "little")
    else:
        body = b"\x00" * 3 + b"\x9d\x01\x2a" + struct.pack("<HH", width, height)
    chunk = kind.encode() + struct.pack("<I", len(body)) + body
    return _data_url("image/webp", b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk)


PIXEL = png(1, 1)  # 255 tokens on gpt-4o (85 + 1 tile of 170), 85 at low detail


# -- schema --------------------------------------------------------------------------------


def test_a_message_keeps_its_parts_in_order_and_text_only_messages_are_unchanged() -> None:
    parts: list[Any] = [
        {"type": "image", "url": PIXEL, "detail": "low"},
        {"type": "text"},
        {"type": "file", "data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"},
        {"type": "audio", "data": "UklGRg==", "format": "wav"},
    ]
    message = Message(role=Role.USER, content="look", parts=parts)
    assert [type(p) for p in message.parts or ()] == [ImagePart, TextPart, FilePart, AudioPart]
    dumped = message.model_dump(mode="json", exclude_none=True)
    assert dumped["parts"][0] == {"type": "image", "url": PIXEL, "detail": "low"}
    assert Message.model_validate(dumped) == message
    # a stored session from before parts existed reads as it did, and writes as it did
    old = {"role": "user", "content": "hi", "meta": {}}
    assert Message.model_validate(old).parts is None
    assert Message.model_validate(old).model_dump(mode="json", exclude_none=True) == old


@pytest.mark.parametrize(
    ("part", "error"),
    [
        ({"type": "image", "url": "ftp://x/y.png"}, "an http(s) URL or a data: URL"),
        ({"type": "image", "url": "data:text/plain;base64,AAAA"}, "data URL of image/*"),
        ({"type": "image", "url": "data:image/png;base64"}, "malformed data URL"),
        ({"type": "image", "url": PIXEL, "width": 10}, "both width and height"),
        ({"type": "image", "url": PIXEL, "width": 0, "height": 4}, "greater than 0"),
        ({"type": "image", "url": PIXEL, "detail": "medium"}, "detail"),
        ({"type": "file"}, "exactly one of data, url, file_id"),
        ({"type": "file", "file_id": "f", "url": "https://x/a.pdf"}, "exactly one"),
        ({"type": "file", "data": "JVBERi0="}, "data must be a data: URL"),
        ({"type": "file", "url": "file:///etc/passwd"}, "url must be an http(s) URL"),
        ({"type": "audio", "data": "data:audio/wav;base64,AA==", "format": "wav"}, "base64"),
        ({"type": "audio", "data": "AA==", "format": ""}, "format"),
        ({"type": "video", "url": PIXEL}, "does not match any of the expected tags"),
    ],
)
def test_malformed_parts_raise_a_clear_value_error(part: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        Message(role=Role.USER, content="x", parts=[part])
    with pytest.raises(ValueError, match=re.escape(error)):
        MessagePart(role=Role.USER, content="x", parts=[part])


def test_parts_have_one_text_place_and_no_system_message_has_any() -> None:
    with pytest.raises(ValueError, match="at most one text part"):
        Message(role=Role.USER, content="x", parts=[TextPart(), ImagePart(url=PIXEL), TextPart()])
    with pytest.raises(ValueError, match="system message cannot carry parts"):
        Message(role=Role.SYSTEM, content="x", parts=[ImagePart(url=PIXEL)])


# -- what parts cost -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "detail", "model", "expected"),
    [
        # OpenAI's published examples (gpt-4o: 85 base, 170 per 512 px tile)
        ((1024, 1024), "high", "gpt-4o", 85 + 170 * 4),
        ((2048, 4096), "high", "gpt-4o", 85 + 170 * 6),
        ((4096, 8192), "low", "gpt-4o", 85),
        ((1, 1), "auto", "gpt-4o-2024-08-06", 85 + 170),
        ((512, 512), "auto", "gpt-4.1", 85 + 170),
        ((513, 512), "auto", "openai/gpt-4o", 85 + 170 * 2),
        ((1024, 1024), "high", None, 85 + 170 * 4),  # no hint: gpt-4o, as for text
        # gpt-4o-mini: 2833 base, 5667 per tile
        ((1024, 1024), "high", "gpt-4o-mini", 2833 + 5667 * 4),
        ((300, 300), "low", "gpt-4o-mini", 2833),
        # patch-priced: 32 px patches (at most 1536, scaled down) times a multiplier
        ((1024, 1024), "auto", "gpt-4.1-mini", math.ceil(1024 * 1.62)),
        ((1800, 2400), "low", "gpt-4.1-mini", math.ceil(1452 * 1.62)),
        ((64, 64), "auto", "gpt-4.1-nano", math.ceil(4 * 2.46)),
        ((64, 64), "auto", "o4-mini", math.ceil(4 * 1.72)),
        # unknown size: the rule's maximum (8 tiles, 1536 patches)
        (None, "auto", "gpt-4o", 85 + 170 * 8),
        (None, "low", "gpt-4o", 85),
        (None, "auto", "gpt-4.1-nano", math.ceil(1536 * 2.46)),
        # models the rule does not cover
        ((1024, 1024), "auto", "claude-sonnet-4", None),
        ((1024, 1024), "auto", "gpt-3.5-turbo", None),
    ],
)
def test_openai_image_rule(
    size: tuple[int, int] | None, detail: str, model: str | None, expected: int | None
) -> None:
    width, height = size if size is not None else (None, None)
    assert openai_image_tokens(width, height, detail, model) == expected


@pytest.mark.parametrize(
    ("url", "size"),
    [
        (png(1, 1), (1, 1)),
        (png(4000, 3000), (4000, 3000)),
        (gif(640, 480), (640, 480)),
        (jpeg(1920, 1080), (1920, 1080)),
        (jpeg(800, 600, exif=40_000), (800, 600)),  # the size marker behind a big EXIF block
        (webp(1000, 750, "VP8X"), (1000, 750)),
        (webp(300, 200, "VP8L"), (300, 200)),
        (webp(640, 360, "VP8 "), (640, 360)),
        ("https://example.com/cat.png", None),
        ("data:image/png;base64,bm90IGFuIGltYWdl", None),
    ],
)
def test_image_size_is_read_from_the_data_url_header(
    url: str, size: tuple[int, int] | None
) -> None:
    assert image_size(url) == size


def test_part_tokens_follow_the_rule_the_size_and_the_estimates() -> None:
    big = png(2048, 4096)
    assert part_tokens(ImagePart(url=big), "gpt-4o") == 1105
    assert part_tokens(ImagePart(url=big, detail="low"), "gpt-4o") == 85
    # given width/height win over the header; a remote image without them: the maximum
    remote = "https://example.com/cat.png"
    assert part_tokens(ImagePart(url=remote, width=1024, height=1024), "gpt-4o") == 765
    assert part_tokens(ImagePart(url=remote), "gpt-4o") == 1445
    # other models: width * height / 750, at most IMAGE_ESTIMATE_MAX_TOKENS
    assert part_tokens(ImagePart(url=png(300, 250)), "claude-sonnet-4") == 100
    assert part_tokens(ImagePart(url=big), "claude-sonnet-4") == IMAGE_ESTIMATE_MAX_TOKENS
    assert part_tokens(ImagePart(url=remote), "llama-3.2-vision") == IMAGE_ESTIMATE_MAX_TOKENS
    # files: PDF pages, other inline files by size, by reference a fixed estimate
    pdf = b"%PDF-1.4\n" + b"<< /Type /Pages /Count 3 >>\n" + b"<< /Type /Page >>\n" * 3
    assert part_tokens(FilePart(data=_data_url("application/pdf", pdf))) == 3 * FILE_PAGE_TOKENS
    csv = _data_url("text/csv", b"a,b\n" * 1000)
    assert part_tokens(FilePart(data=csv, filename="t.csv")) == 1000
    assert part_tokens(FilePart(file_id="file-abc")) == FILE_UNKNOWN_TOKENS
    # audio: 32 tokens a second; a WAV's duration from its header (16 kHz mono 16 bit)
    header = (
        b"RIFF" + b"\x00" * 4 + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16)
    )
    wav = header + b"data" + struct.pack("<I", 64000) + b"\x00" * 64000  # 2 seconds
    assert part_tokens(AudioPart(data=base64.b64encode(wav).decode(), format="wav")) == 64
    mp3 = base64.b64encode(b"\x00" * 32000).decode()  # 2 s at the assumed 128 kbit/s
    assert part_tokens(AudioPart(data=mp3, format="mp3")) == 64
    assert part_tokens(TextPart(), "gpt-4o") == 0


def test_a_part_is_decoded_once_not_on_every_count(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[str] = []
    original = media_tokens.image_size

    def counting(url: str) -> tuple[int, int] | None:
        decoded.append(url)
        return original(url)

    monkeypatch.setattr(media_tokens, "image_size", counting)
    url = png(777, 555)
    estimator = TiktokenEstimator()
    message = MessagePart(role=Role.USER, content="hi", parts=[ImagePart(url=url)])
    counts = {estimator.estimate_part(message, "gpt-4o") for _ in range(50)}
    # another part object with the same data (a framework converts its messages every call)
    again = MessagePart(role=Role.USER, content="hi", parts=[ImagePart(url=url)])
    counts.add(estimator.estimate_part(again, "gpt-4o"))
    assert len(counts) == 1 and decoded == [url]


@pytest.mark.parametrize("estimator", [TiktokenEstimator(), CharBasedEstimator()])
def test_message_counts_include_their_parts(estimator: Any) -> None:
    plain = MessagePart(role=Role.USER, content="What is this?")
    pictured = plain.model_copy(update={"parts": [TextPart(), ImagePart(url=PIXEL)]})
    two = plain.model_copy(update={"parts": [ImagePart(url=PIXEL), ImagePart(url=PIXEL)]})
    base = estimator.estimate_part(plain, "gpt-4o")
    assert estimator.estimate_part(pictured, "gpt-4o") == base + 255
    assert estimator.estimate_part(two, "gpt-4o") == base + 510
    messages = [Message(role=Role.USER, content="What is this?", parts=[ImagePart(url=PIXEL)])]
    assert estimator.estimate_messages(messages, "gpt-4o") == base + 255 + 3


# -- wire formats ----------------------------------------------------------------------------

IMAGE = {"type": "image_url", "image_url": {"url": PIXEL}}
REMOTE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}}
PDF = {
    "type": "file",
    "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"},
}
AUDIO = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}


def test_openai_parts_round_trip_in_order() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Describe."},
        {"role": "user", "content": [{"type": "text", "text": "Two pictures:"}, IMAGE, REMOTE]},
        {"role": "assistant", "content": "A pixel and a cat."},
        {"role": "user", "content": [IMAGE, {"type": "text", "text": "and this file?"}, PDF]},
        {"role": "user", "content": [AUDIO]},
        {"role": "user", "content": "plain"},
    ]
    parts = from_openai_messages(messages)
    assert parts[1].content == "Two pictures:"
    assert [p.type for p in parts[1].parts or ()] == ["text", "image", "image"]
    assert parts[3].parts is not None and parts[3].parts[0] == ImagePart(url=PIXEL)
    assert parts[4].content == "" and parts[4].parts == [AudioPart(data="UklGRg==", format="wav")]
    assert parts[5].parts is None and parts[0].parts is None
    assert to_openai_messages(parts) == messages
    # the data is the app's own string, not a copy
    assert parts[1].parts[1].url is IMAGE["image_url"]["url"]  # type: ignore[union-attr,index]
    assert openai_problems(to_openai_messages(parts)) == []


def test_openai_reading_keeps_the_text_and_says_which_part_is_malformed() -> None:
    (part,) = from_openai_messages(
        [
            {
                "role": "user",
                "content": ["a", IMAGE, {"type": "text", "text": "b"}, {"type": "refusal"}],
            }
        ]
    )
    assert part.content == "a\nb"  # the text as before: text parts joined with newlines
    assert to_openai_messages([part])[0]["content"] == [{"type": "text", "text": "a\nb"}, IMAGE]
    bad = {"type": "image_url", "image_url": {"url": "ftp://x"}}
    with pytest.raises(ValueError, match=r"messages\[1\]\.content\[1\]: malformed image_url"):
        from_openai_messages(
            [{"role": "user", "content": "x"}, {"role": "user", "content": ["y", bad]}]
        )
    with pytest.raises(ValueError, match="malformed input_audio"):
        from_openai_messages([{"role": "user", "content": [{"type": "input_audio"}]}])
    # a system message's media are left out, as before
    (system,) = from_openai_messages([{"role": "system", "content": ["s", IMAGE]}])
    assert (system.content, system.parts) == ("s", None)
    # the Responses API's input_image reads the same
    (responses,) = from_openai_messages(
        [
            {
                "role": "user",
                "content": [{"type": "input_image", "image_url": PIXEL, "detail": "high"}],
            }
        ]
    )
    assert responses.parts == [ImagePart(url=PIXEL, detail="high")]


def test_anthropic_and_gemini_get_their_image_forms() -> None:
    parts = from_openai_messages(
        [
            {"role": "system", "content": "Describe."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Look:"}, IMAGE, REMOTE, PDF, AUDIO],
            },
        ]
    )
    payload = PIXEL.split(",", 1)[1]
    anthropic = to_anthropic_messages(parts)
    assert anthropic.messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": payload},
                },
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
                {
                    "type": "document",
                    "source": {
                        "type": "base64",
                        "media_type": "application/pdf",
                        "data": "JVBERi0=",
                    },
                    "title": "a.pdf",
                },
            ],
        }
    ]
    assert anthropic_problems(anthropic) == []
    gemini = to_gemini_request(parts)
    assert gemini.contents == [
        {
            "role": "user",
            "parts": [
                {"text": "Look:"},
                {"inlineData": {"mimeType": "image/png", "data": payload}},
                {"fileData": {"mimeType": "image/png", "fileUri": "https://example.com/cat.png"}},
                {"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0="}},
                {"inlineData": {"mimeType": "audio/wav", "data": "UklGRg=="}},
            ],
        }
    ]
    assert gemini_problems(gemini) == []


def test_payload_checks_catch_malformed_media() -> None:
    bad_openai = [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]
    assert openai_problems(bad_openai)
    assert openai_problems([{"role": "system", "content": [IMAGE]}])
    parts = [MessagePart(role=Role.USER, content="x", parts=[ImagePart(url=PIXEL)])]
    request = to_anthropic_messages(parts)
    request.messages[0]["content"][1]["source"] = {"type": "base64", "data": "x"}
    assert anthropic_problems(request)
    gemini = to_gemini_request(parts)
    gemini.contents[0]["parts"][1] = {"inlineData": {"data": "x"}}
    assert gemini_problems(gemini)


# -- through the engine ----------------------------------------------------------------------


async def test_the_engine_stores_counts_and_sends_a_users_image() -> None:
    engine = deterministic_engine()
    question = {"role": "user", "content": [{"type": "text", "text": "What is this?"}, IMAGE]}
    text_only = {"role": "user", "content": "What is this?"}
    plain = await engine.prepare_call("plain", openai_to_messages([text_only]))
    result = await engine.prepare_call("pic", openai_to_messages([question]))
    # the report counts the image by OpenAI's rule: 85 + 170 for a 1x1 picture on gpt-4o
    assert result.report.token_used == plain.report.token_used + 255
    assert result.assembled_input.total_tokens == result.report.token_used
    assert assembled_to_openai(result.assembled_input)[-1] == question
    doc = await engine.get_session("pic")
    assert doc.session.messages[-1].parts == [TextPart(), ImagePart(url=PIXEL)]
    # an image-only question is a question too
    only = {"role": "user", "content": [IMAGE]}
    again = await engine.prepare_call("pic", openai_to_messages([question, only]))
    assert assembled_to_openai(again.assembled_input)[-1] == only
    await engine.close()


async def test_a_tool_results_image_is_stored_counted_and_sent() -> None:
    engine = deterministic_engine()
    call = {"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}

    def history(result: Any) -> list[dict[str, Any]]:
        return [
            {"role": "user", "content": "Take a screenshot."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": result},
        ]

    pictured = [{"type": "text", "text": "the screen"}, IMAGE]
    plain = await engine.prepare_call("plain", openai_to_messages(history("the screen")))
    result = await engine.prepare_call("pic", openai_to_messages(history(pictured)))
    assert result.report.token_used == plain.report.token_used + 255
    tool = result.assembled_input.parts[-1]
    assert tool.role is Role.TOOL and tool.parts == [TextPart(), ImagePart(url=PIXEL)]
    doc = await engine.get_session("pic")
    assert doc.session.messages[-1].parts == [TextPart(), ImagePart(url=PIXEL)]
    # Anthropic takes images in a tool result; OpenAI's chat API does not (the check says so)
    anthropic = to_anthropic_messages(result.assembled_input.parts)
    assert anthropic.messages[-1]["content"][0]["content"][1]["type"] == "image"
    assert anthropic_problems(anthropic) == []
    assert openai_problems(to_openai_messages(result.assembled_input.parts))
    await engine.close()


@pytest.mark.parametrize(("budget", "action"), [(1200, "degraded"), (790, "dropped")])
async def test_an_old_image_heavy_message_goes_for_budget(budget: int, action: str) -> None:
    config = BudgetConfig(max_input_tokens=budget, reserved_reply_tokens=0)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=config))
    big = {"type": "image_url", "image_url": {"url": png(1024, 1024)}}  # 765 tokens
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Look at this."}, big]},
        {"role": "assistant", "content": "A big picture."},
        {"role": "user", "content": [{"type": "text", "text": "And this one?"}, big]},
    ]
    result = await engine.prepare_call("s", openai_to_messages(history))
    sent = assembled_to_openai(result.assembled_input)
    doc = await engine.get_session("s")
    old_id = f"msg:{doc.session.messages[0].message_id}"
    (decision,) = [d for d in result.report.prune_decisions if d.block_id == old_id]
    assert decision.action == action
    # the newest question keeps its picture, the old one's is gone: with its message, or
    # at a cheaper level whose text says what was left out
    assert sent[-1] == history[-1]
    assert sum(1 for m in sent if isinstance(m["content"], list)) == 1
    if action == "degraded":
        assert {"role": "user", "content": "Look at this.\n[image omitted]"} in sent
    else:
        assert not any("Look at this." in str(m["content"]) for m in sent)
    assert result.report.token_used <= budget
    estimator = TiktokenEstimator()
    recount = sum(estimator.estimate_part(p, "gpt-4o") for p in result.assembled_input.parts)
    assert recount + estimator.reply_priming("gpt-4o") == result.report.token_used
    await engine.close()


SIZES = st.sampled_from([(1, 1), (512, 512), (1024, 1024), (2048, 768), (3000, 200)])


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 8))):
        content: list[dict[str, Any]] = [
            {"type": "text", "text": f"question {i} " * draw(st.integers(1, 30))}
        ]
        for width, height in draw(st.lists(SIZES, max_size=3)):
            detail = draw(st.sampled_from(["auto", "low", "high"]))
            content.append(
                {"type": "image_url", "image_url": {"url": png(width, height), "detail": detail}}
            )
        out.append({"role": "user", "content": content})
        out.append({"role": "assistant", "content": f"answer {i} " * draw(st.integers(1, 40))})
    return out[:-1]


@settings(max_examples=60, deadline=None)
@given(
    histories(),
    st.integers(300, 12000),
    st.sampled_from(["gpt-4o", "gpt-4o-mini", "claude-sonnet-4"]),
)
def test_a_history_with_images_never_assembles_over_budget(
    history: list[dict[str, Any]], budget: int, model: str
) -> None:
    async def run() -> None:
        engine = deterministic_engine(
            RuntimeConfig(
                model_hint=model,
                budget=BudgetConfig(max_input_tokens=budget, reserved_reply_tokens=0),
            )
        )
        try:
            result = await engine.prepare_call("s", openai_to_messages(history))
        except BudgetExceededError:
            return  # the newest message alone does not fit: refused, never overrun
        finally:
            await engine.close()
        assembled = result.assembled_input
        estimator = TiktokenEstimator()
        recount = sum(estimator.estimate_part(p, model) for p in assembled.parts)
        assert assembled.total_tokens <= budget
        assert recount + estimator.reply_priming(model) == assembled.total_tokens
        assert result.report.token_used <= budget
        assert openai_problems(to_openai_messages(assembled.parts)) == []

    asyncio.run(run())


def test_render_live_context_keeps_media_at_live_level_only() -> None:
    from ce.core.state import AgentState, RenderOptions, render_live_context

    state = AgentState("s")
    state.append_model_input("old picture", parts=[TextPart(), ImagePart(url=PIXEL)])
    state.append_model_input("new picture", parts=[TextPart(), ImagePart(url=PIXEL)])
    parts = render_live_context(state, RenderOptions(summary_window=1))
    assert (parts[0].content, parts[0].parts) == ("old picture\n[image omitted]", None)
    assert parts[1].parts == [TextPart(), ImagePart(url=PIXEL)]
    assert parts[1].parts[1] is not state.document.session.messages[-1].parts[1]  # type: ignore[index]


def test_a_file_by_url_round_trips_and_the_openai_check_flags_it() -> None:
    by_url = {"type": "file", "file": {"file_url": "https://example.com/a.pdf"}}
    message = {"role": "user", "content": [{"type": "text", "text": "Read."}, by_url]}
    (part,) = from_openai_messages([message])
    assert part.parts == [TextPart(), FilePart(url="https://example.com/a.pdf")]
    assert to_openai_messages([part]) == [message]
    assert openai_problems([message]) == ["[0] a file part without file_data or file_id"]
    anthropic = to_anthropic_messages([part])
    assert anthropic.messages[0]["content"][1] == {
        "type": "document",
        "source": {"type": "url", "url": "https://example.com/a.pdf"},
    }


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    turns=st.integers(1, 6),
    budget=st.integers(300, 30000),
    model=st.sampled_from(["gpt-4o", "gpt-4.1-mini", "claude-sonnet-4"]),
)
def test_random_histories_with_pictures_stay_in_budget_and_valid_everywhere(
    seed: int, turns: int, budget: int, model: str
) -> None:
    # both tool flows, parallel and failed calls, and questions with one to three pictures of
    # random sizes: within the budget by the engine's own count, valid for every provider
    config = RuntimeConfig(
        model_hint=model, budget=BudgetConfig(max_input_tokens=budget, reserved_reply_tokens=0)
    )
    roomy = BudgetConfig(max_input_tokens=1_000_000)  # to write the history
    engine = deterministic_engine(RuntimeConfig(model_hint=model, budget=roomy))

    async def run() -> list[MessagePart] | None:
        await write_random_history(engine, "s", random.Random(seed), turns, images=0.5)
        try:
            result = await engine.prepare_turn("s", "and now?", config)
        except BudgetExceededError:
            event("refused: the newest question alone is over budget")
            return None
        finally:
            await engine.close()
        assembled = result.assembled_input
        estimator = TiktokenEstimator()
        recount = sum(estimator.estimate_part(p, model) for p in assembled.parts)
        assert recount + estimator.reply_priming(model) == assembled.total_tokens <= budget
        event(f"fits: {sum(1 for p in assembled.parts if p.parts)} message(s) with media")
        return list(assembled.parts)

    parts = asyncio.run(run())
    if parts is None:
        return
    assert openai_problems(to_openai_messages(parts)) == []
    assert anthropic_problems(to_anthropic_messages(parts)) == []
    assert gemini_problems(to_gemini_request(parts)) == []
