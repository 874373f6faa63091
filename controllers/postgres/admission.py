"""What the PostgreSQL API's admission webhooks decide, as pure functions: the rules that need
another object (the version policy, the other bindings of an instance) or the object's previous
state in a way CEL does not express well (quantities, version order).

Rules within one object stay CEL rules in the CRDs (``controllers/api/postgres``): the API
server checks them itself, whether or not the operator runs. The webhooks add, at admission:

- **version allowed** — a PostgresInstance's ``spec.version`` must be enabled by the
  PostgresVersionPolicy ``default`` when it is newly chosen (at create, or when it changes);
  refused with the policy's verdict (:func:`controllers.postgres.policy.evaluate`), which names
  the versions enabled. A version that runs and was disabled later keeps running (an update
  that leaves ``spec.version`` alone is accepted). Without a policy, the instance is accepted
  and waits (its ``VersionAccepted`` condition says why): a policy and its instances may then be
  applied together, in any order;
- **no major-version downgrade** — the data directory of a major cannot be read by an older
  one; refused whatever ``allowMajorVersionUpgrade`` says (an upgrade without it is refused too,
  as the controller would refuse it);
- **storage may not shrink** — ``spec.storage.size`` below the previous size is refused (a
  volume cannot be shrunk);
- **one role per name and instance** — a ServiceBinding's role name (``spec.roleName``, or the
  one derived from its namespace and name) must not be the role of another ServiceBinding or
  PostgresUser of the same instance: the two would share, and then drop, one role;
- **defaulting** — an in-cluster PostgresInstance without ``spec.version`` gets the policy's
  ``defaultVersion`` (when the policy has one that is enabled).

Each function takes the objects as dicts (as an admission review carries them) and never
raises on a malformed one: what the schema would refuse anyway is left to the schema.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from controllers.postgres.api import LABEL_BINDING
from controllers.postgres.binding import role_and_database
from controllers.postgres.policy import evaluate, is_enabled, lookup, parse_version
from controllers.postgres.render import DEFAULT_STORAGE_SIZE

__all__ = [
    "Refusal",
    "binding_role_conflict",
    "defaulted_version",
    "instance_refusals",
    "parse_quantity",
    "role_name",
]

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Refusal:
    """Why an object is refused: the field (``spec.version``) and a message that says what to
    do."""

    field: str
    message: str


def instance_refusals(instance: Obj, old: Obj | None, policy: Obj | None) -> list[Refusal]:
    """Every rule a PostgresInstance create (``old`` ``None``) or update breaks."""
    return [
        r
        for r in (
            _version_refusal(instance, old, policy),
            _downgrade_refusal(instance, old),
            _storage_refusal(instance, old),
        )
        if r is not None
    ]


def _spec(obj: Obj | None) -> Mapping[str, Any]:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _version_text(obj: Obj | None) -> str | None:
    version = _spec(obj).get("version")
    return version if isinstance(version, str) and version else None


def _running(old: Obj | None) -> str | None:
    """The version an instance runs: its status's, else what its spec asked for."""
    status = (old or {}).get("status")
    version = status.get("version") if isinstance(status, Mapping) else None
    return version if isinstance(version, str) and version else _version_text(old)


def _version_refusal(instance: Obj, old: Obj | None, policy: Obj | None) -> Refusal | None:
    desired = _version_text(instance)
    if desired is None or policy is None or desired == _version_text(old):
        return None
    try:
        running = parse_version(_running(old) or "") if old is not None else None
    except ValueError:
        running = None
    allow = bool(_spec(instance).get("allowMajorVersionUpgrade"))
    verdict = evaluate(dict(policy), desired, running, allow_major_upgrade=allow)
    if verdict.accepted:
        return None
    message = verdict.message.split("; version ")[0]  # the running version is not the point
    enabled = _enabled_versions(policy)
    hint = f" (enabled: {', '.join(enabled)})" if enabled else " (it enables no version)"
    return Refusal("spec.version", f"{message}{hint}")


def _enabled_versions(policy: Obj) -> list[str]:
    entries = (_spec(policy).get("versions")) or []
    out = [
        str(e.get("version"))
        for e in entries
        if isinstance(e, Mapping) and e.get("enabled", True) and e.get("version")
    ]
    return sorted(set(out), key=_order)


