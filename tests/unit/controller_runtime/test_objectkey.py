"""The two ways of naming an object (a Request, or name=/namespace= keywords) and the refusal
of everything else, in particular the (name, namespace) tuple that used to be swapped."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller_runtime.objectkey import resolve_key
from controller_runtime.reconcile import Request

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)


@given(namespace=names | st.just(""), name=names)
def test_a_request_and_the_keywords_name_the_same_object(namespace: str, name: str) -> None:
    by_request = resolve_key(Request(namespace, name), None, None, method="get")
    by_keywords = resolve_key(None, name, namespace or None, method="get")
    assert by_request == by_keywords == (namespace or None, name)


@given(namespace=names, name=names)
def test_a_plain_tuple_is_refused_whatever_its_order(namespace: str, name: str) -> None:
    for key in ((name, namespace), (namespace, name), name):
        with pytest.raises(TypeError, match=re.escape('name="..."')):
            resolve_key(key, None, None, method="client.get")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "name", "namespace", "message"),
    [
        (Request("ns", "a"), "a", None, "not both"),
        (Request("ns", "a"), None, "ns", "not both"),
        (None, None, "ns", "needs the object's name"),
        (None, "", None, "needs the object's name"),
        (None, "a", 3, "namespace= must be a string"),
    ],
)
def test_ambiguous_or_missing_keys_are_refused(
    key: Request | None, name: Any, namespace: Any, message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        resolve_key(key, name, namespace, method="client.get")
