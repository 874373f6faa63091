"""Label selectors: parsing, metav1 conversion, matching, printing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from informers.labels import LabelSelector, Operator, Requirement


def test_parse_all_operators_and_print_back() -> None:
    text = "a=b,c!=d,e in (x,y),f notin (z),g,!h"
    sel = LabelSelector.parse(text)
    assert [(r.key, r.operator, r.values) for r in sel.requirements] == [
        ("a", Operator.EQUALS, ("b",)),
        ("c", Operator.NOT_EQUALS, ("d",)),
        ("e", Operator.IN, ("x", "y")),
        ("f", Operator.NOT_IN, ("z",)),
        ("g", Operator.EXISTS, ()),
        ("h", Operator.DOES_NOT_EXIST, ()),
    ]
    assert str(sel) == text


def test_canonical_form_sorts_keys_and_values() -> None:
    sel = LabelSelector.parse("  z in ( b , a, b ),  example.com/app == web ,!y")
    assert str(sel) == "example.com/app==web,!y,z in (a,b)"
    assert LabelSelector.parse(str(sel)) == sel


def test_empty_value_forms() -> None:
    assert LabelSelector.parse("a=").requirements[0].values == ("",)
    assert LabelSelector.parse("a=,b=c").requirements[0].values == ("",)
    assert LabelSelector.parse("a in (x,)").requirements[0].values == ("", "x")
    assert LabelSelector.parse("a in (,x)").requirements[0].values == ("", "x")
    assert LabelSelector.parse("a=").matches({"a": ""})
    assert not LabelSelector.parse("a=").matches({"a": "x"})
    assert not LabelSelector.parse("a=").matches({})


def test_a_lone_empty_value_in_a_set_prints_parsably() -> None:
    # "a in ()" is rejected (by the API server too), so {""} must print as "(,)".
    sel = LabelSelector.of([Requirement.create("a", Operator.IN, [""])])
    assert str(sel) == "a in (,)"
    assert LabelSelector.parse(str(sel)) == sel
    assert sel.matches({"a": ""})


def test_keywords_are_values_after_an_operator() -> None:
    assert LabelSelector.parse("a=in").matches({"a": "in"})
    assert LabelSelector.parse("a in (notin)").matches({"a": "notin"})


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_selector_matches_everything(text: str) -> None:
    sel = LabelSelector.parse(text)
    assert sel.empty
    assert sel == LabelSelector.everything()
    assert sel.matches({})
    assert sel.matches(None)
    assert sel.matches({"a": "b"})
    assert str(sel) == ""


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("a=b", {"a": "b"}, True),
        ("a=b", {"a": "c"}, False),
        ("a=b", {}, False),
        ("a==b", {"a": "b"}, True),
        ("a!=b", {"a": "c"}, True),
        ("a!=b", {}, True),  # absent label satisfies !=
        ("a!=b", {"a": "b"}, False),
        ("a in (x,y)", {"a": "y"}, True),
        ("a in (x,y)", {"a": "z"}, False),
        ("a in (x,y)", {}, False),
        ("a notin (x,y)", {}, True),  # absent label satisfies notin
        ("a notin (x,y)", {"a": "x"}, False),
        ("a notin (x,y)", {"a": "z"}, True),
        ("a", {"a": ""}, True),
        ("a", {"b": "a"}, False),
        ("!a", {}, True),
        ("!a", {"a": ""}, False),
        ("a=b,c", {"a": "b"}, False),
        ("a=b,c", {"a": "b", "c": "d"}, True),
    ],
)
def test_matches(text: str, labels: dict[str, str], expected: bool) -> None:
    assert LabelSelector.parse(text).matches(labels) is expected


def test_matches_object() -> None:
    sel = LabelSelector.parse("app=web")
    assert sel.matches_object({"metadata": {"labels": {"app": "web"}}})
    assert not sel.matches_object({"metadata": {}})
    assert not sel.matches_object({})
    assert LabelSelector.parse("!app").matches_object({"metadata": {"labels": None}})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a in (x", "expected a value, ',' or ')'"),
        ("a in x", "expected '('"),
        ("a in ()", "at least one value"),
        ("a notin b", "expected '('"),
        ("=b", "expected a label key"),
        ("a=b=c", "found '='"),
        ("a=b c", "found 'c'"),
        ("a,,b", "expected a label key"),
        ("a=b,", "expected a label key"),
        ("!a=b", "found '='"),
        ("!", "expected a label key"),
        ("a > 1", "'>' is not supported"),
        ("-a=b", "invalid label key '-a'"),
        ("a=-b", "invalid value '-b'"),
        ("a=" + "x" * 64, "at most 63"),
        ("Bad.Prefix/a=b", "prefix must be a DNS-1123 subdomain"),
        ("/a=b", "prefix must be"),
        ("a/=b", "the name must be"),
        ("in=b", "found 'in'"),
    ],
)
def test_parse_errors_name_the_bad_part(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="invalid label selector") as info:
        LabelSelector.parse(text)
    assert fragment in str(info.value)
    assert repr(text) in str(info.value)


def test_from_dict() -> None:
    sel = LabelSelector.from_dict(
        {
            "matchLabels": {"app": "web", "tier": "front"},
            "matchExpressions": [
                {"key": "env", "operator": "In", "values": ["prod", "staging"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "team", "operator": "Exists", "values": []},
                {"key": "zone", "operator": "NotIn", "values": ["z1"]},
            ],
        }
    )
    assert str(sel) == "app=web,!canary,env in (prod,staging),team,tier=front,zone notin (z1)"
    assert sel == LabelSelector.parse(str(sel))
    good = {"app": "web", "tier": "front", "env": "prod", "team": "t"}
    assert sel.matches(good)
    assert not sel.matches({**good, "canary": "1"})
    assert not sel.matches({**good, "zone": "z1"})
    assert not sel.matches({k: v for k, v in good.items() if k != "team"})


def test_from_dict_empty_matches_everything() -> None:
    assert LabelSelector.from_dict({}).empty
    assert LabelSelector.from_dict({"matchLabels": None, "matchExpressions": None}).empty


def test_from_labels() -> None:
    sel = LabelSelector.from_labels({"b": "2", "a": "1"})
    assert str(sel) == "a=1,b=2"
    assert sel.matches({"a": "1", "b": "2", "c": "3"})


@pytest.mark.parametrize(
    ("selector", "fragment"),
    [
        ({"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]}, "Equals"),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}, "at least one"),
        ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "at least one"),
        ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "no values"),
        ({"matchExpressions": [{"operator": "Exists"}]}, "matchExpressions[0].key"),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]}, "list of strings"),
        ({"matchExpressions": ["a"]}, "matchExpressions[0] must be a mapping"),
        ({"matchLabels": {"a": 1}}, "matchLabels['a']"),
        ({"matchLabels": ["a"]}, "matchLabels must be a mapping"),
        ({"matchLabels": {"a b": "c"}}, "invalid label key 'a b'"),
        (
            {
                "matchExpressions": [
                    {"key": "ok", "operator": "Exists"},
                    {"key": "_x", "operator": "Exists"},
                ]
            },
            "matchExpressions[1]",
        ),
    ],
)
def test_from_dict_errors(selector: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        LabelSelector.from_dict(selector)
    assert fragment in str(info.value)


def test_requirement_create_validates_arity() -> None:
    with pytest.raises(ValueError, match="exactly one value"):
        Requirement.create("a", "=", ["x", "y"])
    with pytest.raises(ValueError, match="invalid operator"):
        Requirement.create("a", "gt", ["1"])
    assert Requirement.create("a", "in", ["y", "x", "y"]).values == ("x", "y")


def test_selectors_are_hashable_values() -> None:
    assert hash(LabelSelector.parse("a=b,c")) == hash(LabelSelector.parse("c, a=b"))
    assert len({LabelSelector.parse("a=b,c"), LabelSelector.parse("c,a=b")}) == 1


# --- properties ------------------------------------------------------------------------------

label_name = st.from_regex(r"[a-z0-9]([-a-z0-9_.]{0,6}[a-z0-9])?", fullmatch=True)
dns_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?", fullmatch=True)
label_key = st.one_of(label_name, st.builds(lambda p, n: f"{p}.io/{n}", dns_label, label_name))
label_value = st.one_of(st.just(""), label_name)


@st.composite
def requirements(draw: st.DrawFn) -> Requirement:
    key = draw(st.sampled_from(["a", "b", "example.io/c"]) | label_key)
    op = draw(st.sampled_from(list(Operator)))
    if op in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
        values: list[str] = []
    elif op in (Operator.IN, Operator.NOT_IN):
        values = draw(st.lists(label_value, min_size=1, max_size=3))
    else:
        values = [draw(label_value)]
    return Requirement.create(key, op, values)


def reference_match(req: Requirement, labels: dict[str, str]) -> bool:
    if req.operator == Operator.EXISTS:
        return req.key in labels
    if req.operator == Operator.DOES_NOT_EXIST:
        return req.key not in labels
    if req.operator in (Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.IN):
        return req.key in labels and labels[req.key] in req.values
    return req.key not in labels or labels[req.key] not in req.values


@given(
    reqs=st.lists(requirements(), max_size=5),
    labels=st.dictionaries(st.sampled_from(["a", "b", "example.io/c", "d"]), label_value),
)
def test_roundtrip_and_match_agree_with_reference(
    reqs: list[Requirement], labels: dict[str, str]
) -> None:
    sel = LabelSelector.of(reqs)
    assert LabelSelector.parse(str(sel)) == sel
    assert sel.matches(labels) is all(reference_match(r, labels) for r in reqs)
