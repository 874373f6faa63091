"""RBAC from declarations: a ClusterRole from what the controllers watch and what they declare.

What a controller *watches* is known from its builder (``for_``, ``owns``, ``watches``,
``caches``): each kind it caches needs ``list`` and ``watch``, nothing more (reads come from
the cache).
Everything else a controller does — writes, status writes, live reads — it declares next to
the code that does it, as kubebuilder's ``+kubebuilder:rbac`` markers do::

    @rbac.permissions(
        rbac.allow(Widget, "patch", subresource="status", why="the reconciler's status"),
        rbac.allow("configmaps", "create", "patch", why="the ConfigMap it applies"),
    )
    class WidgetReconciler: ...

(or on a plain ``async def reconcile``), and :func:`record` finds both by running the
project's ordinary setup functions (``async def setup(manager)``) against a manager that
never connects anywhere: informers are created but not started, discovery answers from the
typed classes and from the API's naming rules. :func:`cluster_role` then renders one section
per controller, each rule with its reason as a comment; rules are merged per group and
verbs, resources and verbs sorted, so the output is deterministic.

Resources are named as ``kubectl`` does: ``"configmaps"`` (the core group),
``"statefulsets.apps"``, ``"leases.coordination.k8s.io"``, optionally with a subresource
(``"tasks.tasks.crpy.io/status"``), or by a resource class.

Caveats: a controller that starts watches later (from inside a reconcile) is not seen; a
builtin kind whose plural does not follow the API's rule (``Endpoints``) needs an explicit
rule. Permissions checked by admission rather than by the request (``update`` on an owner's
``finalizers`` when setting ``blockOwnerDeletion``) must be declared too.
"""

from __future__ import annotations

import dataclasses
import ssl
import textwrap
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml

from controller_runtime.cache import Cache
from controller_runtime.client import Client
from controller_runtime.config import ClusterConfig
from controller_runtime.controller import Controller
from controller_runtime.manager import Manager, ManagerOptions
from controller_runtime.resource import Resource, guess_plural, registered, resource_info
from informers.shared import InformerFactory, SharedInformer
from kubeclient.discovery import Discovery, ResourceInfo, split_api_version

__all__ = [
    "WATCH_VERBS",
    "ControllerPermissions",
    "Rule",
    "Section",
    "allow",
    "cluster_role",
    "leader_election_role",
    "permissions",
    "permissions_of",
    "record",
    "role",
    "shard_ring_role",
    "storage_migration_role",
]

WATCH_VERBS = ("list", "watch")
"""What a cached kind needs: a list to fill the cache (the fallback of a streaming list),
a watch to follow it."""

Setup = Callable[[Manager], Awaitable[object]]
F = TypeVar("F")

_VERB_ORDER = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
_UNNAMED_VERBS = frozenset({"create", "list", "watch", "deletecollection"})


@dataclass(frozen=True, order=True)
class Rule:
    """One policy rule: ``verbs`` on ``resources`` of API group ``group`` (``""``: core),
    limited to the objects named ``resource_names`` when given (never with ``create``, ``list``
    or ``watch``: a request of those names no object). ``why`` becomes a comment above it."""

    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str = field(default="", compare=False)
    resource_names: tuple[str, ...] = ()

    def document(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "apiGroups": [self.group],
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }
        if self.resource_names:
            document["resourceNames"] = list(self.resource_names)
        return document


def _sorted_verbs(verbs: Iterable[str]) -> tuple[str, ...]:
    unique = set(verbs)
    rank = {v: i for i, v in enumerate(_VERB_ORDER)}
    return tuple(sorted(unique, key=lambda v: (rank.get(v, len(rank)), v)))


