"""Owner and controller references, with controller-runtime's validations.

An ``ownerReference`` ties a dependent to its owner for garbage collection: when the owner is
deleted, the garbage collector deletes the dependent (or, in ``Foreground`` deletion, the owner
waits for dependents with ``blockOwnerDeletion``). At most one reference may be the
*controller* reference; controllers use it to find "their" objects (``Owns`` in the builder).

The server cannot express everything a reference needs, so these helpers check it first, as
controller-runtime's ``controllerutil`` does:

- an owner must be in the dependent's namespace (the garbage collector resolves a namespaced
  owner in the dependent's namespace only; a cross-namespace reference is treated as a missing
  owner, and the dependent is deleted);
- a cluster-scoped dependent cannot have a namespaced owner (same reason);
- a dependent has at most one controller owner (:class:`AlreadyOwnedError`).

A plain dict cannot tell whether its kind is namespaced, so the callers say so
(``owner_namespaced``/``obj_namespaced``); :meth:`kubeclient.discovery.Discovery.resolve` knows.

Two references designate the same owner when group, kind and name match (the version is
ignored, as in controller-runtime); setting a reference again refreshes it (a recreated owner
has a new UID). An owner may be a typed resource (:mod:`controller_runtime.resource`) as well as
a dict.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from controller_runtime.resource import Resource

OwnerReference = dict[str, Any]


class OwnerReferenceError(ValueError):
    """An owner reference that is not allowed (see the subclasses)."""


class AlreadyOwnedError(OwnerReferenceError):
    """The dependent already has a controller reference to another owner.

    Attributes: ``obj`` (``kind namespace/name`` of the dependent) and ``existing`` (a copy
    of the controller reference it already has).
    """

    def __init__(self, obj: Mapping[str, Any], existing: Mapping[str, Any]) -> None:
        self.obj = _describe(obj)
        self.existing = dict(existing)
        super().__init__(
            f"{self.obj} is already controlled by {existing.get('kind')} "
            f"{existing.get('name')!r} ({existing.get('apiVersion')}, uid "
            f"{existing.get('uid')}): an object has at most one controller owner. Use "
            "set_owner_reference for a non-controller owner, or remove the existing "
            "controller reference first if the hand-over is intended"
        )


class CrossNamespaceOwnerError(OwnerReferenceError):
    """A namespaced owner in another namespace than its dependent."""


class ClusterScopedDependentError(OwnerReferenceError):
    """A namespaced owner of a cluster-scoped dependent."""


def _owner_mapping(owner: Mapping[str, Any] | Resource) -> Mapping[str, Any]:
    """An owner as a dict: a typed resource (:mod:`controller_runtime.resource`) may be one."""
    return owner.to_dict() if isinstance(owner, Resource) else owner


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _describe(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind', '?')} {where}{meta.get('name', '?')}"


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def _same_owner(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (
        _group(str(a.get("apiVersion", ""))) == _group(str(b.get("apiVersion", "")))
        and a.get("kind") == b.get("kind")
        and a.get("name") == b.get("name")
    )


def _reference_to(owner: Mapping[str, Any]) -> OwnerReference:
    meta = _meta(owner)
    missing = [
        field
        for field, value in (
            ("apiVersion", owner.get("apiVersion")),
            ("kind", owner.get("kind")),
            ("metadata.name", meta.get("name")),
            ("metadata.uid", meta.get("uid")),
        )
        if not value
    ]
    if missing:
        raise OwnerReferenceError(
            f"the owner {_describe(owner)} has no {', '.join(missing)}: pass the owner as "
            "read from the API server (a reference needs its UID)"
        )
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
    }


def validate_owner(
    owner: Mapping[str, Any],
    obj: Mapping[str, Any],
    *,
    owner_namespaced: bool,
    obj_namespaced: bool,
) -> None:
    """Raise :class:`OwnerReferenceError` unless ``owner`` may own ``obj``.

    A cluster-scoped owner may own anything. A namespaced owner may own only namespaced
    objects of its own namespace; the dependent's ``metadata.namespace`` must therefore be set
    before the reference is (it is the only way to check).
    """
    if not owner_namespaced:
        return
    owner_ns = _meta(owner).get("namespace")
    if not obj_namespaced:
        raise ClusterScopedDependentError(
            f"{_describe(obj)} is cluster-scoped and cannot have the namespaced owner "
            f"{_describe(owner)}: the garbage collector would treat the owner as missing and "
            "delete it. Use a cluster-scoped owner, or no owner reference"
        )
    obj_ns = _meta(obj).get("namespace")
    if not owner_ns or not obj_ns:
        raise CrossNamespaceOwnerError(
            f"cannot check the namespaces of owner {_describe(owner)} and dependent "
            f"{_describe(obj)}: set metadata.namespace on both first"
        )
    if owner_ns != obj_ns:
        raise CrossNamespaceOwnerError(
            f"cross-namespace owner references are not allowed: owner {_describe(owner)} is "
            f"in namespace {owner_ns!r}, dependent {_describe(obj)} in {obj_ns!r}"
        )


def _owner_references(obj: dict[str, Any]) -> list[OwnerReference]:
    meta = obj.setdefault("metadata", {})
    found = meta.get("ownerReferences")
    if isinstance(found, list):
        return found
    refs: list[OwnerReference] = []
    meta["ownerReferences"] = refs
    return refs


def _upsert(obj: dict[str, Any], ref: OwnerReference) -> bool:
    refs = _owner_references(obj)
    for index, existing in enumerate(refs):
        if _same_owner(existing, ref):
            if existing == ref:
                return False
            refs[index] = ref
            return True
    refs.append(ref)
    return True


def set_controller_reference(
    owner: Mapping[str, Any] | Resource,
    obj: dict[str, Any],
    *,
    owner_namespaced: bool,
    obj_namespaced: bool,
    block_owner_deletion: bool = True,
) -> bool:
    """Make ``owner`` the controller of ``obj`` (in place); return whether ``obj`` changed.

    Sets ``controller: true`` and, by default, ``blockOwnerDeletion: true`` (as
    controller-runtime). Blocking needs ``delete`` permission on the owner (else the server
    answers 422) and, where ``OwnerReferencesPermissionEnforcement`` is on, ``update`` on
    ``<owner>/finalizers``; pass ``block_owner_deletion=False`` when the controller lacks them.

    Raises :class:`AlreadyOwnedError` if another owner is already the controller, and the
    scope errors of :func:`validate_owner`. Nothing is changed when it raises.
    """
    owner = _owner_mapping(owner)
    ref = _reference_to(owner)
    validate_owner(owner, obj, owner_namespaced=owner_namespaced, obj_namespaced=obj_namespaced)
    existing = get_controller_of(obj)
    if existing is not None and not _same_owner(existing, ref):
        raise AlreadyOwnedError(obj, existing)
    ref["controller"] = True
    ref["blockOwnerDeletion"] = block_owner_deletion
    return _upsert(obj, ref)


def set_owner_reference(
    owner: Mapping[str, Any] | Resource,
    obj: dict[str, Any],
    *,
    owner_namespaced: bool,
    obj_namespaced: bool,
) -> bool:
    """Add (or refresh) a non-controller reference from ``obj`` to ``owner``, in place;
    return whether ``obj`` changed.

    Unlike controller-runtime, refreshing the reference of an owner that is already the
    controller keeps its ``controller`` and ``blockOwnerDeletion`` flags (silently demoting a
    controller would orphan the object from its controller's point of view).
    """
    owner = _owner_mapping(owner)
    ref = _reference_to(owner)
    validate_owner(owner, obj, owner_namespaced=owner_namespaced, obj_namespaced=obj_namespaced)
    for existing in _meta(obj).get("ownerReferences") or ():
        if _same_owner(existing, ref):
            for flag in ("controller", "blockOwnerDeletion"):
                if flag in existing:
                    ref[flag] = existing[flag]
    return _upsert(obj, ref)


def remove_owner_reference(owner: Mapping[str, Any] | Resource, obj: dict[str, Any]) -> bool:
    """Remove every reference from ``obj`` to ``owner`` (controller or not); return whether
    one was removed. ``ownerReferences`` is dropped when it becomes empty."""
    owner = _owner_mapping(owner)
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not meta.get("ownerReferences"):
        return False
    target = {
        "apiVersion": owner.get("apiVersion"),
        "kind": owner.get("kind"),
        "name": _meta(owner).get("name"),
    }
    kept = [r for r in meta["ownerReferences"] if not _same_owner(r, target)]
    if len(kept) == len(meta["ownerReferences"]):
        return False
    if kept:
        meta["ownerReferences"] = kept
    else:
        del meta["ownerReferences"]
    return True


def get_controller_of(obj: Mapping[str, Any]) -> OwnerReference | None:
    """A copy of ``obj``'s controller reference, or ``None``."""
    for ref in _meta(obj).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return copy.deepcopy(dict(ref))
    return None


def has_controller_reference(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` has a controller owner."""
    return get_controller_of(obj) is not None


def is_controlled_by(obj: Mapping[str, Any], owner: Mapping[str, Any] | Resource) -> bool:
    """Whether ``owner`` (this very object: compared by UID) is ``obj``'s controller."""
    owner = _owner_mapping(owner)
    ref = get_controller_of(obj)
    uid = _meta(owner).get("uid")
    return ref is not None and bool(uid) and ref.get("uid") == uid
