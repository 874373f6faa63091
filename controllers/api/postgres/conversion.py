"""Conversion of PostgresInstances between ``postgres.crpy.io/v1alpha1`` and ``v1beta1`` (the hub,
the storage version): pure functions on the objects as the API sends them (dicts).

The versions differ only in ``spec.replication``:

======================================  ==================================================
v1alpha1                                v1beta1
======================================  ==================================================
``replication: {mode: async}``          ``replication: {}``
``replication: {mode: sync}``           ``replication: {synchronous: {number: 1, method: First}}``
(no way to say it)                      ``synchronous: {number: 2, method: Any}``, any other
======================================  ==================================================

A v1beta1 setting v1alpha1 cannot express is written to v1alpha1 as ``mode: sync`` (the
nearest meaning, which a v1alpha1 reader acts on correctly: commits wait for standbys) plus the
annotation :data:`SYNCHRONOUS_ANNOTATION` holding the v1beta1 value, which the way back reads
and removes: nothing is lost either way (Kubernetes' own API versions round-trip this way).
The annotation is the conversion's: a v1alpha1 client that switches to ``mode: async`` makes it
stale, and it is dropped.

Guarantees (checked by property tests over objects generated from both versions' schemas):
``to_v1alpha1(to_v1beta1(a)) == a`` and ``to_v1beta1(to_v1alpha1(b)) == b`` for every object
either version's schema admits (an empty ``annotations`` map aside, which the API server does
not keep either); each result holds only fields its version's schema knows (the API server
prunes any other, which would lose it); every other field (metadata, status, the rest of the
spec, and fields a newer schema adds) passes through unchanged. Never raises: a conversion
that failed would make the object unreadable in the other version, so a malformed value
(an annotation edited by hand) is ignored instead. The input is never modified.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from controllers.api.postgres.group import GROUP, V1ALPHA1, VERSION

__all__ = [
    "SYNCHRONOUS_ANNOTATION",
    "V1ALPHA1_API_VERSION",
    "V1BETA1_API_VERSION",
    "instance_to_v1alpha1",
    "instance_to_v1beta1",
]

V1ALPHA1_API_VERSION = f"{GROUP}/{V1ALPHA1}"
V1BETA1_API_VERSION = f"{GROUP}/{VERSION}"

SYNCHRONOUS_ANNOTATION = f"{GROUP}/v1beta1-synchronous"
"""On a v1alpha1 PostgresInstance: the v1beta1 ``spec.replication.synchronous`` (JSON) that
``mode: sync`` cannot express."""

_ALPHA_DEFAULT_SYNCHRONOUS: dict[str, Any] = {"number": 1, "method": "First"}
"""What v1alpha1's ``mode: sync`` means in v1beta1 (the operator's behaviour in v1alpha1)."""


def instance_to_v1beta1(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A v1alpha1 PostgresInstance as v1beta1 (a new dict)."""
    out = copy.deepcopy(dict(obj))
    out["apiVersion"] = V1BETA1_API_VERSION
    saved = _pop_annotation(out)
    spec = out.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("replication"), dict):
        return out
    replication = spec["replication"]
    mode = replication.pop("mode", "async")
    if mode == "sync":
        synchronous = _decode(saved) if saved is not None else None
        replication["synchronous"] = synchronous or dict(_ALPHA_DEFAULT_SYNCHRONOUS)
    return out


def instance_to_v1alpha1(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A v1beta1 PostgresInstance as v1alpha1 (a new dict)."""
    out = copy.deepcopy(dict(obj))
    out["apiVersion"] = V1ALPHA1_API_VERSION
    _pop_annotation(out)
    spec = out.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("replication"), dict):
        return out
    replication = spec["replication"]
    synchronous = replication.pop("synchronous", None)
    if synchronous is None:
        replication["mode"] = "async"
        return out
    replication["mode"] = "sync"
    if synchronous != _ALPHA_DEFAULT_SYNCHRONOUS:
        metadata = out.setdefault("metadata", {})
        annotations = metadata.get("annotations")
        if not isinstance(annotations, dict):
            annotations = metadata["annotations"] = {}
        annotations[SYNCHRONOUS_ANNOTATION] = json.dumps(
            synchronous, sort_keys=True, separators=(",", ":")
        )
    return out


def _pop_annotation(obj: dict[str, Any]) -> str | None:
    """Remove :data:`SYNCHRONOUS_ANNOTATION` (and the annotations map it leaves empty)."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        return None
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict) or SYNCHRONOUS_ANNOTATION not in annotations:
        return None
    value = annotations.pop(SYNCHRONOUS_ANNOTATION)
    if not annotations:
        del metadata["annotations"]
    return value if isinstance(value, str) else None


def _decode(text: str) -> dict[str, Any] | None:
    """The saved v1beta1 value, or ``None`` when it is not a JSON object (edited by hand)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) and value else None
