"""Typed resources: a Python class per kind, with the markers its CRD is generated from.

::

    from typing import Annotated
    from controller_runtime.resource import (
        Enum, Maximum, Minimum, Resource, Rule, Schema, crd, field
    )

    class WidgetSpec(Schema):
        \"\"\"What the widget should be.\"\"\"

        size: Annotated[int, Minimum(1), Maximum(10)]
        \"\"\"How big, 1 to 10.\"\"\"
        color: Annotated[str, Enum("red", "blue")] = "red"

        __markers__ = (Rule("self.size <= 5 || self.color == 'blue'", message="..."),)

    class WidgetStatus(Schema):
        ready: bool = False

    @crd(group="example.com", version="v1", short_names=("wdg",))
    class Widget(Resource):
        \"\"\"A widget.\"\"\"

        spec: WidgetSpec
        status: WidgetStatus = field(default_factory=WidgetStatus)

**The classes** are `msgspec <https://jcristharif.com/msgspec/>`_ structs: :class:`Schema` for
the parts (spec, status and anything nested), :class:`Resource` for a kind, with
:func:`crd` giving its group, version, scope, names, printer columns, selectable fields and
subresources. Field names are snake_case in Python and camelCase on the wire
(``task_state`` ↔ ``taskState``; ``field(name="x-y")`` for anything else). Why msgspec and not
dataclasses or pydantic: ``docs/typed-resources.md`` (measured: the fastest decode of the
three, straight from the cache's bytes, and smaller objects than dicts or pydantic models;
slotted dataclasses are smaller still, but have no place for the fields a class does not
declare, which a read-modify-write must keep).

**Markers** describe what the CRD's schema says beyond the Python type, as kubebuilder's
``+kubebuilder:validation:...`` markers do: put them in ``Annotated[...]`` on a field, or in a
class's ``__markers__`` for the object itself (CEL rules across fields, property counts).
Descriptions come from docstrings: a class's docstring describes its object, the string
literal right under a field describes that field. Required/optional is the Python default:
a field without a default is required; a scalar default (``= "red"``) becomes the schema's
``default``, which the API server applies.

**Markers only describe; decoding never validates them.** The API server enforces the CRD;
a client that re-checked minimums, patterns or enums would only refuse objects a newer CRD
accepts. For the same reason enums are ``Annotated[str, Enum(...)]``, never ``Literal``
(msgspec would reject a value a newer CRD added), and a field typed ``int`` that receives a
string raises :class:`ResourceDecodeError` naming the object and the field.

**Unknown fields survive a read-modify-write.** An object read through the client (or
decoded with :meth:`Resource.from_json` / :meth:`Resource.from_dict`) remembers what it was
decoded from; :meth:`Resource.to_dict` writes back every field the class does not know, at
every level, so an older client never deletes fields a newer CRD added. Known fields are the
class's: a known field set to ``None`` (or its default) is removed. Lists of objects are
matched by their ``ListType("map", keys=...)`` keys when they have them, else by position
(reordering such a list carries unknown fields by position).

Dicts keep working everywhere: every API that takes a class also takes
``api_version, kind`` strings and returns dicts for them.
"""

from __future__ import annotations

import ast
import copy
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar, cast

import msgspec
import orjson

__all__ = [
    "Condition",
    "Conditions",
    "DateTime",
    "Default",
    "Description",
    "EmbeddedResource",
    "Enum",
    "ExclusiveMaximum",
    "ExclusiveMinimum",
    "Format",
    "Int32",
    "Int64",
    "ListType",
    "MaxItems",
    "MaxLength",
    "MaxProperties",
    "Maximum",
    "MinItems",
    "MinLength",
    "MinProperties",
    "Minimum",
    "MultipleOf",
    "Nullable",
    "ObjectMeta",
    "OwnerReference",
    "Pattern",
    "PreserveUnknownFields",
    "PrinterColumn",
    "Resource",
    "ResourceDecodeError",
    "ResourceInfo",
    "Rule",
    "Schema",
    "SchemaPatch",
    "Scope",
    "WebhookConversion",
    "crd",
    "field",
    "guess_plural",
    "is_resource_class",
    "registered",
    "resource_info",
    "set_status_condition",
]

