"""The partial decoder of watch lines: what it returns is exactly the object minus managedFields.

``decode_watch_line`` either refuses a line (``None``: the reflector decodes it whole, as it
always did) or returns bytes that decode to the line's object without
``metadata.managedFields`` and that object's metadata. These tests attack that guarantee with
objects of any shape, managedFields anywhere in the metadata (first, middle, last, alone, null,
absent), any JSON formatting, and lines built to fool a byte search: a second
``"managedFields"`` elsewhere with the very same value, an escaped key, duplicate keys, members
after the object, broken UTF-8, and random corruption.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from informers._partial import cut_managed_fields, decode_watch_line
from informers.store import Store

# -- generated objects --------------------------------------------------------------------------

_TEXT = st.characters(codec="utf-8")  # any code point but surrogates, which UTF-8 cannot carry
_KEYS = st.text(_TEXT, max_size=12)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
    | st.text(_TEXT, max_size=20)
    # The bytes the cut looks for, as values and as keys.
    | st.just("managedFields")
    | st.just('"managedFields":')
)
JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(_KEYS | st.just("managedFields"), inner, max_size=4)
    ),
    max_leaves=12,
)
MANAGED: st.SearchStrategy[Any] = st.lists(
    st.fixed_dictionaries(
        {"manager": st.text(max_size=8), "fieldsV1": JSON},
        optional={"operation": st.sampled_from(["Update", "Apply"])},
    ),
    max_size=3,
) | st.sampled_from([None, [], {}, "odd"])
NAMES = st.text("abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=12)


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    """A Kubernetes-like object, managedFields (or none) at any position of its metadata."""
    meta: dict[str, Any] = {
        "name": draw(NAMES),
        "resourceVersion": str(draw(st.integers(1, 10**12))),
        "uid": draw(st.uuids()).hex,
    }
    if draw(st.booleans()):
        meta["namespace"] = draw(NAMES)
    if draw(st.booleans()):
        meta["labels"] = draw(st.dictionaries(NAMES, NAMES, max_size=3))
    if draw(st.booleans()):
        meta["ownerReferences"] = [
            {"kind": "Owner", "name": draw(NAMES), "uid": draw(st.uuids()).hex}
            for _ in range(draw(st.integers(0, 2)))
        ]
    extra = draw(st.dictionaries(_KEYS.filter(lambda k: k not in meta), JSON, max_size=3))
    meta.update(extra)
    if draw(st.booleans()):
        items = list(meta.items())
        at = draw(st.integers(0, len(items)))
        items.insert(at, ("managedFields", draw(MANAGED)))
        meta = dict(items)
    obj: dict[str, Any] = {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": meta}
    obj.update(draw(st.dictionaries(_KEYS.filter(lambda k: k not in obj), JSON, max_size=3)))
    return obj


def stripped(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].pop("managedFields", None)
    return out


def compact(event_type: str, obj: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": event_type, "object": obj})


def check(line: bytes, *, cut: bool = True) -> bool:
    """The guarantee for any line; whether the line was taken."""
    got = decode_watch_line(line, cut)
    if got is None:
        return False
    event_type, meta, raw = got
    event = orjson.loads(line)  # anything taken is something orjson takes
    obj = stripped(event["object"]) if cut else event["object"]
    assert event_type == event["type"]
    assert orjson.loads(raw) == obj
    assert list(orjson.loads(raw)) == list(obj)  # members in their order
    assert list(orjson.loads(raw)["metadata"]) == list(obj["metadata"])
    m = event["object"]["metadata"]
    assert (meta.name, meta.namespace, meta.resourceVersion, meta.uid) == (
        m["name"],
        m.get("namespace", ""),
        m["resourceVersion"],
        m.get("uid", ""),
    )
    # A reference without a uid (a corrupted key) reads as None, as the store's orjson path
    # (``ref.get("uid")``) reads it.
    assert [r.uid for r in meta.ownerReferences or ()] == [
        r.get("uid") for r in m.get("ownerReferences") or ()
    ]
    labels = orjson.loads(memoryview(meta.labels)) if len(meta.labels) else None
    assert labels == m.get("labels")
    return True


# -- the guarantee --------------------------------------------------------------------------------


@given(obj=objects(), event_type=st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
def test_compact_lines_are_taken_and_decode_to_the_object_minus_managed_fields(
    obj: dict[str, Any], event_type: str
) -> None:
    line = compact(event_type, obj)
    taken = check(line)
    # What an API server sends (compact, one "managedFields" key in the whole line) is taken:
    # the fast path is the path, not an accident of the examples.
    if line.count(b'"managedFields"') <= 1:
        assert taken
    assert check(line, cut=False) or line.count(b'"managedFields"') > 1 or not taken


@given(
    obj=objects(),
    separators=st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : "), (",\t", ":\r\n")]),
    indent=st.sampled_from([None, 0, 2]),
    ensure_ascii=st.booleans(),
)
def test_any_formatting_is_taken_correctly_or_refused(
    obj: dict[str, Any], separators: tuple[str, str], indent: int | None, ensure_ascii: bool
) -> None:
    body = json.dumps(obj, separators=separators, indent=indent, ensure_ascii=ensure_ascii)
    check(b'{"type":"MODIFIED","object":' + body.encode() + b"}")


@given(obj=objects(), data=st.data())
def test_a_decoy_with_the_same_value_anywhere_is_never_cut_instead(
    obj: dict[str, Any], data: st.DataObject
) -> None:
    """Another member ``"managedFields": <the same value>`` before the metadata's own (in a
    field before metadata, or inside metadata), or an escaped metadata key: never the wrong cut."""
    managed = data.draw(MANAGED)
    obj["metadata"]["managedFields"] = managed
    decoy = {"managedFields": copy.deepcopy(managed)}
    place = data.draw(st.sampled_from(["before-metadata", "annotation-object", "escaped-key"]))
    if place == "before-metadata":
        obj = {"aaa": decoy, **obj}
    elif place == "annotation-object":
        obj["metadata"] = {"aaa": decoy, **obj["metadata"]}
    line = compact("ADDED", obj)
    if place == "escaped-key":
        line = line.replace(b'"managedFields"', b'"managed\\u0046ields"', 1)
        line = line.replace(b'"kind":"Thing"', b'"kind":"Thing","zzz":' + orjson.dumps(decoy), 1)
    check(line)


@pytest.mark.parametrize(
    "line",
    [
        # duplicate keys in metadata: the first is not the one that counts
        b'{"type":"ADDED","object":{"metadata":{"managedFields":[1],"name":"a",'
        b'"resourceVersion":"5","managedFields":[1]}}}',
        # the object twice: the last one is the event's object
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}},'
        b'"object":{"metadata":{"name":"b","resourceVersion":"6"}}}',
        # a member after the object
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}},"type":"ADDED"}',
        # the type twice
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}},'
        b'"type":"DELETED"}',
        # metadata twice, managedFields in the first only
        b'{"type":"ADDED","object":{"metadata":{"managedFields":[],"name":"x",'
        b'"resourceVersion":"1"},"metadata":{"name":"a","resourceVersion":"5"}}}',
        # metadata twice, managedFields in the second only
        b'{"type":"ADDED","object":{"metadata":{"name":"x","resourceVersion":"1"},'
        b'"metadata":{"managedFields":[],"name":"a","resourceVersion":"5"}}}',
    ],
)
def test_duplicate_keys_never_yield_other_bytes_than_orjson_reads(line: bytes) -> None:
    check(line)


def test_the_cut_where_managed_fields_stands() -> None:
    for meta, want in [
        (b'{"managedFields":[1],"name":"a"}', b'{"name":"a"}'),  # first
        (b'{"name":"a","managedFields":[1],"uid":"u"}', b'{"name":"a","uid":"u"}'),  # middle
        (b'{"name":"a","managedFields":[1]}', b'{"name":"a"}'),  # last
        (b'{"managedFields":[1]}', b"{}"),  # alone
        (b'{ "managedFields" : [1] , "name":"a"}', b'{  "name":"a"}'),
        (b'{"name":"a" ,\n"managedFields"\t:\r[1]\n}', b'{"name":"a" \n}'),
        (b'{"managedFields" :[1] }', b"{ }"),
    ]:
        assert cut_managed_fields(meta, 0, len(meta), _raw(b"[1]")) == want
        expected = orjson.loads(meta)
        del expected["managedFields"]
        assert orjson.loads(want) == expected
    # not followed by that value: refused, never guessed
    assert cut_managed_fields(b'{"managedFields":[2]}', 0, 21, _raw(b"[1]")) is None
    assert cut_managed_fields(b'{"managedFields" "x"}', 0, 21, _raw(b"[1]")) is None
    assert cut_managed_fields(b'{"name":"a"}', 0, 12, _raw(b"[1]")) is None


def _raw(data: bytes) -> Any:
    import msgspec  # noqa: PLC0415

    return msgspec.Raw(data)


# -- what is refused ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b'{"type":"BOOKMARK","object":{"metadata":{"name":"a","resourceVersion":"5"}}}',
        b'{"type":"ERROR","object":{"code":410}}',
        b'{"type":"ADDED","object":{"metadata":{"resourceVersion":"5"}}}',  # no name
        b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}',  # no resourceVersion
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":5}}}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5","uid":7}}}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5",'
        b'"ownerReferences":[{"uid":1}]}}}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5",'
        b'"namespace":null}}}',
        b'{"type":"ADDED","object":{"metadata":null}}',
        b'{"type":"ADDED","object":[]}',
        b'{"type": "ADDED", "object": {"metadata":{"name":"a","resourceVersion":"5"}}}',
        b'{"object":{"metadata":{"name":"a","resourceVersion":"5"}},"type":"ADDED"}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}}} ',
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"},"x":"\xff"}}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"},"x":"\xed\xa0\x80"}}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"},"x":"\\ud800"}}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"},"x":NaN}}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"},"x":01}}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"},"x":'
        + b"[" * 1100
        + b"]" * 1100
        + b"}}",
        b"",
        b"null",
        b"not json",
    ],
)
def test_refused_lines_take_the_full_path(line: bytes) -> None:
    assert decode_watch_line(line) is None


def test_valid_utf8_beyond_ascii_is_taken() -> None:
    obj = {"metadata": {"name": "a", "resourceVersion": "5"}, "data": {"x": "Grüße, 日本 🎉"}}
    assert check(compact("ADDED", obj))


def test_an_owner_reference_without_a_uid_is_read_as_none() -> None:
    """A reference whose ``uid`` key is missing (a corrupted byte turned it into another key)
    is taken, its uid None, as the store's orjson path reads it (``ref.get("uid")``)."""
    refs = [{"kind": "Owner", "name": "o", "uad": "f728b4fa"}, {"kind": "Owner", "uid": "u-2"}]
    obj = {"metadata": {"name": "a", "resourceVersion": "1", "ownerReferences": refs}}
    assert check(compact("MODIFIED", obj))
    got = decode_watch_line(compact("MODIFIED", obj))
    assert got is not None
    assert [r.uid for r in got[1].ownerReferences or ()] == [None, "u-2"]


