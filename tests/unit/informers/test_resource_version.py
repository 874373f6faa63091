"""The resourceVersion comparison helper (KEP-5504 rules)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from informers.resource_version import (
    compare_resource_versions,
    is_at_least,
    is_comparable,
    is_newer,
    sort_key,
)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("1", "2", -1),
        ("2", "1", 1),
        ("123", "123", 0),
        ("9", "10", -1),  # longer is newer, even though "9" > "10" lexically
        ("100", "99", 1),
        ("12345", "12346", -1),
        ("340282366920938463463374607431768211456", "340282366920938463463374607431768211455", 1),
        ("0", "1", None),  # "0" is never a live resourceVersion
        ("0", "0", None),
        ("", "1", None),
        ("", "", None),
        ("01", "1", None),
        ("abc", "abc", None),  # opaque: equality only, and not through this function
        ("1a", "2", None),
        ("-1", "1", None),
        ("+1", "1", None),
        (" 1", "1", None),
        ("1.0", "1", None),
        ("\u00b2", "1", None),  # a non-ASCII digit
        ("\u0661", "1", None),  # ARABIC-INDIC DIGIT ONE
    ],
)
def test_compare(a: str, b: str, expected: int | None) -> None:
    assert compare_resource_versions(a, b) == expected


def test_non_strings_are_not_comparable() -> None:
    assert compare_resource_versions(1, "1") is None  # type: ignore[arg-type]
    assert compare_resource_versions("1", None) is None  # type: ignore[arg-type]
    assert not is_comparable(None)  # type: ignore[arg-type]
    assert sort_key(5) is None  # type: ignore[arg-type]


positive = st.integers(min_value=1, max_value=2**200)


@given(positive, positive)
def test_matches_integer_order(a: int, b: int) -> None:
    assert compare_resource_versions(str(a), str(b)) == (a > b) - (a < b)
    assert is_at_least(str(a), str(b)) is (a >= b)
    assert is_newer(str(a), str(b)) is (a > b)
    ka, kb = sort_key(str(a)), sort_key(str(b))
    assert ka is not None
    assert kb is not None
    assert (ka < kb) is (a < b)
    assert (ka == kb) is (a == b)


@given(st.text(max_size=8), st.text(max_size=8))
def test_antisymmetric_and_none_for_anything_else(a: str, b: str) -> None:
    c = compare_resource_versions(a, b)
    assert compare_resource_versions(b, a) == (None if c is None else -c)
    assert (c is None) is not (is_comparable(a) and is_comparable(b))
    assert (sort_key(a) is None) is not is_comparable(a)


def test_is_at_least() -> None:
    assert is_at_least("10", "9") is True
    assert is_at_least("9", "9") is True
    assert is_at_least("8", "9") is False
    assert is_at_least("abc", "9") is None
    assert is_at_least("9", "0") is None


def test_is_newer_fails_open_but_respects_equality() -> None:
    assert is_newer("10", "9") is True
    assert is_newer("9", "10") is False
    assert is_newer("9", "9") is False
    assert is_newer("abc", "abc") is False  # identical opaque values: nothing new
    assert is_newer("abd", "abc") is True  # cannot order: apply
    assert is_newer("5", "opaque") is True
    assert is_newer("", "5") is True  # unset: cannot order, apply
    assert is_newer("", "") is True
