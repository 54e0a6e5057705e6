"""Ref selectors: every type, combinations, every error path, bounded work."""

from __future__ import annotations

import json

import pytest

from ce.core.errors import SelectorResolveError
from ce.core.selectors import ParsedSelector, RefSelector

LINES = "".join(f"line {i}\n" for i in range(1, 21))  # 20 lines, final newline
DOC = json.dumps(
    {
        "data": {
            "items": [{"name": "alpha, beta", "n": 1}, {"name": "gamma", "n": 2}],
            "key with space": {"x": [1, 2]},
            "quote'd": "q",
            "nested": {"deep": None},
            "名前": "名字",
        }
    },
    ensure_ascii=False,
)


@pytest.fixture
def sel() -> RefSelector:
    return RefSelector()


# --- parse ---------------------------------------------------------------------------------------


def test_parse_each_type(sel: RefSelector) -> None:
    assert sel.parse("lines:12-18") == [ParsedSelector("lines", {"from": 12, "to": 18})]
    assert sel.parse("lines:5") == [ParsedSelector("lines", {"from": 5, "to": 5})]
    assert sel.parse("lines:5-") == [ParsedSelector("lines", {"from": 5, "to": None})]
    assert sel.parse("chars:120-260") == [ParsedSelector("chars", {"from": 120, "to": 260})]
    assert sel.parse("chars:7") == [ParsedSelector("chars", {"from": 7, "to": 8})]
    assert sel.parse("json:$.data.items[0].name") == [
        ParsedSelector(
            "json",
            {
                "path": "$.data.items[0].name",
                "steps": [("key", "data"), ("key", "items"), ("index", 0), ("key", "name")],
            },
        )
    ]
    assert sel.parse(r"regex:def\s+\w+") == [ParsedSelector("regex", {"pattern": r"def\s+\w+"})]


def test_parse_splits_only_before_a_known_type(sel: RefSelector) -> None:
    parsed = sel.parse(r"regex:a{1,3},b, lines:2-3,json:$['a,b'],chars:0-1")
    assert [p.type for p in parsed] == ["regex", "lines", "json", "chars"]
    assert parsed[0].params == {"pattern": "a{1,3},b"}
    assert parsed[2].params["steps"] == [("key", "a,b")]
    escaped = sel.parse(r"regex:x\,lines:1")  # an escaped comma never splits
    assert escaped == [ParsedSelector("regex", {"pattern": r"x\,lines:1"})]


@pytest.mark.parametrize(
    "selector",
    [
        "",
        "lines",
        "foo:1-2",
        "LINES:1-2",
        "lines:",
        "lines:a-b",
        "lines:1-2-3",
        "lines:0",
        "lines:0-3",
        "lines:5-3",
        "lines:-3",
        "chars:5-5",
        "chars:9-2",
        "chars:1.5-3",
        "json:",
        "json:data.items",
        "json:$.",
        "json:$..a",
        "json:$[",
        "json:$[abc]",
        "json:$['unterminated]",
        "json:$.a[1",
        "regex:",
        "regex:(unclosed",
        "regex:a{2,1}",
        "lines:1-2,",
        "lines:1-2,bogus:3",
    ],
)
def test_malformed_selectors(sel: RefSelector, selector: str) -> None:
    with pytest.raises(SelectorResolveError):
        sel.parse(selector)
    with pytest.raises(SelectorResolveError):
        sel.extract(LINES, selector)


def test_selector_limits(sel: RefSelector) -> None:
    with pytest.raises(SelectorResolveError, match="limit is 4096"):
        sel.parse("regex:" + "a" * 5000)
    with pytest.raises(SelectorResolveError, match="parts"):
        sel.parse(",".join(["lines:1"] * 17))
    with pytest.raises(SelectorResolveError, match="steps"):
        sel.parse("json:$" + ".a" * 65)


# --- lines and chars -----------------------------------------------------------------------------


def test_lines(sel: RefSelector) -> None:
    assert sel.extract(LINES, "lines:12-14") == "line 12\nline 13\nline 14"
    assert sel.extract(LINES, "lines:1") == "line 1"
    assert sel.extract(LINES, "lines:19-") == "line 19\nline 20"
    assert sel.extract(LINES, "lines:20") == "line 20"
    assert sel.extract("a\nb", "lines:2") == "b"  # no final newline
    assert sel.extract("a\r\nb\r\n", "lines:1") == "a\r"  # lines end at \n only
    assert sel.extract("a\n\nc", "lines:2") == ""  # an empty line is a line


@pytest.mark.parametrize(
    ("content", "selector", "message"),
    [
        (LINES, "lines:21", "lines:21 is out of range: the content has 20 lines"),
        (LINES, "lines:18-25", "the content has 20 lines"),
        (LINES, "lines:21-", "the content has 20 lines"),
        ("", "lines:1", "the content has 0 lines"),
    ],
)
def test_lines_out_of_range(sel: RefSelector, content: str, selector: str, message: str) -> None:
    with pytest.raises(SelectorResolveError, match=message):
        sel.extract(content, selector)


def test_chars(sel: RefSelector) -> None:
    text = "0123456789"
    assert sel.extract(text, "chars:2-5") == "234"
    assert sel.extract(text, "chars:7-") == "789"
    assert sel.extract(text, "chars:0") == "0"
    assert sel.extract(text, "chars:0-10") == text
    assert sel.extract("上下文工程", "chars:1-3") == "下文"


@pytest.mark.parametrize("selector", ["chars:10", "chars:5-11", "chars:10-", "chars:12-20"])
def test_chars_out_of_range(sel: RefSelector, selector: str) -> None:
    with pytest.raises(SelectorResolveError, match="the content has 10 characters"):
        sel.extract("0123456789", selector)