def allow(
    target: type[Resource] | str,
    *verbs: str,
    subresource: str | None = None,
    why: str = "",
    resource_names: Sequence[str] = (),
) -> Rule:
    """A rule granting ``verbs`` on one resource: a class, or ``plural[.group][/sub]``;
    with ``resource_names``, on those objects only (``ValueError`` with a verb that names
    no object: ``create``, ``list``, ``watch``, ``deletecollection``)."""
    if not verbs:
        raise ValueError("allow(...) needs at least one verb")
    unnamed = sorted(set(verbs) & _UNNAMED_VERBS)
    if resource_names and unnamed:
        raise ValueError(
            f"allow(...): {', '.join(unnamed)} cannot be limited to resource_names (the "
            f"request names no object); give those verbs a rule of their own"
        )
    if isinstance(target, str):
        resource, _, sub = target.partition("/")
        plural, _, group = resource.partition(".")
        if sub and subresource:
            raise ValueError(f"{target!r}: give the subresource once")
        subresource = subresource or sub or None
    else:
        info = resource_info(target)
        plural, group = info.plural, info.group
    name = f"{plural}/{subresource}" if subresource else plural
    return Rule(group, (name,), _sorted_verbs(verbs), why, tuple(sorted(set(resource_names))))


def permissions(*rules: Rule) -> Callable[[F], F]:
    """Declare what a reconciler (a class, an object or a function) needs beyond the watches
    of its controller. Stacks: every decorator's rules apply."""

    def declare(target: F) -> F:
        existing: tuple[Rule, ...] = getattr(target, "__rbac_rules__", ())
        target.__rbac_rules__ = (*existing, *rules)  # type: ignore[attr-defined]
        return target

    return declare


def permissions_of(reconciler: object) -> tuple[Rule, ...]:
    """The rules declared on ``reconciler`` (a function, an object or its class)."""
    owner = getattr(reconciler, "__self__", None)  # a bound reconcile method
    found: list[Rule] = []
    for candidate in (reconciler, owner, type(owner) if owner is not None else None):
        if candidate is None:
            continue
        for rule in getattr(candidate, "__rbac_rules__", ()):
            if rule not in found:
                found.append(rule)
    return tuple(found)


@dataclass(frozen=True)
class ControllerPermissions:
    """What one controller needs: the kinds it watches and the rules it declared."""

    name: str
    watched: tuple[tuple[str, str], ...]
    """``(group, plural)`` of every watched kind, in the order the builder registered them."""
    declared: tuple[Rule, ...] = ()

    def rules(self) -> list[Rule]:
        """Watch rules (merged per group) and the declared ones."""
        by_group: dict[str, list[str]] = {}
        for group, plural in self.watched:
            plurals = by_group.setdefault(group, [])
            if plural not in plurals:
                plurals.append(plural)
        watched = [
            Rule(group, tuple(sorted(plurals)), WATCH_VERBS)
            for group, plurals in sorted(by_group.items())
        ]
        if watched:
            why = "what its builder watches: cached, so list and watch only"
            watched[0] = dataclasses.replace(watched[0], why=why)
        return [*watched, *self.declared]


@dataclass(frozen=True)
class Section:
    """Rules that belong to no one controller (what every event recorder needs, ...)."""

    name: str
    rules: tuple[Rule, ...]


# --------------------------------------------------------------------------- recording


_CLUSTER_SCOPED = frozenset(
    {
        ("", "Namespace"),
        ("", "Node"),
        ("", "PersistentVolume"),
        ("rbac.authorization.k8s.io", "ClusterRole"),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
        ("apiextensions.k8s.io", "CustomResourceDefinition"),
        ("storage.k8s.io", "StorageClass"),
        ("scheduling.k8s.io", "PriorityClass"),
    }
)


class _OfflineDiscovery(Discovery):
    """Answers without a server: typed classes first, then the API's naming rule."""

    async def resolve(
        self,
        api_version: str,
        kind: str,
        *,
        wait_for_server: bool = False,
        wait_timeout: float | None = None,
    ) -> ResourceInfo:
        group, version = split_api_version(api_version)
        cls = registered(api_version, kind)
        if cls is not None:
            info = resource_info(cls)
            return ResourceInfo(group, version, kind, info.plural, info.scope == "Namespaced")
        namespaced = (group, kind) not in _CLUSTER_SCOPED
        return ResourceInfo(group, version, kind, guess_plural(kind), namespaced)


