"""Predicates: which informer changes are worth a reconcile.

A predicate is either a :class:`Predicate` (one check per event type: ``create``, ``update``,
``delete``, ``generic``; each takes the :class:`~informers.store.StoreDelta` and returns
``True`` to let the event through) or a plain function of the delta, applied to every event
type. Combine them with :func:`and_`, :func:`or_`, :func:`not_`, or the operators ``&``, ``|``
and ``~`` on :class:`Predicate` objects::

    (GenerationChanged() | LabelsChanged()) & LabelSelectorPredicate("app=web")

Predicates run inline in the informer's dispatch, before anything is queued, so they must be
fast and must not block. They see the delta the informer hands to every handler: treat
``delta.obj`` and ``delta.old`` as read-only. ``delta.old`` (the previous state of an update)
is decoded lazily, on first access, once for all handlers; predicates that only look at the
new object never pay for it.

**A UID change is a new object.** An object deleted and re-created under the same name while
the informer did not see it (after a relist, or a watch resuming after a gap) reaches
predicates as the ``DELETED`` of the old object and the ``ADDED`` of the new one, never as one
update, so every predicate here lets the new object through as a create. Should an update
whose old and new UIDs differ come from another source anyway, the ``...Changed`` predicates
below pass it (old and new are different objects, whatever their fields say).

Mapping to controller-runtime's ``pkg/predicate``: ``Funcs`` is :class:`PredicateFuncs`,
``NewPredicateFuncs(f)`` is a plain function, ``And``/``Or``/``Not`` are
:func:`and_`/:func:`or_`/:func:`not_`; ``LabelChangedPredicate`` and
``AnnotationChangedPredicate`` are :class:`LabelsChanged` and :class:`AnnotationsChanged`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

from informers.labels import LabelSelector
from informers.store import ADDED, DELETED, MODIFIED, StoreDelta

# What a controller author uses (all of it re-exported by ``controller_runtime``), with
# StoreDelta, the argument every predicate receives. ``as_predicate`` and ``combine`` are the
# runtime's own plumbing.
__all__ = [
    "AnnotationsChanged",
    "GenerationChanged",
    "LabelSelectorPredicate",
    "LabelsChanged",
    "Predicate",
    "PredicateFuncs",
    "PredicateLike",
    "ResourceVersionChanged",
    "StoreDelta",
    "and_",
    "not_",
    "or_",
]

DeltaCheck = Callable[[StoreDelta], bool]


class Predicate:
    """Filters events by type. Every check passes by default; override the ones to filter.

    Calling the predicate with a delta dispatches on ``delta.type``: ``ADDED`` → ``create``,
    ``MODIFIED`` → ``update``, ``DELETED`` → ``delete``, anything else → ``generic``
    (informers never produce other types; ``generic`` exists for sources that do, as in
    controller-runtime).
    """

    __slots__ = ()

    def create(self, delta: StoreDelta) -> bool:
        return True

    def update(self, delta: StoreDelta) -> bool:
        return True

    def delete(self, delta: StoreDelta) -> bool:
        return True

    def generic(self, delta: StoreDelta) -> bool:
        return True

    def __call__(self, delta: StoreDelta) -> bool:
        kind = delta.type
        if kind == MODIFIED:
            return self.update(delta)
        if kind == ADDED:
            return self.create(delta)
        if kind == DELETED:
            return self.delete(delta)
        return self.generic(delta)

    def __and__(self, other: PredicateLike) -> Predicate:
        return and_(self, other)

    def __rand__(self, other: PredicateLike) -> Predicate:
        return and_(other, self)

    def __or__(self, other: PredicateLike) -> Predicate:
        return or_(self, other)

    def __ror__(self, other: PredicateLike) -> Predicate:
        return or_(other, self)

    def __invert__(self) -> Predicate:
        return not_(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


PredicateLike: TypeAlias = Predicate | DeltaCheck
"""A :class:`Predicate`, or a plain function of the delta applied to every event type."""


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if obj is None:
        return {}
    meta = obj.get("metadata")
    return meta if meta is not None else {}


def _other_object(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Old and new are two objects (their UIDs differ), not two versions of one."""
    return _meta(new).get("uid") != _meta(old).get("uid")