field = msgspec.field
"""``field(default_factory=..., name=...)``: a field's default factory, or its wire name
when camelCase is not it (msgspec's ``field``)."""

Scope = Literal["Namespaced", "Cluster"]
R = TypeVar("R", bound="Resource")


class ResourceDecodeError(ValueError):
    """An object does not fit its class (a field of another type than declared): the class
    and the CRD disagree. The message names the object and the field."""


# ---------------------------------------------------------------------------------- markers


class Marker:
    """Base of every schema marker (see the module docs)."""

    def apply(self, schema: dict[str, Any]) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class _Key(Marker):
    key: str
    value: Any

    def apply(self, schema: dict[str, Any]) -> None:
        schema[self.key] = self.value


def Minimum(value: float) -> Marker:  # noqa: N802 (markers read as kubebuilder's)
    """``minimum``: the smallest number allowed (``+kubebuilder:validation:Minimum``)."""
    return _Key("minimum", value)


def Maximum(value: float) -> Marker:  # noqa: N802
    """``maximum``: the largest number allowed."""
    return _Key("maximum", value)


def ExclusiveMinimum(value: float) -> Marker:  # noqa: N802
    """``minimum`` with ``exclusiveMinimum: true``: numbers above ``value``."""
    return _Exclusive("minimum", "exclusiveMinimum", value)


def ExclusiveMaximum(value: float) -> Marker:  # noqa: N802
    """``maximum`` with ``exclusiveMaximum: true``: numbers below ``value``."""
    return _Exclusive("maximum", "exclusiveMaximum", value)


@dataclass(frozen=True)
class _Exclusive(Marker):
    key: str
    flag: str
    value: float

    def apply(self, schema: dict[str, Any]) -> None:
        schema[self.key] = self.value
        schema[self.flag] = True


def MultipleOf(value: float) -> Marker:  # noqa: N802
    """``multipleOf``."""
    return _Key("multipleOf", value)


def MinLength(value: int) -> Marker:  # noqa: N802
    """``minLength`` of a string."""
    return _Key("minLength", value)


def MaxLength(value: int) -> Marker:  # noqa: N802
    """``maxLength`` of a string (CEL rules need it to estimate their cost)."""
    return _Key("maxLength", value)


def Pattern(regex: str) -> Marker:  # noqa: N802
    """``pattern``: an ECMA-262 regular expression the string must match."""
    return _Key("pattern", regex)


def MinItems(value: int) -> Marker:  # noqa: N802
    """``minItems`` of a list."""
    return _Key("minItems", value)


def MaxItems(value: int) -> Marker:  # noqa: N802
    """``maxItems`` of a list."""
    return _Key("maxItems", value)


def MinProperties(value: int) -> Marker:  # noqa: N802
    """``minProperties`` of an object or map."""
    return _Key("minProperties", value)


def MaxProperties(value: int) -> Marker:  # noqa: N802
    """``maxProperties`` of an object or map."""
    return _Key("maxProperties", value)


def Format(name: str) -> Marker:  # noqa: N802
    """``format`` (``date-time``, ``int64``, ``int32``, ``byte``, ``uri``, ...)."""
    return _Key("format", name)


def Description(text: str) -> Marker:  # noqa: N802
    """A description, instead of the field's docstring."""
    return _Key("description", text)


def Default(value: Any) -> Marker:  # noqa: N802
    """``default`` the API server applies, for values a Python default cannot say (a list,
    a map) or when the Python default should differ from the server's."""
    return _Key("default", value)


def Nullable() -> Marker:  # noqa: N802
    """``nullable: true``: ``null`` is accepted (and kept) instead of pruned."""
    return _Key("nullable", True)