# --- json ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("json:$.data.items[0].name", "alpha, beta"),
        ("json:$.data.items[-1].name", "gamma"),
        ("json:$.data.items[1]", '{"name": "gamma", "n": 2}'),
        ("json:$.data.items[0].n", "1"),
        ("json:$.data.nested.deep", "null"),
        ("json:$.data['key with space'].x", "[1, 2]"),
        ('json:$.data["key with space"].x[0]', "1"),
        (r"json:$.data['quote\'d']", "q"),
        ("json:$.data.名前", "名字"),
        ("json:$.data.items[*].name", '["alpha, beta", "gamma"]'),
        ("json:$.data.items.*.n", "[1, 2]"),
        ("json:$.data.items[*]", '[{"name": "alpha, beta", "n": 1}, {"name": "gamma", "n": 2}]'),
        ("json:$.data.nested[*]", "[null]"),
        ("json:$.data.items[*].missing_in_one", None),
    ],
)
def test_json(sel: RefSelector, selector: str, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(SelectorResolveError, match="does not match"):
            sel.extract(DOC, selector)
    else:
        assert sel.extract(DOC, selector) == expected


def test_json_root_and_wildcard_skipping_missing_keys(sel: RefSelector) -> None:
    assert json.loads(sel.extract(DOC, "json:$")) == json.loads(DOC)
    doc = json.dumps([{"a": 1}, {"b": 2}, {"a": 3}, 4])
    assert sel.extract(doc, "json:$[*].a") == "[1, 3]"


@pytest.mark.parametrize(
    ("content", "selector", "message"),
    [
        ("not json", "json:$.a", "the content is not JSON"),
        ("", "json:$", "the content is not JSON"),
        (DOC, "json:$.data.nope", "expected an object with key 'nope' at \\$\\['data'\\]"),
        (DOC, "json:$.data.items[2]", "index 2 is out of range"),
        (DOC, "json:$.data.items[-3]", "index -3 is out of range"),
        (DOC, "json:$.data.items.name", "expected an object with key 'name'"),
        (DOC, "json:$.data[0]", "expected a list at"),
        (DOC, "json:$.data.items[0].name[*]", "expected a list or object at"),
        ("[" * 100_000 + "]" * 100_000, "json:$", "nested too deeply"),
    ],
)
def test_json_errors(sel: RefSelector, content: str, selector: str, message: str) -> None:
    with pytest.raises(SelectorResolveError, match=message):
        sel.extract(content, selector)


# --- regex ---------------------------------------------------------------------------------------

CODE = "def alpha(x):\n    return x\n\ndef beta(y):\n    return y\n"


def test_regex(sel: RefSelector) -> None:
    assert sel.extract(CODE, r"regex:def\s+\w+") == "def alpha\ndef beta"
    assert sel.extract(CODE, r"regex:def\s+(\w+)") == "alpha\nbeta"  # one group: group 1
    assert sel.extract(CODE, r"regex:def\s+(\w)(\w+)") == "def alpha\ndef beta"
    assert sel.extract(CODE, r"regex:(?m)^\s+return (\w)$") == "x\ny"
    assert sel.extract("a,b,c", r"regex:[a-z](?=\,)") == "a\nb"


def test_regex_without_match(sel: RefSelector) -> None:
    with pytest.raises(SelectorResolveError, match="does not match"):
        sel.extract(CODE, "regex:class \\w+")
    with pytest.raises(SelectorResolveError, match="does not match"):
        sel.extract(CODE, "regex:z*")  # only empty matches


def test_hostile_regex_times_out_instead_of_hanging() -> None:
    sel = RefSelector(regex_timeout=0.05)
    with pytest.raises(SelectorResolveError, match=r"did not finish within 0\.05s"):
        sel.extract("a" * 50_000 + "b", "regex:(a+)+$")


def test_many_matches_are_bounded_by_the_timeout() -> None:
    sel = RefSelector(regex_timeout=0.01)
    with pytest.raises(SelectorResolveError, match="did not finish"):
        sel.extract("ab" * 4_000_000, "regex:.")


# --- combinations and bounds ---------------------------------------------------------------------


def test_combinations_apply_in_order(sel: RefSelector) -> None:
    assert sel.extract(LINES, "lines:12-14,chars:0-7") == "line 12"
    assert sel.extract(LINES, "lines:10-19, regex:line (1[5-9])") == "15\n16\n17\n18\n19"
    assert sel.extract(LINES, r"regex:line 1\d,lines:2") == "line 11"
    assert sel.extract(DOC, "json:$.data.items,json:$[1].name") == "gamma"
    assert sel.extract(CODE, r"lines:4-5,regex:return (\w)") == "y"


def test_combination_errors_name_the_failing_part(sel: RefSelector) -> None:
    with pytest.raises(SelectorResolveError, match="lines:3 is out of range"):
        sel.extract(LINES, "lines:1-2,lines:3")
    with pytest.raises(SelectorResolveError, match="not JSON"):
        sel.extract(LINES, "lines:1,json:$")


def test_huge_content_is_refused() -> None:
    sel = RefSelector(max_content_chars=1000)
    assert sel.extract("x" * 1000, "chars:0-1") == "x"
    with pytest.raises(SelectorResolveError, match="at most 1000"):
        sel.extract("x" * 1001, "chars:0-1")
    with pytest.raises(SelectorResolveError, match="at most 8388608"):
        RefSelector().extract("x" * (8 * 1024 * 1024 + 1), "lines:1")


def test_selector_resolve_error_is_a_value_error(sel: RefSelector) -> None:
    with pytest.raises(ValueError):
        sel.extract("abc", "lines:9")