class GenerationChanged(Predicate):
    """Passes updates that changed ``metadata.generation`` or the UID; creates and deletes
    pass.

    The API server bumps ``generation`` on writes to an object's spec, so this skips updates
    that only touched metadata (labels, annotations, finalizers, owner references) or status.

    Caveats (as documented by controller-runtime):

    * Not every API bumps ``generation`` only for spec changes: a Deployment's is also bumped
      by writes to ``metadata.annotations``. For a custom resource, ``generation`` ignores
      status writes only when the CRD enables the ``status`` subresource; without it, any
      change but ``metadata`` bumps it. Check what bumps it for the kinds you watch.
    * Status-only updates are never reconciled: if someone else overwrites or wipes the
      status, the controller does not put it back until the next spec change or requeue.
    """

    __slots__ = ()

    def update(self, delta: StoreDelta) -> bool:
        old = delta.old
        if old is None:  # a MODIFIED delta always carries the old state; be safe anyway
            return False
        new = delta.obj
        return _meta(new).get("generation") != _meta(old).get("generation") or _other_object(
            new, old
        )


class ResourceVersionChanged(Predicate):
    """Passes updates whose ``metadata.resourceVersion`` changed; creates and deletes pass.

    controller-runtime uses it to drop resync updates (old == new). This runtime's informers
    do not resync and their stores drop updates at an unchanged resourceVersion, so every
    ``MODIFIED`` delta passes; it is kept for parity and for deltas from other sources.
    """

    __slots__ = ()

    def update(self, delta: StoreDelta) -> bool:
        old = delta.old
        if old is None:
            return False
        return _meta(delta.obj).get("resourceVersion") != _meta(old).get("resourceVersion")


class LabelsChanged(Predicate):
    """Passes updates that changed ``metadata.labels`` (no labels equals empty labels) or the
    UID; creates and deletes pass."""

    __slots__ = ()

    def update(self, delta: StoreDelta) -> bool:
        old = delta.old
        if old is None:
            return False
        new = delta.obj
        return (_meta(new).get("labels") or {}) != (_meta(old).get("labels") or {}) or (
            _other_object(new, old)
        )


class AnnotationsChanged(Predicate):
    """Passes updates that changed ``metadata.annotations`` (none equals empty) or the UID;
    creates and deletes pass."""

    __slots__ = ()

    def update(self, delta: StoreDelta) -> bool:
        old = delta.old
        if old is None:
            return False
        new = delta.obj
        return (_meta(new).get("annotations") or {}) != (_meta(old).get("annotations") or {}) or (
            _other_object(new, old)
        )


class LabelSelectorPredicate(Predicate):
    """Passes events whose object's labels match ``selector`` (for an update, the new object;
    for a delete, the last known state).

    ``selector`` is a :class:`~informers.labels.LabelSelector`, its string form
    (``"app=web,tier!=db"``), or a metav1 ``LabelSelector`` mapping (``matchLabels`` /
    ``matchExpressions``). An empty selector matches everything. Raises ``ValueError`` for an
    invalid selector.

    Caveat: an object relabelled out of the selector produces no event at all, so the
    controller does not learn that it left; filter at the cache (``ByObject.label_selector``)
    instead when the goal is to cache less, and the object then looks deleted.
    """

    __slots__ = ("selector",)

    def __init__(self, selector: LabelSelector | str | Mapping[str, Any]) -> None:
        if isinstance(selector, str):
            selector = LabelSelector.parse(selector)
        elif not isinstance(selector, LabelSelector):
            selector = LabelSelector.from_dict(selector)
        self.selector = selector

    def __call__(self, delta: StoreDelta) -> bool:
        return self.selector.matches(_meta(delta.obj).get("labels"))

    def create(self, delta: StoreDelta) -> bool:
        return self(delta)

    def update(self, delta: StoreDelta) -> bool:
        return self(delta)

    def delete(self, delta: StoreDelta) -> bool:
        return self(delta)

    def generic(self, delta: StoreDelta) -> bool:
        return self(delta)

    def __repr__(self) -> str:
        return f"LabelSelectorPredicate({str(self.selector)!r})"


class PredicateFuncs(Predicate):
    """A predicate from one function per event type; a missing function passes everything
    (controller-runtime's ``predicate.Funcs``)."""

    __slots__ = ("_create", "_delete", "_generic", "_update")

    def __init__(
        self,
        *,
        create: DeltaCheck | None = None,
        update: DeltaCheck | None = None,
        delete: DeltaCheck | None = None,
        generic: DeltaCheck | None = None,
    ) -> None:
        self._create = create
        self._update = update
        self._delete = delete
        self._generic = generic

    def create(self, delta: StoreDelta) -> bool:
        return self._create is None or self._create(delta)

    def update(self, delta: StoreDelta) -> bool:
        return self._update is None or self._update(delta)

    def delete(self, delta: StoreDelta) -> bool:
        return self._delete is None or self._delete(delta)

    def generic(self, delta: StoreDelta) -> bool:
        return self._generic is None or self._generic(delta)