@given(obj=objects(), data=st.data())
@example(obj={"metadata": {"name": "a", "resourceVersion": "1"}}, data=None)
def test_a_corrupted_line_is_refused_or_read_as_orjson_reads_it(
    obj: dict[str, Any], data: st.DataObject | None
) -> None:
    """Whatever bytes are changed, inserted or removed: nothing orjson refuses is taken (but for
    a number beyond the double range, the documented caveat), and what is taken is right."""
    line = bytearray(compact("MODIFIED", obj))
    if data is not None:
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, len(line) - 1))
            what = data.draw(st.sampled_from(["replace", "insert", "delete"]))
            byte = data.draw(st.sampled_from(list(b'{}[],:"\\ \xff\xc3\x80\x00a0e-+.')))
            if what == "replace":
                line[at] = byte
            elif what == "insert":
                line.insert(at, byte)
            else:
                del line[at]
    taken = decode_watch_line(bytes(line))
    try:
        orjson.loads(bytes(line))
    except orjson.JSONDecodeError as err:
        assume("infinity" not in str(err))  # the caveat: numbers beyond the double range
        assert taken is None, f"taken, but orjson refuses it: {err}"
        return
    check(bytes(line))


def test_caveat_a_number_beyond_the_double_range_is_taken_and_fails_when_read() -> None:
    line = b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"},"x":1e400}}'
    taken = decode_watch_line(line)
    assert taken is not None
    store = Store()
    store.apply_raw(*taken)
    with pytest.raises(orjson.JSONDecodeError, match="infinity"):
        store.get("a")
