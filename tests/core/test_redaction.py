"""Redaction: built-in rules (positives and look-alikes), user rules, values, bounds."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ce.core.config import RedactionConfig, RedactionRules
from ce.core.errors import RedactionError
from ce.core.redaction import (
    _BUILTINS,
    BUILTIN_RULES,
    Redactor,
    RedactResult,
    RegexRedactor,
    _Scan,
    _spans,
    _validated_spans,
    marker,
)

JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
    "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy\n"
    "Proc-Type: 4,ENCRYPTED\nq7rZ9x2YhQ==\n-----END RSA PRIVATE KEY-----"
)

# (rule, canary): every canary must disappear behind [REDACTED:<rule>]
CANARIES = [
    ("email", "jane.doe+test@example-mail.co.uk"),
    ("email", "zhang.san@example.cn"),
    ("phone", "+1 415 555 0123"),
    ("phone", "(415) 555-0123"),
    ("phone", "415-555-0123"),
    ("phone", "1-800-555-0199"),
    ("phone", "+44 20 7946 0958"),
    ("phone", "+44 (0)20 7946 0958"),
    ("phone", "+86 138 1234 5678"),
    ("phone", "+4915123456789"),
    ("phone", "13812345678"),
    ("phone", "138-1234-5678"),
    ("phone", "020 7946 0958"),
    ("phone", "(030) 1234567"),
    ("phone", "010-12345678"),
    ("phone", "06 12 34 56 78"),
    ("payment_card", "4111 1111 1111 1111"),
    ("payment_card", "5500-0000-0000-0004"),
    ("payment_card", "6011111111111117"),
    ("payment_card", "378282246310005"),
    ("payment_card", "3782 822463 10005"),
    ("ipv4", "192.168.10.20"),
    ("ipv4", "8.8.8.8"),
    ("ipv6", "2001:db8:85a3::8a2e:370:7334"),
    ("ipv6", "fe80:0:0:0:202:b3ff:fe1e:8329"),
    ("ipv6", "::ffff:192.0.2.128"),
    ("api_key", "sk-proj-A1b2C3d4E5f6G7h8I9j0K1l2M3n4"),
    ("api_key", "sk-ant-api03-abcDEF123456ghiJKL789mno"),
    ("api_key", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("api_key", "AKIAIOSFODNN7EXAMPLE"),
    ("api_key", "ghp_" + "aB3" * 12),
    ("api_key", "github_pat_11ABCDEFG0123456789_abcdefghij"),
    ("api_key", "xoxb-1234567890-abcdefghij"),
    ("api_key", "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6q"),
    ("bearer_token", "Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0"),
    ("bearer_token", JWT),
    ("private_key", PEM),
]

# (rule, text, secret): only the value of a credential assignment is replaced
ASSIGNMENTS = [
    ("password=Tr0ub4dor!3", "Tr0ub4dor!3"),
    ('{"api_key": "abc123def456ghi"}', "abc123def456ghi"),
    ("DB_PASSWORD: 'hunter2hunter2'", "hunter2hunter2"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG"),
    ("https://api.example.com/v1?token=abc12345678&page=2", "abc12345678"),
    ("clientSecret=s3cr3t-value", "s3cr3t-value"),
]

LOOK_ALIKES = [
    "The year 2026 was a good one.",
    "pi is 3.14159 and e is 2.71828",
    "order 12345 shipped; invoice 2026-0042",
    "price $1,234.56 or €99.90",
    "version 1.2.3, build v1.2.3.4, tuple 1.2.3.4.5",
    "IP-like but not: 256.1.1.1 and 10.0.0.256",
    "on 2026-01-15 at 10:30:45, or 15.01.2026, or 01/15/2026",
    "epoch 1700000000, in ms 1700000000000",
    "card-like but fails Luhn: 4111 1111 1111 1112",
    "starts outside the card ranges: 1234567812345670",
    "ISBN 978-3-16-148410-0",
    "MAC 00:1a:2b:3c:4d:5e and std::vector<int> and a[1::2] and ::1",
    "max_tokens=1024 tokenizer=cl100k_base",
    "password: Optional[str] = None",
    "bearer bonds and Bearer certificates",
    "sk-learn-compatible-estimators",
    "user@localhost and file.txt@v2",
    "call me at 555-0123",
    "room 101-102, range 00-999",
    "订单号 2026012345，金额 3.50 元",
]


@pytest.fixture(scope="module")
def redactor() -> RegexRedactor:
    return RegexRedactor()


def test_builtin_rule_names() -> None:
    assert set(BUILTIN_RULES) == {
        "private_key",
        "bearer_token",
        "api_key",
        "email",
        "payment_card",
        "ipv6",
        "ipv4",
        "phone",
    }
    assert RegexRedactor().rule_names == list(BUILTIN_RULES)
    assert isinstance(RegexRedactor(), Redactor)


@pytest.mark.parametrize(("rule", "canary"), CANARIES)
@pytest.mark.parametrize(
    "template", ["{} ", "contact: {}.", "我的信息是{}，谢谢", "({})", '"{}"'], ids=repr
)
def test_builtin_rules_redact_their_canaries(
    redactor: RegexRedactor, rule: str, canary: str, template: str
) -> None:
    result = redactor.redact_text(template.format(canary))
    assert canary not in result.redacted_text
    assert result.redacted_text == template.format(marker(rule))
    assert result.applied_rules == [rule]
    assert result.has_sensitive


@pytest.mark.parametrize(("text", "secret"), ASSIGNMENTS)
def test_credential_assignments_keep_the_key(
    redactor: RegexRedactor, text: str, secret: str
) -> None:
    result = redactor.redact_text(text)
    assert secret not in result.redacted_text
    assert marker("api_key") in result.redacted_text
    assert result.redacted_text.startswith(text[:8])  # the key name stays readable
    assert result.applied_rules == ["api_key"]


@pytest.mark.parametrize("text", LOOK_ALIKES)
def test_look_alikes_are_left_alone(redactor: RegexRedactor, text: str) -> None:
    assert redactor.redact_text(text) == RedactResult(text, [], False)


def test_several_rules_in_one_text(redactor: RegexRedactor) -> None:
    text = (
        "我的手机号是13812345678，邮箱是zhang.san@example.cn。服务器 10.1.2.3，卡号4111111111111111"
    )
    result = redactor.redact_text(text)
    assert result.redacted_text == (
        "我的手机号是[REDACTED:phone]，邮箱是[REDACTED:email]。服务器 [REDACTED:ipv4]，"
        "卡号[REDACTED:payment_card]"
    )
    assert result.applied_rules == ["email", "payment_card", "ipv4", "phone"]


def test_a_text_redacted_again_gives_the_same_result_of_its_own(
    redactor: RegexRedactor,
) -> None:
    text = "write to zhang.san@example.cn"
    first = redactor.redact_text(text)
    first.applied_rules.append("changed by the caller")
    again = redactor.redact_text(text)
    assert again.redacted_text == "write to [REDACTED:email]"
    assert again.applied_rules == ["email"] and again.has_sensitive
    clean = redactor.redact_text("nothing to hide")
    assert redactor.redact_text("nothing to hide") == clean
    assert clean.applied_rules == [] and not clean.has_sensitive
    for i in range(600):  # more texts than it remembers: still right
        assert redactor.redact_text(f"{i} a@b.io").redacted_text == f"{i} [REDACTED:email]"
    assert redactor.redact_text(text).applied_rules == ["email"]


def test_builtin_selection() -> None:
    only_email = RegexRedactor(builtin=["email"])
    text = "a@b.com 8.8.8.8"
    assert only_email.redact_text(text).redacted_text == "[REDACTED:email] 8.8.8.8"
    assert only_email.rule_names == ["email"]
    assert RegexRedactor(builtin=[]).redact_text(text).redacted_text == text
    defaults = RedactionConfig()
    assert defaults.builtin_rules is None  # None means every built-in rule
    assert RegexRedactor(defaults.rules, defaults.builtin_rules).rule_names == list(BUILTIN_RULES)


def test_unknown_builtin_rule_is_an_error() -> None:
    with pytest.raises(RedactionError, match="unknown built-in redaction rules"):
        RegexRedactor(builtin=["email", "ssn"])


# --- user rules ----------------------------------------------------------------------------------


def test_user_patterns_named_and_unnamed() -> None:
    rules = RedactionRules(patterns=(r"employee_id=EMP-\d{6}", r"PRJ-[A-Z]{3}"))
    result = RegexRedactor(rules).redact_text("EMP-004211 works on PRJ-XYZ with a@b.io")
    assert result.redacted_text == (
        "[REDACTED:employee_id] works on [REDACTED:custom_1] with [REDACTED:email]"
    )
    assert result.applied_rules == ["employee_id", "custom_1", "email"]


def test_user_pattern_that_matches_empty_inserts_nothing() -> None:
    result = RegexRedactor(RedactionRules(patterns=("x*",)), builtin=[]).redact_text("abxxc")
    assert result.redacted_text == "ab[REDACTED:custom_0]c"


def test_dictionaries_are_literal_case_insensitive_whole_words() -> None:
    rules = RedactionRules(dictionaries=("Project Falcon", "Ann", "张三", "a.b*c"))
    redactor = RegexRedactor(rules, builtin=[])
    result = redactor.redact_text("project falcon: Ann met 张三在北京; Annual report; a.b*c; aXbbc")
    assert result.redacted_text == (
        "[REDACTED:dictionary]: [REDACTED:dictionary] met [REDACTED:dictionary]在北京; "
        "Annual report; [REDACTED:dictionary]; aXbbc"
    )
    assert result.applied_rules == ["dictionary"]


def test_existing_markers_are_never_redacted_again() -> None:
    redactor = RegexRedactor(RedactionRules(dictionaries=("RED", "email")))
    result = redactor.redact_text("RED alert for [REDACTED:email] and [REDACTED:phone]")
    assert result.redacted_text == (
        "[REDACTED:dictionary] alert for [REDACTED:email] and [REDACTED:phone]"
    )


@pytest.mark.parametrize("pattern", ["(unclosed", "a{2,1}", "name=[z-a]", "*"])
def test_invalid_user_pattern_raises_at_construction(pattern: str) -> None:
    with pytest.raises(RedactionError, match="invalid redaction pattern"):
        RegexRedactor(RedactionRules(patterns=(pattern,)))


def test_user_pattern_timeout_raises_redaction_error() -> None:
    redactor = RegexRedactor(RedactionRules(patterns=("(a+)+$",)), pattern_timeout=0.05)
    with pytest.raises(RedactionError, match="timed out"):
        redactor.redact_text("a" * 50_000 + "b")


async def test_async_redact_wraps_redact_text(redactor: RegexRedactor) -> None:
    text = "mail a@b.co or call +1 415 555 0123"
    assert await redactor.redact(text) == redactor.redact_text(text)
    per_call = await redactor.redact(
        "ticket T-1234 from a@b.co", RedactionRules(patterns=(r"T-\d+",))
    )
    assert per_call.redacted_text == "ticket [REDACTED:custom_0] from [REDACTED:email]"
    assert redactor.redact_text("ticket T-1234").redacted_text == "ticket T-1234"


async def test_async_redact_raises_on_timeout() -> None:
    redactor = RegexRedactor(pattern_timeout=0.05)
    with pytest.raises(RedactionError):
        await redactor.redact("a" * 50_000 + "b", RedactionRules(patterns=("(a+)+$",)))


# --- values --------------------------------------------------------------------------------------


def test_redact_value_walks_containers_and_field_paths() -> None:
    redactor = RegexRedactor(RedactionRules(field_paths=("password", "$.auth.token", "Headers.X")))
    args = {
        "user": "jane@example.com",
        "Password": 123456,
        "auth": {"token": {"nested": "anything"}, "user": "ok"},
        "other": {"token": "kept: no field path matches other.token"},
        "headers": [{"x": "a"}, {"y": "b"}],
        "hits": ["call 415-555-0123", ("8.8.8.8", 4111111111111111, 3.5, True, None)],
        "bob@example.com": 1,
        7: "seven",
    }
    redacted, rules = redactor.redact_value(args)
    assert redacted == {
        "user": "[REDACTED:email]",
        "Password": "[REDACTED:field_path]",
        "auth": {"token": "[REDACTED:field_path]", "user": "ok"},
        "other": {"token": "kept: no field path matches other.token"},
        "headers": [{"x": "[REDACTED:field_path]"}, {"y": "b"}],
        "hits": [
            "call [REDACTED:phone]",
            ("[REDACTED:ipv4]", "[REDACTED:payment_card]", 3.5, True, None),
        ],
        "[REDACTED:email]": 1,
        7: "seven",
    }
    assert rules == ["email", "field_path", "phone", "ipv4", "payment_card"]
    assert args["user"] == "jane@example.com"  # the input is not modified


def test_redact_value_of_clean_data_is_equal_and_applies_nothing(redactor: RegexRedactor) -> None:
    data = {"q": "weather in Paris", "n": 3, "tags": ["a", "b"]}
    assert redactor.redact_value(data) == (data, [])


# --- properties ----------------------------------------------------------------------------------

NOISE = st.text(alphabet="0123456789 .,-:+@()[]/=_abcxyzABCEFkx号码，\n", min_size=0, max_size=30)
FRAGMENTS = st.one_of(
    NOISE,
    st.sampled_from([c for _, c in CANARIES]),
    st.sampled_from(LOOK_ALIKES),
    st.sampled_from([t for t, _ in ASSIGNMENTS]),
    st.sampled_from(["[REDACTED:email]", "Bearer ", "password=", "sk-", "+1 ", "::", "1.2."]),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(FRAGMENTS, max_size=8).map("".join))
def test_redacting_twice_equals_once(text: str) -> None:
    redactor = RegexRedactor()
    once = redactor.redact_text(text)
    twice = redactor.redact_text(once.redacted_text)
    assert twice.redacted_text == once.redacted_text
    assert twice.applied_rules == []  # nothing in the output matches a rule any more


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(FRAGMENTS, max_size=8).map("".join))
def test_rules_skipped_without_a_digit_never_match_without_one(text: str) -> None:
    # a text with no ASCII digit is not scanned by these rules: none of their patterns can
    # match there
    gated = [rule for rule in _BUILTINS if rule.digits]
    assert {rule.name for rule in gated} == {"payment_card", "ipv4", "phone"}
    no_digits = text.translate(str.maketrans("", "", "0123456789"))
    for rule in gated:
        for m in rule.pattern.finditer(text):
            assert any(c in "0123456789" for c in m.group())
        assert rule.pattern.search(no_digits) is None


LOCATED_TEXT = st.lists(
    st.one_of(
        st.text(alphabet="0123456789 .-+()x,_a:", max_size=24),
        st.sampled_from(["192.168.0.1", "10.0.0.255", "4111 1111 1111 1111", "+44 20 7946 0958"]),
        st.sampled_from(["(030) 1234567", "1.2.3.4.5", "999.1.1.1", "v1.2.3.4", "0.0.0.0."]),
    ),
    max_size=8,
).map("".join)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(LOCATED_TEXT)
def test_a_rules_locator_finds_every_match_of_its_pattern(text: str) -> None:
    # the precise pattern runs only inside the locator's matches: it must find there what it
    # finds scanning the whole text
    scan = _Scan(text)
    located = [rule for rule in _BUILTINS if rule.locator is not None]
    assert {rule.name for rule in located} == {"payment_card", "ipv4", "phone"}
    for rule in located:
        assert _spans(rule, scan) == _validated_spans(rule, scan, 0, len(text)), rule.name
    ipv4 = next(rule for rule in located if rule.name == "ipv4")
    assert _spans(ipv4, scan) == [
        m.span() for m in ipv4.pattern.finditer(text) if m.end() > m.start()
    ]


@st.composite
def _secrets_in_noise(draw: st.DrawFn) -> tuple[str, list[str]]:
    secrets = draw(st.lists(st.sampled_from([c for _, c in CANARIES]), min_size=1, max_size=4))
    words = draw(st.lists(st.sampled_from(["note", "见", "and", "ok", "2026", "v1.2"]), max_size=4))
    parts = [*secrets, *words]
    order = draw(st.permutations(parts))
    return " ; ".join(order), secrets


@settings(max_examples=200)
@given(_secrets_in_noise())
def test_canary_secrets_never_survive(case: tuple[str, list[str]]) -> None:
    text, secrets = case
    redacted = RegexRedactor().redact_text(text).redacted_text
    for secret in secrets:
        assert secret not in redacted


# --- bounded work --------------------------------------------------------------------------------

_HOSTILE = textwrap.dedent(
    """
    from ce.core.redaction import RegexRedactor

    redactor = RegexRedactor()
    size = 512 * 1024
    units = [
        "1", ".", "1.", "a", "@", "a@", "a@b.", ":", "1:", "a:", "::", "+1 ", "+1", "1 ", "1-",
        "(1) ", "0 ", "4111 ", "sk-", "eyJ", "eyJa.", "Bearer ", "a=", "password=", "token:",
        "-----BEGIN PRIVATE KEY-----", "-", "[REDACTED:x]", "x" * 63 + "@", "1.1.1.1.", "ab.",
        "a.b@c", "上", " ", "password=a1",
    ]
    for unit in units:
        text = (unit * (size // len(unit) + 1))[:size]
        redactor.redact_text(text)
    print("done")
    """
)


@pytest.mark.slow
def test_builtin_patterns_stay_linear_on_hostile_input() -> None:
    # A backtracking blow-up on half a megabyte would take hours; the subprocess's generous
    # timeout turns such a hang into a failure instead of a stuck test run.
    done = subprocess.run(
        [sys.executable, "-c", _HOSTILE], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