def PreserveUnknownFields() -> Marker:  # noqa: N802
    """``x-kubernetes-preserve-unknown-fields: true``: keep fields the schema does not name."""
    return _Key("x-kubernetes-preserve-unknown-fields", True)


def EmbeddedResource() -> Marker:  # noqa: N802
    """``x-kubernetes-embedded-resource``: the value is a whole object (apiVersion, kind,
    metadata); implies preserving unknown fields."""
    return _Flags(
        {"x-kubernetes-embedded-resource": True, "x-kubernetes-preserve-unknown-fields": True}
    )


@dataclass(frozen=True)
class _Flags(Marker):
    values: Mapping[str, Any]

    def apply(self, schema: dict[str, Any]) -> None:
        schema.update(self.values)


@dataclass(frozen=True, init=False)
class Enum(Marker):
    """``enum``: the values allowed. Use on ``str`` (or ``int``) fields, not with ``Literal``:
    decoding stays lenient, so an older client reads values a newer CRD added."""

    values: tuple[Any, ...]

    def __init__(self, *values: Any) -> None:
        if not values:
            raise ValueError("Enum needs at least one value")
        object.__setattr__(self, "values", values)

    def apply(self, schema: dict[str, Any]) -> None:
        schema["enum"] = list(self.values)


@dataclass(frozen=True)
class ListType(Marker):
    """``x-kubernetes-list-type``: ``"atomic"``, ``"set"`` or ``"map"`` (then ``keys`` are the
    ``x-kubernetes-list-map-keys``, and server-side apply merges items by them)."""

    type: Literal["atomic", "set", "map"]
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.type == "map") != bool(self.keys):
            raise ValueError("ListType('map') needs keys, and only a map list has keys")

    def apply(self, schema: dict[str, Any]) -> None:
        schema["x-kubernetes-list-type"] = self.type
        if self.keys:
            schema["x-kubernetes-list-map-keys"] = list(self.keys)


@dataclass(frozen=True)
class Rule(Marker):
    """A CEL validation rule (``x-kubernetes-validations``), kubebuilder's ``XValidation``.

    ``rule`` sees the value as ``self`` (and ``oldSelf`` on updates: a transition rule);
    ``message`` is what the user reads when it fails; ``field_path`` points at the offending
    field (``.deadline``), ``reason`` is ``FieldValueInvalid`` (default), ``FieldValueRequired``,
    ``FieldValueForbidden`` or ``FieldValueDuplicate``. Rules accumulate: several markers on
    one field or class all apply, in order.
    """

    rule: str
    message: str = ""
    field_path: str = ""
    reason: str = ""
    message_expression: str = ""

    def apply(self, schema: dict[str, Any]) -> None:
        entry: dict[str, Any] = {"rule": self.rule}
        if self.message:
            entry["message"] = self.message
        if self.message_expression:
            entry["messageExpression"] = self.message_expression
        if self.field_path:
            entry["fieldPath"] = self.field_path
        if self.reason:
            entry["reason"] = self.reason
        schema.setdefault("x-kubernetes-validations", []).append(entry)


@dataclass(frozen=True)
class SchemaPatch(Marker):
    """Anything else, merged into the generated schema as given (the escape hatch)."""

    values: Mapping[str, Any]

    def apply(self, schema: dict[str, Any]) -> None:
        schema.update(copy.deepcopy(dict(self.values)))


Int64 = Annotated[int, Format("int64")]
"""An ``int`` the schema calls ``format: int64`` (generations, counts)."""
Int32 = Annotated[int, Format("int32")]
"""An ``int`` the schema calls ``format: int32`` (ports, replicas)."""
DateTime = datetime
"""A timestamp: ``type: string, format: date-time`` on the wire, an aware ``datetime`` in
Python (naive datetimes are sent without an offset, which the API server rejects)."""


# ------------------------------------------------------------------------------ base classes


