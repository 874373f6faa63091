"""From a Python type to a structural OpenAPI v3 schema, as a CRD's ``openAPIV3Schema`` needs.

Pure: the same classes give the same schema, key for key and in the same order.

=========================================  ==================================================
Python                                     schema
=========================================  ==================================================
``str``, ``int``, ``float``, ``bool``      ``string``, ``integer``, ``number``, ``boolean``
``datetime``                               ``string`` + ``format: date-time``
``bytes``                                  ``string`` + ``format: byte`` (base64)
``list[T]``, ``tuple[T, ...]``             ``array`` of T
``dict[str, T]``                           ``object`` + ``additionalProperties`` T
``dict[str, Any]``, ``Any``                ``x-kubernetes-preserve-unknown-fields``
``int | str``                              ``x-kubernetes-int-or-string``
``T | None``                               T (optional: ``None`` is left out on the wire)
a :class:`~controller_runtime.resource.Schema`  ``object`` with ``properties`` and ``required``
``Annotated[T, markers...]``               T with the markers applied
=========================================  ==================================================

Refused, with a message saying what to write instead: ``Literal`` (use ``Enum``), other
unions (no structural schema has them), and types with no JSON form.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any

import msgspec

from controller_runtime.resource import Marker, Schema, class_doc, field_docs

__all__ = ["KEY_ORDER", "SchemaError", "object_schema", "type_schema"]


class SchemaError(TypeError):
    """A type that has no structural schema; the message says where and what to use."""


KEY_ORDER = (
    "description",
    "type",
    "format",
    "required",
    "properties",
    "items",
    "additionalProperties",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "enum",
    "default",
    "nullable",
    "x-kubernetes-int-or-string",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
)
"""The order of a schema's keys in generated files (others follow, alphabetically)."""
_RANK = {key: index for index, key in enumerate(KEY_ORDER)}


def _ordered(schema: dict[str, Any]) -> dict[str, Any]:
    return dict(sorted(schema.items(), key=lambda kv: (_RANK.get(kv[0], len(_RANK)), kv[0])))


def type_schema(tp: Any, where: str = "") -> dict[str, Any]:
    """The schema of ``tp`` (markers in ``Annotated`` applied); ``where`` names the field in
    error messages."""
    markers: list[Marker] = []
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            markers.extend(m for m in tp.__metadata__ if isinstance(m, Marker))
            tp = tp.__origin__
            continue
        if origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(members) == 1:
                tp = members[0]
                continue
        break
    schema = _bare_schema(tp, where)
    for marker in markers:
        marker.apply(schema)
    return _ordered(schema)


def _bare_schema(tp: Any, where: str) -> dict[str, Any]:  # noqa: PLR0911, PLR0912 (a case per type)
    origin = typing.get_origin(tp)
    if tp is Any:
        return {"x-kubernetes-preserve-unknown-fields": True}
    if origin is typing.Literal:
        raise SchemaError(
            f"{where}: Literal{list(typing.get_args(tp))} is strict when decoding (a value a "
            "newer CRD adds would fail to decode); write Annotated[str, Enum(...)] instead"
        )
    if origin in (typing.Union, types.UnionType):
        members = set(typing.get_args(tp)) - {type(None)}
        if members == {int, str}:
            return {"x-kubernetes-int-or-string": True}
        raise SchemaError(
            f"{where}: the union {tp} has no structural schema; use one type (or int | str)"
        )
    if origin in (list, tuple, set, frozenset, Sequence):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if len(args) != 1:
            raise SchemaError(f"{where}: {tp}: a list needs one item type")
        return {"type": "array", "items": type_schema(args[0], f"{where}[]")}
    if origin in (dict, Mapping):
        key, value = typing.get_args(tp) or (str, Any)
        if key is not str:
            raise SchemaError(f"{where}: {tp}: map keys must be str")
        if value is Any:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"type": "object", "additionalProperties": type_schema(value, f"{where}{{}}")}
    if isinstance(tp, type):
        if issubclass(tp, Schema):
            return object_schema(tp)
        if issubclass(tp, bool):
            return {"type": "boolean"}
        if issubclass(tp, int):
            return {"type": "integer"}
        if issubclass(tp, float):
            return {"type": "number"}
        if issubclass(tp, str):
            return {"type": "string"}
        if issubclass(tp, datetime):
            return {"type": "string", "format": "date-time"}
        if issubclass(tp, bytes):
            return {"type": "string", "format": "byte"}
        if tp is dict:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        if tp is list:
            raise SchemaError(f"{where}: a bare list needs an item type: list[T]")
    raise SchemaError(f"{where}: {tp!r} has no JSON schema; use a Schema subclass or a JSON type")


def object_schema(
    cls: type[Schema], *, skip: Sequence[str] = (), description: bool = True
) -> dict[str, Any]:
    """The object schema of struct ``cls``: its docstring, required fields, properties (in
    declaration order, wire names) and its ``__markers__``. ``skip`` leaves fields out (by
    Python name)."""
    docs = field_docs(cls)
    schema: dict[str, Any] = {"type": "object"}
    doc = class_doc(cls) if description else ""
    if doc:
        schema["description"] = doc
    required: list[str] = []
    properties: dict[str, Any] = {}
    for info in msgspec.structs.fields(cls):
        if info.name in skip:
            continue
        where = f"{cls.__qualname__}.{info.name}"
        prop = type_schema(info.type, where)
        text = docs.get(info.name)
        if text and "description" not in _explicit_keys(info.type):
            prop["description"] = text
        if info.required:
            required.append(info.encode_name)
        elif "default" not in prop and _schema_default(info.default):
            prop["default"] = info.default
        properties[info.encode_name] = _ordered(prop)
    if required:
        schema["required"] = required
    if properties:
        schema["properties"] = properties
    for marker in cls.__markers__:
        marker.apply(schema)
    return _ordered(schema)


def _explicit_keys(tp: Any) -> set[str]:
    """Schema keys set by markers directly on a field's annotation."""
    probe: dict[str, Any] = {}
    while typing.get_origin(tp) is Annotated:
        for marker in tp.__metadata__:
            if isinstance(marker, Marker):
                marker.apply(probe)
        tp = tp.__origin__
    return set(probe)


def _schema_default(value: Any) -> bool:
    """A Python default the schema states as ``default``: a scalar other than a zero value.
    ``None``, ``""``, ``0`` and ``False`` mean "absent" (they are left out on the wire, as
    Go's zero values are), so they are no default the server should apply."""
    if value is msgspec.NODEFAULT or not isinstance(value, str | int | float | bool):
        return False
    return bool(value)