class _Func(Predicate):
    """A plain function of the delta, applied to every event type."""

    __slots__ = ("fn",)

    def __init__(self, fn: DeltaCheck) -> None:
        self.fn = fn

    def __call__(self, delta: StoreDelta) -> bool:
        return self.fn(delta)

    def create(self, delta: StoreDelta) -> bool:
        return self.fn(delta)

    def update(self, delta: StoreDelta) -> bool:
        return self.fn(delta)

    def delete(self, delta: StoreDelta) -> bool:
        return self.fn(delta)

    def generic(self, delta: StoreDelta) -> bool:
        return self.fn(delta)

    def __repr__(self) -> str:
        return f"predicate({getattr(self.fn, '__qualname__', self.fn)!r})"


def as_predicate(p: PredicateLike) -> Predicate:
    """``p`` itself if it is a :class:`Predicate`, else ``p`` wrapped as one."""
    if isinstance(p, Predicate):
        return p
    if not callable(p):
        raise TypeError(f"a predicate must be a Predicate or a function of the delta, got {p!r}")
    return _Func(p)


class _And(Predicate):
    __slots__ = ("parts",)

    def __init__(self, parts: tuple[Predicate, ...]) -> None:
        self.parts = parts

    def __call__(self, delta: StoreDelta) -> bool:
        return all(p(delta) for p in self.parts)

    def create(self, delta: StoreDelta) -> bool:
        return all(p.create(delta) for p in self.parts)

    def update(self, delta: StoreDelta) -> bool:
        return all(p.update(delta) for p in self.parts)

    def delete(self, delta: StoreDelta) -> bool:
        return all(p.delete(delta) for p in self.parts)

    def generic(self, delta: StoreDelta) -> bool:
        return all(p.generic(delta) for p in self.parts)

    def __repr__(self) -> str:
        return f"and_({', '.join(map(repr, self.parts))})"


class _Or(Predicate):
    __slots__ = ("parts",)

    def __init__(self, parts: tuple[Predicate, ...]) -> None:
        self.parts = parts

    def __call__(self, delta: StoreDelta) -> bool:
        return any(p(delta) for p in self.parts)

    def create(self, delta: StoreDelta) -> bool:
        return any(p.create(delta) for p in self.parts)

    def update(self, delta: StoreDelta) -> bool:
        return any(p.update(delta) for p in self.parts)

    def delete(self, delta: StoreDelta) -> bool:
        return any(p.delete(delta) for p in self.parts)

    def generic(self, delta: StoreDelta) -> bool:
        return any(p.generic(delta) for p in self.parts)

    def __repr__(self) -> str:
        return f"or_({', '.join(map(repr, self.parts))})"


class _Not(Predicate):
    __slots__ = ("inner",)

    def __init__(self, inner: Predicate) -> None:
        self.inner = inner

    def __call__(self, delta: StoreDelta) -> bool:
        return not self.inner(delta)

    def create(self, delta: StoreDelta) -> bool:
        return not self.inner.create(delta)

    def update(self, delta: StoreDelta) -> bool:
        return not self.inner.update(delta)

    def delete(self, delta: StoreDelta) -> bool:
        return not self.inner.delete(delta)

    def generic(self, delta: StoreDelta) -> bool:
        return not self.inner.generic(delta)

    def __repr__(self) -> str:
        return f"not_({self.inner!r})"


def and_(*predicates: PredicateLike) -> Predicate:
    """Passes an event only if every predicate does (evaluated in order, stopping at the
    first ``False``). With no predicates, passes everything."""
    return _And(tuple(as_predicate(p) for p in predicates))


def or_(*predicates: PredicateLike) -> Predicate:
    """Passes an event if any predicate does (in order, stopping at the first ``True``).
    With no predicates, passes nothing (as controller-runtime's ``Or``)."""
    return _Or(tuple(as_predicate(p) for p in predicates))


def not_(predicate: PredicateLike) -> Predicate:
    """Passes exactly the events ``predicate`` rejects."""
    return _Not(as_predicate(predicate))


def combine(predicates: Iterable[PredicateLike]) -> DeltaCheck | None:
    """One check for the hot path: ``None`` when there is nothing to check, the predicate
    itself when there is one, their conjunction otherwise."""
    parts = [as_predicate(p) for p in predicates]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return _And(tuple(parts))