class _SchemaMeta(msgspec.StructMeta):
    """Makes every subclass keyword-only (msgspec does not inherit ``kw_only``): objects are
    always built with keywords, and fields may come in any order at run time. (mypy follows
    dataclass rules here: in a class that puts a required field after one with a default,
    write ``kw_only=True`` in the class line, as :class:`Condition` does.)"""

    def __new__(
        mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **options: Any
    ) -> _SchemaMeta:
        options.setdefault("kw_only", True)
        return super().__new__(mcls, name, bases, namespace, **options)


class Schema(
    msgspec.Struct, metaclass=_SchemaMeta, kw_only=True, omit_defaults=True, rename="camel"
):
    """Base of a resource's parts (spec, status, anything nested): a msgspec struct,
    keyword-only, camelCase on the wire, with defaults left out when encoding."""

    __markers__: ClassVar[tuple[Marker, ...]] = ()
    """Markers of the object itself (e.g. a CEL :class:`Rule` relating two fields)."""


class OwnerReference(Schema):
    """``metav1.OwnerReference``."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(Schema):
    """``metav1.ObjectMeta``: the fields controllers read and write. Anything else the server
    sends (``managedFields``, ...) is kept as an unknown field."""

    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    deletion_grace_period_seconds: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    finalizers: list[str] = field(default_factory=list)
    owner_references: list[OwnerReference] = field(default_factory=list)


class Condition(Schema, kw_only=True):
    """One status condition, as metav1.Condition."""

    type: str
    """The aspect the condition describes, e.g. Ready (one entry per type)."""
    status: Annotated[str, Enum("True", "False", "Unknown")]
    """True, False or Unknown."""
    observed_generation: Int64 | None = None
    """The metadata.generation the condition was computed from."""
    last_transition_time: datetime
    """When status last changed (a new reason or message keeps it)."""
    reason: str = ""
    """Why, as one CamelCase word (e.g. AllReplicasReady)."""
    message: str = ""
    """Why, in words for people."""


Conditions = Annotated[list[Condition], ListType("map", keys=("type",))]
"""``status.conditions``: one :class:`Condition` per type (a map list keyed by ``type``, as
``metav1.Condition`` lists are). Give it ``field(default_factory=list)``."""


@dataclass(frozen=True)
class PrinterColumn:
    """A column of ``kubectl get`` (``additionalPrinterColumns``)."""

    name: str
    json_path: str
    type: Literal["integer", "number", "string", "boolean", "date"] = "string"
    format: str = ""
    description: str = ""
    priority: int = 0


@dataclass(frozen=True)
class WebhookConversion:
    """Convert between a kind's versions through a webhook (the CRD's ``spec.conversion``
    with ``strategy: Webhook``), reached through a Service in the cluster.

    The API server calls ``https://<service_name>.<service_namespace>.svc:<port><path>``
    with a ``ConversionReview`` whenever a client asks for a version other than the one an
    object is stored in. Without it (the default) the strategy is ``None``: the API server
    only rewrites ``apiVersion``, which is right only when the versions' schemas are the
    same. Defaults: ``path`` ``/convert`` (controller-runtime's), ``port`` 443, reviews in
    ``v1``. The CRD carries no ``caBundle``: whoever issues the serving certificate injects
    it (cert-manager's cainjector, or the webhook server's self-managed certificates)."""

    service_name: str
    service_namespace: str
    path: str = "/convert"
    port: int = 443
    review_versions: tuple[str, ...] = ("v1",)


@dataclass(frozen=True)
class ResourceInfo:
    """What :func:`crd` says about a resource class."""

    group: str
    version: str
    kind: str
    plural: str
    singular: str
    list_kind: str
    scope: Scope
    short_names: tuple[str, ...]
    categories: tuple[str, ...]
    printer_columns: tuple[PrinterColumn, ...]
    selectable_fields: tuple[str, ...]
    status_subresource: bool
    scale: tuple[str, str, str] | None
    served: bool
    storage: bool
    deprecated: bool
    deprecation_warning: str
    header: str
    conversion: WebhookConversion | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"


class Resource(Schema, dict=True, kw_only=True):
    """Base of a kind's class: ``metadata`` (:class:`ObjectMeta`) plus the fields the
    subclass declares (usually ``spec`` and ``status``). Decorate the subclass with
    :func:`crd`. ``api_version`` and ``kind`` are class attributes, written first by
    :meth:`to_dict`."""

    api_version: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    __resource__: ClassVar[ResourceInfo | None] = None

    metadata: ObjectMeta = field(default_factory=ObjectMeta)

    # -- decoding --------------------------------------------------------------------------

    @classmethod
    def from_json(cls, raw: bytes | str) -> Self:
        """Decode the API's JSON; the object remembers ``raw`` (see :meth:`to_dict`)."""
        decoder = _DECODERS.get(cls)
        if decoder is None:
            decoder = _DECODERS[cls] = msgspec.json.Decoder(cls)
        try:
            obj: Self = decoder.decode(raw)
        except msgspec.ValidationError as err:
            raise _decode_error(cls, raw, err) from None
        obj.__dict__["_source"] = raw
        return obj

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Decode a dict as the API returns it; the object remembers a copy of ``data``."""
        try:
            obj = msgspec.convert(data, type=cls, from_attributes=False)
        except msgspec.ValidationError as err:
            raise _decode_error(cls, data, err) from None
        obj.__dict__["_source"] = orjson.dumps(data)
        return obj

    # -- encoding --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The object as the API takes it: ``apiVersion`` and ``kind`` first, the fields the
        class knows from this object, and every field it does not know from what the object
        was decoded from."""
        known = cast(dict[str, Any], msgspec.to_builtins(self))
        source = self.__dict__.get("_source")
        if source is not None:
            known = _merge_unknown(type(self), known, orjson.loads(source))
        head = {"apiVersion": type(self).api_version, "kind": type(self).kind}
        head.update((k, v) for k, v in known.items() if k not in head)
        return head

    def to_json(self) -> bytes:
        """:meth:`to_dict`, encoded."""
        return orjson.dumps(self.to_dict())

    def __copy__(self) -> Self:
        clone = msgspec.structs.replace(self)
        clone.__dict__.update(self.__dict__)
        return clone

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        clone = msgspec.json.decode(msgspec.json.encode(self), type=type(self))
        clone.__dict__.update(self.__dict__)  # the source is immutable bytes: shared
        return clone

    @property
    def namespace(self) -> str | None:
        """``metadata.namespace``, ``None`` when empty (cluster-scoped)."""
        return self.metadata.namespace or None

    @property
    def name(self) -> str:
        """``metadata.name``."""
        return self.metadata.name


_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {}
"""A decoder per class (cheaper per call than ``msgspec.json.decode(..., type=cls)``)."""


def _decode_error(cls: type, data: object, err: msgspec.ValidationError) -> ResourceDecodeError:
    meta: Any = {}
    try:
        decoded = orjson.loads(data) if isinstance(data, bytes | str) else data
        meta = (decoded.get("metadata") or {}) if isinstance(decoded, Mapping) else {}
    except orjson.JSONDecodeError:
        pass
    where = "/".join(p for p in (meta.get("namespace"), meta.get("name")) if p) or "an object"
    return ResourceDecodeError(
        f"{getattr(cls, 'kind', '') or cls.__name__} {where} does not fit class "
        f"{cls.__qualname__}: {err}; the class and the CRD (or the object) disagree"
    )


# -------------------------------------------------------------------------- unknown fields


def _merge_unknown(tp: Any, new: Any, old: Any) -> Any:
    """``new`` (the typed object's fields) with every key of ``old`` that type ``tp`` does
    not know added back, recursively. Pure; hypothesis-tested."""
    tp, markers = _unwrap(tp)
    if isinstance(new, dict) and isinstance(old, dict) and _is_struct(tp):
        fields = _wire_fields(tp)
        defaults = _wire_defaults(tp)
        merged = dict(new)
        for key, value in old.items():
            if key in fields:
                if key in new:
                    merged[key] = _merge_unknown(fields[key], new[key], value)
                elif key in defaults and value == defaults[key]:
                    # Left out because it holds its default, which is what was read: write
                    # it as it was read (msgspec leaves a default out only when it is the
                    # very default object, so this keeps writes independent of identity).
                    merged[key] = value
            elif key not in ("apiVersion", "kind"):
                merged[key] = value
        return merged
    if isinstance(new, list) and isinstance(old, list):
        item = _item_type(tp)
        if item is None or not _is_struct(_unwrap(item)[0]):
            return new
        keys = next((m.keys for m in markers if isinstance(m, ListType) and m.keys), ())
        if keys:
            by_key = {_map_key(o, keys): o for o in old if isinstance(o, dict)}
            return [_merge_unknown(item, n, by_key.get(_map_key(n, keys))) for n in new]
        return [
            _merge_unknown(item, n, old[i] if i < len(old) else None) for i, n in enumerate(new)
        ]
    if isinstance(new, dict) and isinstance(old, dict):
        value_type = _value_type(tp)
        if value_type is not None and _is_struct(_unwrap(value_type)[0]):
            return {k: _merge_unknown(value_type, v, old.get(k)) for k, v in new.items()}
    return new


def _map_key(obj: Any, keys: Sequence[str]) -> tuple[Any, ...] | None:
    if not isinstance(obj, dict):
        return None
    return tuple(orjson.dumps(obj.get(k)) for k in keys)


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _unwrap(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    """``tp`` without ``Annotated`` and ``| None``, and the markers found on the way."""
    markers: list[Any] = []
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            markers.extend(tp.__metadata__)
            tp = tp.__origin__
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(members) != 1:
                return tp, tuple(markers)
            tp = members[0]
        else:
            return tp, tuple(markers)


def _item_type(tp: Any) -> Any | None:
    if typing.get_origin(tp) in (list, tuple, set, frozenset, Sequence, Iterable):
        args = typing.get_args(tp)
        return args[0] if args else None
    return None


def _value_type(tp: Any) -> Any | None:
    if typing.get_origin(tp) in (dict, Mapping):
        args = typing.get_args(tp)
        return args[1] if len(args) == 2 else None
    return None


_WIRE_FIELDS: dict[type, dict[str, Any]] = {}
_WIRE_DEFAULTS: dict[type, dict[str, Any]] = {}


def _wire_defaults(cls: type) -> dict[str, Any]:
    """Wire name → the encoded default of every field of struct ``cls`` that has one."""
    defaults = _WIRE_DEFAULTS.get(cls)
    if defaults is None:
        defaults = {}
        for info in msgspec.structs.fields(cls):
            if info.default is not msgspec.NODEFAULT:
                defaults[info.encode_name] = msgspec.to_builtins(info.default)
            elif info.default_factory is not msgspec.NODEFAULT:
                defaults[info.encode_name] = msgspec.to_builtins(info.default_factory())
        _WIRE_DEFAULTS[cls] = defaults
    return defaults


def _wire_fields(cls: type) -> dict[str, Any]:
    """Wire name → annotated type of every field of struct ``cls`` (cached)."""
    fields = _WIRE_FIELDS.get(cls)
    if fields is None:
        fields = {f.encode_name: f.type for f in msgspec.structs.fields(cls)}
        _WIRE_FIELDS[cls] = fields
    return fields


# --------------------------------------------------------------------------- declaring kinds

_REGISTRY: dict[tuple[str, str], type[Resource]] = {}


def guess_plural(kind: str) -> str:
    """The resource name the API server would make of ``kind``: lowercased, ``s`` added
    (``es`` after s, x, ch, sh; ``ies`` for a consonant and y). Irregular plurals need
    ``crd(plural=...)``."""
    lower = kind.lower()
    if lower.endswith(("s", "x", "z", "ch", "sh")):
        return f"{lower}es"
    if lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        return f"{lower[:-1]}ies"
    return f"{lower}s"


def crd(
    *,
    group: str,
    version: str,
    kind: str | None = None,
    plural: str | None = None,
    singular: str | None = None,
    scope: Scope = "Namespaced",
    short_names: Sequence[str] = (),
    categories: Sequence[str] = (),
    printer_columns: Sequence[PrinterColumn] = (),
    selectable_fields: Sequence[str] = (),
    status_subresource: bool | None = None,
    scale: tuple[str, str, str] | None = None,
    served: bool = True,
    storage: bool = True,
    deprecated: bool = False,
    deprecation_warning: str = "",
    header: str = "",
    conversion: WebhookConversion | None = None,
) -> Callable[[type[R]], type[R]]:
    """Declare a :class:`Resource` subclass as a kind of a CRD (kubebuilder's
    ``+kubebuilder:resource``, ``+kubebuilder:subresource``, ``+kubebuilder:printcolumn``,
    ``+kubebuilder:selectablefield`` and ``+kubebuilder:storageversion`` markers).

    Defaults: ``kind`` the class name; ``plural`` :func:`guess_plural` of it, ``singular`` it
    lowercased; ``status_subresource`` on when the class has a ``status`` field; ``scale``
    off (else ``(spec replicas path, status replicas path, label selector path)``). Several
    classes of one group and kind with different versions make one CRD with every version;
    exactly one of them has ``storage=True``. ``header`` is a comment for the top of the
    generated file (default: none). ``conversion`` (a :class:`WebhookConversion`, declared
    on any of the kind's versions, the same on each that declares it) makes the CRD convert
    through a webhook; default none (``strategy: None``, for versions whose schemas are the
    same).
    """

    def declare(cls: type[R]) -> type[R]:
        if not (isinstance(cls, type) and issubclass(cls, Resource)):
            raise TypeError(f"@crd decorates a Resource subclass, not {cls!r}")
        name = kind or cls.__name__
        fields = {f.name for f in msgspec.structs.fields(cls)}
        info = ResourceInfo(
            group=group,
            version=version,
            kind=name,
            plural=plural or guess_plural(name),
            singular=singular or name.lower(),
            list_kind=f"{name}List",
            scope=scope,
            short_names=tuple(short_names),
            categories=tuple(categories),
            printer_columns=tuple(printer_columns),
            selectable_fields=tuple(selectable_fields),
            status_subresource=(
                "status" in fields if status_subresource is None else status_subresource
            ),
            scale=scale,
            served=served,
            storage=storage,
            deprecated=deprecated,
            deprecation_warning=deprecation_warning,
            header=header,
            conversion=conversion,
        )
        cls.__resource__ = info
        cls.api_version = info.api_version
        cls.kind = name
        _REGISTRY[(info.api_version, name)] = cls
        return cls

    return declare


def is_resource_class(value: object) -> bool:
    """Whether ``value`` is a :class:`Resource` subclass declared with :func:`crd`."""
    return (
        isinstance(value, type) and issubclass(value, Resource) and value.__resource__ is not None
    )


def resource_info(cls: type[Resource]) -> ResourceInfo:
    """What :func:`crd` declared for ``cls``; ``TypeError`` if it was not decorated."""
    info = cls.__dict__.get("__resource__")
    if not isinstance(info, ResourceInfo):
        raise TypeError(f"{cls.__qualname__} is not declared with @crd(group=..., version=...)")
    return info


def registered(api_version: str, kind: str) -> type[Resource] | None:
    """The class declared for ``api_version``/``kind`` in this process, if any."""
    return _REGISTRY.get((api_version, kind))


# ------------------------------------------------------------------------------ docstrings

_DOCS: dict[type, dict[str, str]] = {}


def field_docs(cls: type) -> dict[str, str]:
    """Python field name → the string literal under it in ``cls``'s source (its docstring),
    for ``cls`` and its bases. Empty when the source is not available."""
    cached = _DOCS.get(cls)
    if cached is not None:
        return cached
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass in (object, msgspec.Struct):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        tree = ast.parse(source)
        body = next((n.body for n in tree.body if isinstance(n, ast.ClassDef)), [])
        for node, following in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[node.target.id] = flowed(following.value.value)
    _DOCS[cls] = docs
    return docs


def class_doc(cls: type) -> str:
    """``cls``'s own docstring (not inherited), :func:`flowed`."""
    doc = cls.__dict__.get("__doc__")
    return flowed(doc) if isinstance(doc, str) else ""


def flowed(docstring: str) -> str:
    """A docstring as a description: indentation removed, the lines of each paragraph joined
    with spaces (so sources wrap at any width and the CRD gets one line per paragraph),
    paragraphs separated by a blank line."""
    paragraphs = inspect.cleandoc(docstring).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


# ------------------------------------------------------------------- classes in the client


def split_target(
    target: object, kind: object, key: object, *, method: str
) -> tuple[type[Resource] | None, str, str, Any]:
    """The arguments of a keyed call, in either form: ``(api_version, kind, key)`` strings,
    or ``(cls, key)`` with a :func:`crd` class in the place of both strings. Returns
    ``(cls or None, api_version, kind, key)``; ``TypeError`` saying what to pass otherwise."""
    if isinstance(target, str):
        if not isinstance(kind, str):
            raise TypeError(
                f"{method}: after the api_version {target!r} comes the kind as a string, "
                f"not {kind!r} (or pass a resource class instead of both)"
            )
        return None, target, kind, key
    if is_resource_class(target):
        cls = cast(type[Resource], target)
        if key is not None:
            raise TypeError(
                f"{method}({cls.__name__}, ...): the class stands for api_version and kind; "
                "pass the key once (a Request, or name=/namespace=)"
            )
        return cls, cls.api_version, cls.kind, kind
    raise TypeError(
        f"{method} takes api_version and kind strings, or a resource class declared with "
        f"@crd, not {target!r}"
    )


def as_body(obj: object) -> tuple[Mapping[str, Any], type[Resource] | None]:
    """A write's body as a dict, and the class to decode the answer into (``None`` for a
    dict: the answer stays a dict)."""
    if isinstance(obj, Resource):
        if type(obj).__resource__ is None:
            raise TypeError(f"{type(obj).__qualname__} is not declared with @crd")
        return obj.to_dict(), type(obj)
    if isinstance(obj, Mapping):
        return obj, None
    raise TypeError(f"expected an object (a dict or a typed resource), not {type(obj).__name__}")


def adopt(cls: type[R], data: dict[str, Any]) -> R:
    """``cls.from_dict(data)`` for a dict nobody else holds (the answer of a request, a fresh
    read of the cache): the source is kept encoded, without copying the dict first."""
    try:
        obj = msgspec.convert(data, type=cls)
    except msgspec.ValidationError as err:
        raise _decode_error(cls, data, err) from None
    obj.__dict__["_source"] = orjson.dumps(data)
    return obj


def set_status_condition(
    conditions: list[Condition],
    condition_type: str,
    status: bool | str,
    *,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> bool:
    """Set the condition of ``condition_type`` in a typed ``Conditions`` list, in place; return
    whether anything changed (apimachinery's ``meta.SetStatusCondition``).

    The same rules as :func:`controller_runtime.util.set_condition`: ``lastTransitionTime``
    moves to ``now`` (default: the current time) only for a new condition or a new status;
    a bad status or reason raises ``ValueError``.
    """
    from controller_runtime.util.conditions import set_condition  # noqa: PLC0415 (cycle)

    as_dicts = [cast(dict[str, Any], msgspec.to_builtins(c)) for c in conditions]
    set_condition(
        as_dicts,
        condition_type,
        cast(Any, status),
        reason=reason,
        message=message,
        observed_generation=observed_generation,
        now=now,
    )
    updated = [msgspec.convert(d, Condition) for d in as_dicts]
    if updated == conditions:
        return False
    conditions[:] = updated
    return True
