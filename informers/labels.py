"""Kubernetes label selectors: parse the string form, build from a metav1 ``LabelSelector``, match.

Semantics follow apimachinery ``pkg/labels``:

- ``k=v`` / ``k==v`` / ``k in (v1,v2)``: the label is present and its value is one of the values.
- ``k!=v`` / ``k notin (v1,v2)``: the label is absent, or present with another value.
- ``k``: the label is present; ``!k``: it is absent.
- Requirements are ANDed; an empty selector matches everything.

Keys and values are validated as the API server does (qualified names; values of at most 63
characters). The ``>``/``<`` operators of node selectors are not supported. Note that a *missing*
metav1 selector (``None``) conventionally matches nothing; that is the caller's decision, since
:meth:`LabelSelector.from_dict` takes a mapping.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = ["LabelSelector", "Operator", "Requirement"]


class Operator(enum.StrEnum):
    """A requirement's operator; the value is its wire spelling (``exists`` has none)."""

    EQUALS = "="
    DOUBLE_EQUALS = "=="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"


_SINGLE_VALUE = frozenset({Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.NOT_EQUALS})
_POSITIVE = frozenset({Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.IN})

_NAME_RE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_DNS1123_SUBDOMAIN_RE = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)


def _validate_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix)):
        raise ValueError(
            f"invalid label key {key!r}: the prefix must be a DNS-1123 subdomain "
            "(lowercase alphanumerics, '-' and '.', at most 253 characters)"
        )
    if not name or len(name) > 63 or not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid label key {key!r}: the name must be 1-63 characters of alphanumerics, "
            "'-', '_' or '.', starting and ending with an alphanumeric"
        )


def _validate_value(key: str, value: str) -> None:
    if len(value) > 63 or not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"invalid value {value!r} for label {key!r}: at most 63 characters of alphanumerics, "
            "'-', '_' or '.', starting and ending with an alphanumeric (or empty)"
        )


@dataclass(frozen=True, slots=True)
class Requirement:
    """One term of a selector. Construct through :meth:`create` to get validation."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    @classmethod
    def create(cls, key: str, operator: Operator | str, values: Iterable[str] = ()) -> Requirement:
        """Validate and build; ``values`` are deduplicated and sorted. Raises ``ValueError``."""
        _validate_key(key)
        try:
            op = Operator(operator)
        except ValueError:
            raise ValueError(f"invalid operator {operator!r} for label {key!r}") from None
        vals = tuple(sorted(set(values)))
        if op in _SINGLE_VALUE and len(vals) != 1:
            raise ValueError(f"operator {op.value!r} on label {key!r} needs exactly one value")
        if op in (Operator.IN, Operator.NOT_IN) and not vals:
            raise ValueError(f"operator {op.value!r} on label {key!r} needs at least one value")
        if op in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and vals:
            raise ValueError(f"operator {op.value!r} on label {key!r} takes no values")
        for v in vals:
            _validate_value(key, v)
        return cls(key, op, vals)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this requirement."""
        op = self.operator
        if op is Operator.EXISTS:
            return self.key in labels
        if op is Operator.DOES_NOT_EXIST:
            return self.key not in labels
        value = labels.get(self.key)
        if op in _POSITIVE:
            return value is not None and value in self.values
        return value is None or value not in self.values

    def __str__(self) -> str:
        op = self.operator
        if op is Operator.EXISTS:
            return self.key
        if op is Operator.DOES_NOT_EXIST:
            return f"!{self.key}"
        if op in _SINGLE_VALUE:
            return f"{self.key}{op.value}{self.values[0]}"
        # A lone empty value would print as "()", which parsers reject; "(,)" means {""}.
        values = "," if self.values == ("",) else ",".join(self.values)
        return f"{self.key} {op.value} ({values})"


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """An immutable, hashable set of ANDed requirements, kept sorted by key (canonical form).

    ``str(selector)`` is the wire form for the ``labelSelector`` query parameter; it parses back
    to an equal selector.
    """

    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def everything(cls) -> LabelSelector:
        """The empty selector, which matches every object."""
        return cls(())

    @classmethod
    def of(cls, requirements: Iterable[Requirement]) -> LabelSelector:
        """Build from requirements, sorting them by key (stable)."""
        return cls(tuple(sorted(requirements, key=lambda r: r.key)))

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> LabelSelector:
        """Equality on every pair of ``labels`` (like ``labels.SelectorFromSet``)."""
        return cls.of(Requirement.create(k, Operator.EQUALS, (v,)) for k, v in labels.items())

    @classmethod
    def from_dict(cls, selector: Mapping[str, Any]) -> LabelSelector:
        """Build from a metav1 ``LabelSelector`` (``matchLabels`` and ``matchExpressions``).

        Expression operators are ``In``, ``NotIn``, ``Exists`` and ``DoesNotExist``. An empty
        mapping matches everything. Raises ``ValueError`` naming the bad part.
        """
        reqs: list[Requirement] = []
        match_labels = selector.get("matchLabels") or {}
        if not isinstance(match_labels, Mapping):
            raise ValueError(f"matchLabels must be a mapping, got {type(match_labels).__name__}")
        for k, v in match_labels.items():
            if not isinstance(v, str):
                raise ValueError(f"matchLabels[{k!r}] must be a string, got {v!r}")
            reqs.append(Requirement.create(k, Operator.EQUALS, (v,)))
        expressions = selector.get("matchExpressions") or ()
        for i, expr in enumerate(expressions):
            if not isinstance(expr, Mapping):
                raise ValueError(f"matchExpressions[{i}] must be a mapping, got {expr!r}")
            key = expr.get("key")
            if not isinstance(key, str):
                raise ValueError(f"matchExpressions[{i}].key must be a string, got {key!r}")
            op = _EXPRESSION_OPERATORS.get(str(expr.get("operator")))
            if op is None:
                raise ValueError(
                    f"matchExpressions[{i}].operator {expr.get('operator')!r} is not one of "
                    "In, NotIn, Exists, DoesNotExist"
                )
            values = expr.get("values") or ()
            if isinstance(values, str) or not all(isinstance(v, str) for v in values):
                raise ValueError(f"matchExpressions[{i}].values must be a list of strings")
            try:
                reqs.append(Requirement.create(key, op, values))
            except ValueError as e:
                raise ValueError(f"matchExpressions[{i}]: {e}") from None
        return cls.of(reqs)

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """Parse the string form, e.g. ``"a=b,c!=d,e in (x,y),f notin (z),g,!h"``.

        Whitespace between tokens is ignored; an empty string matches everything. Raises
        ``ValueError`` naming the offending token and its position.
        """
        return cls.of(_Parser(text).parse())

    @property
    def empty(self) -> bool:
        """True when the selector has no requirements (matches everything)."""
        return not self.requirements

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether ``labels`` (``None`` = no labels) satisfy every requirement."""
        if labels is None:
            labels = {}
        return all(r.matches(labels) for r in self.requirements)

    def matches_object(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj``'s ``metadata.labels`` satisfy every requirement."""
        return self.matches((obj.get("metadata") or {}).get("labels"))

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


