"""Hypothesis strategies for objects a CRD version's schema admits, and the check that an
object holds only fields a schema knows: what conversion property tests are built on.

:func:`objects` draws every property the schema declares (each optional one present or
absent), with values in the schema's enums, patterns and bounds, and the defaults the API
server would fill always present (a stored object has them). CEL rules are not evaluated
(conversion does not depend on them). :func:`unknown_fields` lists the paths the API server
would prune from an object under a schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

_CHARS = st.characters(codec="utf-8")
_TEXT = st.text(_CHARS, max_size=12)
_KEYS = st.from_regex(r"[a-z][a-zA-Z0-9./_-]{0,15}", fullmatch=True)


def objects(schema: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    """Values ``schema`` (an openAPIV3Schema node) admits."""
    if "enum" in schema:
        return st.sampled_from(list(schema["enum"]))
    if schema.get("x-kubernetes-int-or-string"):
        return st.one_of(st.integers(0, 1000), _TEXT)
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties")
        if properties:
            required = set(schema.get("required", ())) | {
                k for k, v in properties.items() if "default" in v
            }
            return st.fixed_dictionaries(
                {k: objects(v) for k, v in properties.items() if k in required},
                optional={k: objects(v) for k, v in properties.items() if k not in required},
            )
        if isinstance(schema.get("additionalProperties"), Mapping):
            return st.dictionaries(_KEYS, objects(schema["additionalProperties"]), max_size=3)
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            scalars = st.one_of(_TEXT, st.integers(-5, 5), st.booleans())
            return st.dictionaries(_KEYS, st.one_of(scalars, st.dictionaries(_KEYS, scalars)))
        return st.just({})
    if kind == "array":
        items = objects(schema.get("items", {}))
        keys = schema.get("x-kubernetes-list-map-keys")
        if keys:
            return st.lists(
                items, max_size=3, unique_by=lambda item: tuple(item.get(k) for k in keys)
            )
        return st.lists(items, max_size=3)
    if kind == "string":
        if schema.get("format") == "date-time":
            return st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)).map(
                lambda d: d.replace(microsecond=0, tzinfo=UTC).isoformat().replace("+00:00", "Z")
            )
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", 12)
        return st.text(
            _CHARS,
            min_size=lo,
            max_size=min(hi, lo + 12),
        )
    if kind == "integer":
        return st.integers(schema.get("minimum", -(2**31)), schema.get("maximum", 2**31))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False, width=32)
    if kind == "boolean":
        return st.booleans()
    return st.one_of(_TEXT, st.integers(), st.booleans())


def metadata() -> st.SearchStrategy[dict[str, Any]]:
    """An object's metadata as the API server returns it (annotations and labels may be
    absent)."""
    return st.fixed_dictionaries(
        {
            "name": st.from_regex(r"[a-z]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True),
            "namespace": st.sampled_from(["default", "apps"]),
            "uid": st.uuids().map(str),
            "resourceVersion": st.integers(1, 10**9).map(str),
            "generation": st.integers(1, 100),
        },
        optional={
            "labels": st.dictionaries(_KEYS, _TEXT, max_size=3),
            "annotations": st.dictionaries(_KEYS, _TEXT, max_size=3),
            "finalizers": st.lists(_KEYS, max_size=2, unique=True),
        },
    )


def resources(
    api_version: str, kind: str, schema: Mapping[str, Any]
) -> st.SearchStrategy[dict[str, Any]]:
    """Whole objects of a CRD version: ``apiVersion``, ``kind``, metadata and what the
    version's ``openAPIV3Schema`` declares."""
    body = {
        k: v
        for k, v in schema.get("properties", {}).items()
        if k not in {"apiVersion", "kind", "metadata"}
    }
    return st.tuples(metadata(), objects({**schema, "properties": body})).map(
        lambda parts: {"apiVersion": api_version, "kind": kind, "metadata": parts[0], **parts[1]}
    )


def unknown_fields(schema: Mapping[str, Any], value: Any, path: str = "") -> list[str]:
    """Paths in ``value`` that ``schema`` does not declare (what the API server prunes)."""
    if isinstance(value, Mapping) and schema.get("type") == "object":
        properties = schema.get("properties")
        if properties is None:
            extra = schema.get("additionalProperties")
            if isinstance(extra, Mapping):
                return [
                    p for k, v in value.items() for p in unknown_fields(extra, v, f"{path}.{k}")
                ]
            return []
        out: list[str] = []
        for key, item in value.items():
            if key in properties:
                out += unknown_fields(properties[key], item, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                out.append(f"{path}.{key}")
        return out
    if isinstance(value, list) and schema.get("type") == "array":
        return [
            p
            for i, v in enumerate(value)
            for p in unknown_fields(schema.get("items", {}), v, f"{path}[{i}]")
        ]
    return []