def _order(text: str) -> tuple[int, int]:
    try:
        version = parse_version(text)
    except ValueError:
        return (-1, -1)
    return (version.major, -1 if version.minor is None else version.minor)


def _downgrade_refusal(instance: Obj, old: Obj | None) -> Refusal | None:
    desired, running = _version_text(instance), _running(old)
    if old is None or desired is None or running is None:
        return None
    try:
        new_major, old_major = parse_version(desired).major, parse_version(running).major
    except ValueError:
        return None
    if new_major >= old_major:
        return None
    return Refusal(
        "spec.version",
        f"a major-version downgrade ({old_major} to {new_major}) is refused: PostgreSQL "
        f"{new_major} cannot read the data of {old_major}; restore a Backup into a new "
        "instance instead",
    )


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_FACTORS = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_quantity(text: str) -> Decimal | None:
    """A storage quantity (``20Gi``, ``1.5T``, ``500M``) in bytes, exactly; ``None`` for a form
    the CRD's pattern does not take."""
    match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        return None
    try:
        return Decimal(match[1]) * _FACTORS[match[2]]
    except InvalidOperation:
        return None


def _size(obj: Obj) -> str:
    storage = _spec(obj).get("storage")
    size = storage.get("size") if isinstance(storage, Mapping) else None
    return size if isinstance(size, str) else DEFAULT_STORAGE_SIZE


def _storage_refusal(instance: Obj, old: Obj | None) -> Refusal | None:
    if old is None or _spec(instance).get("external"):
        return None
    new, before = _size(instance), _size(old)
    new_bytes, old_bytes = parse_quantity(new), parse_quantity(before)
    if new_bytes is None or old_bytes is None or new_bytes >= old_bytes:
        return None
    return Refusal(
        "spec.storage.size",
        f"storage cannot shrink (from {before} to {new}): a volume's size only grows; "
        "move the data to a new instance to use less",
    )


def defaulted_version(instance: Obj, policy: Obj | None) -> str | None:
    """The ``spec.version`` to set on an in-cluster instance without one: the policy's
    ``defaultVersion`` when it is enabled; ``None`` when there is nothing to set."""
    spec = _spec(instance)
    if _version_text(instance) is not None or spec.get("external") or policy is None:
        return None
    default = _spec(policy).get("defaultVersion")
    if not isinstance(default, str) or not default:
        return None
    try:
        version = parse_version(default)
    except ValueError:
        return None
    if lookup(dict(policy), version) is None or not is_enabled(dict(policy), version):
        return None
    return default


def role_name(binding: Obj) -> str | None:
    """A ServiceBinding's role: ``spec.roleName``, else the name derived from its namespace and
    name (as the binding controller derives it); ``None`` if it cannot be derived."""
    if not isinstance(binding.get("metadata"), Mapping):
        return None
    try:
        return role_and_database({**binding, "spec": dict(_spec(binding))})[0]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _instance_ref(obj: Obj) -> str | None:
    ref = _spec(obj).get("instanceRef")
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) and name else None


def binding_role_conflict(
    binding: Obj, bindings: Iterable[Obj], users: Iterable[Obj]
) -> Refusal | None:
    """Whether ``binding``'s role is the role of another ServiceBinding or PostgresUser of its
    instance (``bindings`` and ``users``: the objects of its namespace; itself and its own
    PostgresUser are skipped)."""
    role, instance = role_name(binding), _instance_ref(binding)
    if role is None or instance is None:
        return None
    name = _meta(binding).get("name")
    for other in bindings:
        other_meta = _meta(other)
        if other_meta.get("name") == name or _instance_ref(other) != instance:
            continue
        if role_name(other) == role:
            return _conflict(role, instance, f"ServiceBinding {other_meta.get('name')}")
    for user in users:
        user_meta = _meta(user)
        labels = user_meta.get("labels")
        if isinstance(labels, Mapping) and labels.get(LABEL_BINDING) == name:
            continue  # the binding's own PostgresUser
        if _instance_ref(user) == instance and _spec(user).get("roleName") == role:
            return _conflict(role, instance, f"PostgresUser {user_meta.get('name')}")
    return None


def _conflict(role: str, instance: str, holder: str) -> Refusal:
    return Refusal(
        "spec.roleName",
        f"role {role!r} on instance {instance} is already the role of {holder}: "
        "set another spec.roleName",
    )