_EXPRESSION_OPERATORS = {
    "In": Operator.IN,
    "NotIn": Operator.NOT_IN,
    "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST,
}

_TOKEN_RE = re.compile(r"\s*(?:(==|!=|=|!|,|\(|\)|<|>)|([^\s!=,()<>]+))")
_IDENT = "identifier"
_END = "end of string"


class _Parser:
    """Recursive-descent parser over (kind, text, position) tokens."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN_RE.match(text, pos)
            if m is None:  # only trailing whitespace is left
                if text[pos:].strip():
                    self._fail(f"unexpected character {text[pos]!r}", pos)
                break
            sym, ident = m.group(1), m.group(2)
            start = m.start(1) if sym is not None else m.start(2)
            self.tokens.append((_IDENT, ident, start) if sym is None else (sym, sym, start))
            pos = m.end()
        self.tokens.append((_END, "", len(text)))
        self.i = 0

    def _fail(self, detail: str, pos: int) -> NoReturn:
        raise ValueError(f"invalid label selector {self.text!r}: {detail} at position {pos}")

    def _next(self) -> tuple[str, str, int]:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def _peek(self) -> tuple[str, str, int]:
        return self.tokens[self.i]

    def _expect_end_of_requirement(self) -> None:
        kind, lit, pos = self._peek()
        if kind not in (",", _END):
            self._fail(f"found {lit!r}, expected ',' or end of string", pos)

    def parse(self) -> list[Requirement]:
        reqs: list[Requirement] = []
        if self._peek()[0] == _END:
            return reqs
        while True:
            reqs.append(self._requirement())
            kind, lit, pos = self._next()
            if kind == _END:
                return reqs
            if kind != ",":
                self._fail(f"found {lit!r}, expected ',' or end of string", pos)

    def _requirement(self) -> Requirement:
        kind, lit, pos = self._next()
        negated = kind == "!"
        if negated:
            kind, lit, pos = self._next()
        if kind != _IDENT or lit in ("in", "notin"):
            self._fail(f"found {lit or kind!r}, expected a label key", pos)
        key = lit
        if negated:
            self._expect_end_of_requirement()
            return self._create(key, Operator.DOES_NOT_EXIST, (), pos)
        kind, lit, op_pos = self._peek()
        if kind in (",", _END):
            return self._create(key, Operator.EXISTS, (), pos)
        self.i += 1
        if kind in ("=", "==", "!="):
            return self._create(key, Operator(kind), (self._exact_value(),), pos)
        if kind == _IDENT and lit in ("in", "notin"):
            return self._create(key, Operator(lit), self._value_list(), pos)
        if kind in ("<", ">"):
            self._fail(f"operator {lit!r} is not supported", op_pos)
        self._fail(f"found {lit!r}, expected one of =, ==, !=, in, notin", op_pos)

    def _exact_value(self) -> str:
        kind, lit, pos = self._peek()
        if kind in (",", _END):
            return ""
        self.i += 1
        if kind != _IDENT:
            self._fail(f"found {lit!r}, expected a value", pos)
        return lit

    def _value_list(self) -> list[str]:
        kind, lit, pos = self._next()
        if kind != "(":
            self._fail(f"found {lit or kind!r}, expected '('", pos)
        values: list[str] = []
        expect_value = True
        while True:
            kind, lit, pos = self._next()
            if kind == ")":
                if expect_value and values:  # "(a,)" means a and the empty value
                    values.append("")
                return values
            if kind == ",":
                if expect_value:
                    values.append("")
                expect_value = True
            elif kind == _IDENT and expect_value:
                values.append(lit)
                expect_value = False
            else:
                self._fail(f"found {lit or kind!r}, expected a value, ',' or ')'", pos)

    def _create(self, key: str, op: Operator, values: Iterable[str], pos: int) -> Requirement:
        try:
            return Requirement.create(key, op, values)
        except ValueError as e:
            self._fail(str(e), pos)