class _OfflineFactory(InformerFactory):
    """Creates informers (so handlers can be registered) but never starts them."""

    async def informer(
        self, api_version: str | type, kind: str | None = None, **options: Any
    ) -> SharedInformer:
        options["start"] = False
        return await super().informer(api_version, kind, **options)


def _offline_manager(options: ManagerOptions | None) -> Manager:
    config = ClusterConfig("https://offline.invalid", ssl.create_default_context())
    manager = Manager(config, options or ManagerOptions())
    manager.factory = _OfflineFactory(manager.transport, _OfflineDiscovery(manager.transport))
    manager.cache = Cache(
        manager.factory,
        namespaces=manager.options.namespaces,
        by_object=manager.options.by_object,
        start_timeout=manager.options.start_timeout,
    )
    manager.client = Client(
        manager.transport, manager.cache, field_manager=manager.options.field_manager
    )
    return manager


async def record(
    setups: Sequence[Setup], *, options: ManagerOptions | None = None
) -> list[ControllerPermissions]:
    """Run ``setups`` against a manager that never connects, and return what each controller
    they add watches and declares. Nothing is reconciled, no request is made."""
    async with _offline_manager(options) as manager:  # closing it frees the names
        for setup in setups:
            await setup(manager)
        return [_controller_permissions(c) for c in manager.controllers]


def _controller_permissions(controller: Controller) -> ControllerPermissions:
    watched: list[tuple[str, str]] = []
    informers = [r.informer for r in controller._registrations] + controller._read_only
    for informer in informers:  # what it watches, then what it only caches (caches())
        resource = informer.resource
        if (resource.group, resource.plural) not in watched:
            watched.append((resource.group, resource.plural))
    reconcile = controller._reconcile
    return ControllerPermissions(controller.name, tuple(watched), permissions_of(reconcile))


# ---------------------------------------------------------------------------- rendering


_MergeKey = tuple[str, tuple[str, ...], bool, tuple[str, ...]]
"""A rule's group, verbs, whether it names subresources, and its resource names."""


def _merged(rules: Iterable[Rule]) -> list[Rule]:
    """Rules with the same group and verbs merged (resources sorted), reasons joined, in the
    order they first appear; main resources and subresources kept apart (a rule names one
    or the other)."""
    merged: dict[_MergeKey, tuple[list[str], list[str]]] = {}
    for rule in rules:
        for resource in rule.resources:
            key = (rule.group, rule.verbs, "/" in resource, rule.resource_names)
            resources, reasons = merged.setdefault(key, ([], []))
            if resource not in resources:
                resources.append(resource)
            if rule.why and rule.why not in reasons:
                reasons.append(rule.why)
    return [
        Rule(group, tuple(sorted(resources)), verbs, "; ".join(reasons), names)
        for (group, verbs, _, names), (resources, reasons) in merged.items()
    ]


def _flow(values: Iterable[str]) -> str:
    return "[" + ", ".join(v if v else '""' for v in values) + "]"


def _rule_lines(rule: Rule) -> list[str]:
    lines = [f"  # {line}" for line in textwrap.wrap(rule.why, 94)] if rule.why else []
    lines.append(f"  - apiGroups: {_flow([rule.group])}")
    lines.append(f"    resources: {_flow(rule.resources)}")
    if rule.resource_names:
        lines.append("    resourceNames:")
        lines += [f"      - {name}" for name in rule.resource_names]
    lines.append(f"    verbs: {_flow(rule.verbs)}")
    return lines


def cluster_role(
    name: str,
    controllers: Sequence[ControllerPermissions],
    *,
    sections: Sequence[Section] = (),
    header: str = "",
    labels: Mapping[str, str] | None = None,
) -> str:
    """The ClusterRole ``name`` granting what ``controllers`` (and ``sections``) need, as
    YAML with a comment per section and per rule. Deterministic."""
    return _role("ClusterRole", name, None, controllers, sections, header, labels)


def leader_election_role(name: str, namespace: str, *, header: str = "") -> str:
    """The Role leader election needs in the Lease's namespace: ``get`` to read the Lease,
    ``create`` when it is missing, ``update`` to acquire, renew and release it."""
    rule = allow(
        "leases.coordination.k8s.io",
        "get",
        "create",
        "update",
        why="read the Lease, create it when missing, update it to acquire, renew, release",
    )
    return _role("Role", name, namespace, [], [Section("leader election", (rule,))], header, None)


def role(name: str, namespace: str, sections: Sequence[Section], *, header: str = "") -> str:
    """The Role ``name`` in ``namespace`` granting ``sections``, rendered as
    :func:`cluster_role` renders its sections. Deterministic."""
    return _role("Role", name, namespace, [], sections, header, None)


def shard_ring_role(name: str, namespace: str, *, header: str = "") -> str:
    """The Role a member of a shard ring (:mod:`controller_runtime.sharding`) needs in the
    ring's namespace: ``create`` its own Lease, ``patch`` it (renewals, claimed slots;
    conditional), ``list`` the ring's Leases by label to see the other members (and its own by
    a field selector on the name, to read it again after a conflict), ``delete`` its own on
    leaving or after a fence and other members' expired ones (conditioned on uid and
    resourceVersion). Nothing is read with a ``get``."""
    rule = allow(
        "leases.coordination.k8s.io",
        "list",
        "create",
        "patch",
        "delete",
        why="its own Lease created, renewed and deleted; the ring's Leases listed; expired "
        "ones deleted",
    )
    return role(name, namespace, [Section("shard ring", (rule,))], header=header)


def storage_migration_role(name: str, crds: Sequence[str], *, header: str = "") -> str:
    """The ClusterRole :mod:`controller_runtime.storage_migration` needs for the CRDs named
    ``crds`` (``<plural>.<group>``): ``get`` on those CRDs, ``patch`` on their status (to
    narrow ``storedVersions``), ``list`` and ``update`` on their objects. Deterministic."""
    if not crds:
        raise ValueError("storage_migration_role: name at least one CRD")
    by_group: dict[str, list[str]] = {}
    for crd in crds:
        plural, _, group = crd.partition(".")
        if not plural or not group:
            raise ValueError(f"{crd!r} is not a CRD name (<plural>.<group>)")
        by_group.setdefault(group, []).append(plural)
    names = tuple(crds)
    rules: list[Rule] = [
        Rule(
            "apiextensions.k8s.io",
            ("customresourcedefinitions",),
            ("get",),
            "the CRDs' versions and storedVersions",
            tuple(sorted(names)),
        ),
        Rule(
            "apiextensions.k8s.io",
            ("customresourcedefinitions/status",),
            ("patch",),
            "storedVersions narrowed to the storage version once every object is rewritten",
            tuple(sorted(names)),
        ),
    ]
    rules += [
        Rule(
            group,
            tuple(sorted(plurals)),
            ("list", "update"),
            "every object listed, then written back unchanged",
        )
        for group, plurals in sorted(by_group.items())
    ]
    section = Section("storage-version migration", tuple(rules))
    return _role("ClusterRole", name, None, [], [section], header, None)


def _role(  # noqa: PLR0917 (private; both callers name what they pass)
    kind: str,
    name: str,
    namespace: str | None,
    controllers: Sequence[ControllerPermissions],
    sections: Sequence[Section],
    header: str,
    labels: Mapping[str, str] | None,
) -> str:
    lines = [f"# {line}".rstrip() for line in header.splitlines()] if header else []
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = dict(labels)
    head = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta}
    lines += yaml.safe_dump(head, sort_keys=False).splitlines()
    parts = [(f"controller {c.name}", c.rules()) for c in controllers]
    parts += [(s.name, list(s.rules)) for s in sections]
    lines.append("rules:" if any(rules for _, rules in parts) else "rules: []")
    for title, rules in parts:
        lines.append(f"  # -- {title} " + "-" * max(3, 92 - len(title)))
        for rule in _merged(rules):
            lines += _rule_lines(rule)
    return "\n".join(lines) + "\n"
