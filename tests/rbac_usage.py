"""RBAC, as the API server sees it: what the operator's requests need, and what its manifests
grant.

``tests/integration/test_manifests.py`` runs the operator under the manifests' ServiceAccount,
records every request it makes (:class:`RequestLog`, fed by the transport's ``on_request``
hook) and checks, with the helpers here, that nothing was denied, that the model below agrees
with the real authorizer, and that every granted rule was used.

The model follows the API server:

* :func:`classify` is kube-apiserver's ``RequestInfoFactory``: the path gives the API group,
  namespace, resource, name and subresource; the method gives the verb (``GET`` on a named
  object ``get``, on a collection ``list``, or ``watch`` with a ``watch`` parameter other than
  false/0; ``POST`` ``create``; ``PUT`` ``update``; ``PATCH`` ``patch``; ``DELETE`` on a named
  object ``delete``, on a collection ``deletecollection``). A ``fieldSelector`` of
  ``metadata.name=X`` names the object of a list or watch. A ``PATCH`` that created its object
  (201, server-side apply) needed ``create`` as well.
* :func:`grants_for` expands the RoleBindings and ClusterRoleBindings of one ServiceAccount into
  :class:`Grant` atoms (one API group, resource, verb, namespace scope and resource name each).
* Some permissions are checked by admission, not by the request's own authorisation, so no
  request shows them: with the ``OwnerReferencesPermissionEnforcement`` plugin, setting
  ``blockOwnerDeletion`` on an owner reference needs ``update`` on the owner's ``finalizers``
  subresource. :func:`blocking_owner_accesses` derives those uses from the objects the operator
  wrote. (The same plugin wants ``delete`` on an existing object whose owner references change;
  that is not derived here.)
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_NAME_SELECTOR = re.compile(r"^metadata\.name\s*==?\s*(\S+)$")

NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
"""Subresources of a Namespace: ``/api/v1/namespaces/<name>/<these>`` is not a resource in it."""

ESCALATING_VERBS = frozenset({"escalate", "bind", "impersonate"})
FORBIDDEN_RESOURCES = frozenset(
    {
        "serviceaccounts/token",
        "nodes/proxy",
        "mutatingadmissionpolicies",
        "validatingadmissionpolicies",
        "certificatesigningrequests/approval",
    }
)
"""Resources an operator's role must never name (privilege escalation paths)."""

NAMED_ONLY: dict[str, frozenset[str]] = {
    "mutatingwebhookconfigurations": frozenset({"get", "update"}),
    "validatingwebhookconfigurations": frozenset({"get", "update"}),
    "customresourcedefinitions": frozenset({"get", "update"}),
}
"""Resources a role may name only with ``resourceNames`` and only these verbs: what the
webhook certificates need (read the ``caBundle``, write it with a conditioned update) on the
operator's own configurations and CRDs. A rule on any such object, or with any other verb
(create, patch, delete, list, watch), could point the API server's admission or conversion
calls elsewhere, or remove them."""

UNRESTRICTABLE_BY_NAME = frozenset({"create", "list", "watch", "deletecollection"})
"""Verbs that ``resourceNames`` cannot restrict (the name is not known when authorising a
create; list, watch and deletecollection are unrestricted unless a field selector names one
object): a rule combining them looks narrower than it is."""


@dataclass(frozen=True, order=True)
class Access:
    """One request in RBAC's terms. ``namespace`` is empty for cluster-scoped objects and
    all-namespace lists; ``name`` is empty when the request names no object; ``status`` is
    the HTTP status (0: no answer)."""

    verb: str
    group: str
    resource: str
    """``plural`` or ``plural/subresource``."""
    namespace: str = ""
    name: str = ""
    status: int = 200

    @property
    def authorized(self) -> bool:
        """The answer proves the request passed authorisation. Not for 401/403, nor for no
        answer, nor for 429: API Priority and Fairness rejects before authorising."""
        return self.status not in (0, 401, 403, 429)

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else " (cluster-wide)"
        named = f" {self.name!r}" if self.name else ""
        return f"{self.verb} {self.resource}.{self.group or 'core'}{named}{where} -> {self.status}"


def _watch_requested(params: Mapping[str, str]) -> bool:
    value = params.get("watch")
    return value is not None and value.lower() not in ("false", "0")


def _named_by_field_selector(params: Mapping[str, str]) -> str:
    for term in (params.get("fieldSelector") or "").split(","):
        match = _NAME_SELECTOR.match(term.strip())
        if match:
            return match.group(1)
    return ""


def classify(method: str, path: str, params: Mapping[str, str] | None, status: int) -> list[Access]:
    """The RBAC accesses a request needed (empty for non-resource URLs such as discovery)."""
    params = params or {}
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return []
    if not rest:
        return []  # /api/v1, /apis/<group>/<version>: discovery
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else ""
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    method = method.upper()
    if method in ("GET", "HEAD"):
        if name:
            verb = "get"
        else:
            verb = "watch" if _watch_requested(params) else "list"
            name = _named_by_field_selector(params)
    elif method == "POST":
        verb = "create"
    elif method == "PUT":
        verb = "update"
    elif method == "PATCH":
        verb = "patch"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        raise ValueError(f"no RBAC verb for HTTP method {method}")
    accesses = [Access(verb, group, resource, namespace, name, status)]
    if verb == "patch" and status == 201:
        # A patch that created the object (server-side apply) was authorised for create too.
        accesses.append(Access("create", group, resource, namespace, name, status))
    return accesses


@dataclass
class RequestLog:
    """Every request of one or more transports (``transport.on_request = log.record``).
    ``denied`` is set at the first 403, so a test can stop waiting at once."""

    requests: list[tuple[str, str, dict[str, str], int]] = field(default_factory=list)
    denied: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, method: str, path: str, params: Mapping[str, str] | None, status: int) -> None:
        self.requests.append((method, path, dict(params or {}), status))
        if status == 403:
            self.denied.set()

    def accesses(self) -> list[Access]:
        return [access for request in self.requests for access in classify(*request)]


# -- what the manifests grant ---------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Grant:
    """One atom of a rule, in the scope of the binding that grants it: ``namespace`` empty
    means every namespace and cluster-scoped objects (a ClusterRoleBinding); ``resource_name``
    empty means any object."""

    group: str
    resource: str
    verb: str
    namespace: str = ""
    resource_name: str = ""
    source: str = field(default="", compare=False)

    def allows(self, access: Access) -> bool:
        return (
            _matches(self.group, access.group)
            and _resource_matches(self.resource, access.resource)
            and _matches(self.verb, access.verb)
            and (not self.namespace or self.namespace == access.namespace)
            and (not self.resource_name or self.resource_name == access.name)
        )

    def __str__(self) -> str:
        scope = f"in {self.namespace}" if self.namespace else "cluster-wide"
        named = f" {self.resource_name!r}" if self.resource_name else ""
        return f"{self.verb} {self.resource}.{self.group or 'core'}{named} {scope} ({self.source})"


def _matches(granted: str, asked: str) -> bool:
    return granted in ("*", asked)


def _resource_matches(granted: str, asked: str) -> bool:
    if granted in ("*", asked):
        return True
    # "*/scale" grants the scale subresource of every resource.
    return granted.startswith("*/") and asked.partition("/")[2] == granted[2:]


def service_account_user(namespace: str, name: str) -> tuple[str, tuple[str, ...]]:
    """The user name and groups the API server gives a ServiceAccount."""
    return (
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


def _binds(binding: Mapping[str, Any], namespace: str, name: str) -> bool:
    user, groups = service_account_user(namespace, name)
    binding_namespace = (binding.get("metadata") or {}).get("namespace", "")
    for subject in binding.get("subjects") or ():
        kind = subject.get("kind")
        if kind == "ServiceAccount":
            if (
                subject.get("name") == name
                and (subject.get("namespace") or binding_namespace) == namespace
            ):
                return True
        elif (kind == "User" and subject.get("name") == user) or (
            kind == "Group" and subject.get("name") in groups
        ):
            return True
    return False


def _rule_atoms(rules: Iterable[Mapping[str, Any]], namespace: str, source: str) -> list[Grant]:
    atoms = []
    for rule in rules:
        for group in rule.get("apiGroups") or ():
            for resource in rule.get("resources") or ():
                for verb in rule.get("verbs") or ():
                    for resource_name in rule.get("resourceNames") or [""]:
                        atoms.append(Grant(group, resource, verb, namespace, resource_name, source))
    return atoms


def grants_for(documents: Iterable[Mapping[str, Any]], namespace: str, name: str) -> list[Grant]:
    """Everything the bindings in ``documents`` grant ServiceAccount ``namespace/name``.

    Raises ``LookupError`` for a binding whose role is not among ``documents``.
    """
    docs = [d for d in documents if isinstance(d, Mapping)]
    cluster_roles = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ClusterRole"}
    roles = {
        (d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
        for d in docs
        if d.get("kind") == "Role"
    }
    grants: list[Grant] = []
    for binding in docs:
        kind = binding.get("kind")
        if kind not in ("ClusterRoleBinding", "RoleBinding") or not _binds(
            binding, namespace, name
        ):
            continue
        meta = binding["metadata"]
        scope = meta.get("namespace", "") if kind == "RoleBinding" else ""
        ref = binding["roleRef"]
        role: Mapping[str, Any] | None
        if ref["kind"] == "ClusterRole":
            role = cluster_roles.get(ref["name"])
        else:
            role = roles.get((scope, ref["name"]))
        if role is None:
            raise LookupError(
                f"{kind} {meta['name']} refers to a missing {ref['kind']} {ref['name']}"
            )
        source = f"{ref['kind']} {ref['name']} via {kind} {meta['name']}"
        grants.extend(_rule_atoms(role.get("rules") or (), scope, source))
    return sorted(set(grants))


def unused_grants(grants: Iterable[Grant], accesses: Sequence[Access]) -> list[Grant]:
    """The grants no authorised access used."""
    used = [a for a in accesses if a.authorized]
    return [g for g in grants if not any(g.allows(a) for a in used)]


def ungranted_accesses(grants: Sequence[Grant], accesses: Iterable[Access]) -> list[Access]:
    """Authorised accesses that no grant allows: the model and the API server disagree (or a
    default role, such as discovery, allowed it)."""
    return sorted({a for a in accesses if a.authorized and not any(g.allows(a) for g in grants)})


# -- permissions checked by admission --------------------------------------------------------

ResourceOf = Callable[[str, str], tuple[str, str]]
"""``(apiVersion, kind) -> (group, plural)``, e.g. from discovery."""


def blocking_owner_accesses(
    objects: Iterable[Mapping[str, Any]], resource_of: ResourceOf
) -> list[Access]:
    """The ``update <owner>/finalizers`` checks that ``OwnerReferencesPermissionEnforcement``
    makes for ``objects`` (those the operator created or changed): one for every owner
    reference with ``blockOwnerDeletion: true``, in the object's namespace, naming the owner.
    """
    accesses = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        for ref in meta.get("ownerReferences") or ():
            if not ref.get("blockOwnerDeletion"):
                continue
            group, plural = resource_of(ref["apiVersion"], ref["kind"])
            accesses.append(
                Access(
                    "update", group, f"{plural}/finalizers", meta.get("namespace", ""), ref["name"]
                )
            )
    return sorted(set(accesses))


# -- good practice -------------------------------------------------------------------------


def rbac_problems(documents: Iterable[Mapping[str, Any]]) -> list[str]:
    """Where the Roles and ClusterRoles in ``documents`` break the RBAC good practices
    (docs/design.md, "RBAC"); empty when they follow them."""
    problems = []
    for doc in documents:
        kind = doc.get("kind")
        if kind not in ("Role", "ClusterRole"):
            continue
        where = f"{kind} {doc['metadata']['name']}"
        if doc.get("aggregationRule"):
            problems.append(f"{where}: aggregation hides what is granted; list the rules")
        for number, rule in enumerate(doc.get("rules") or (), 1):
            at = f"{where} rule {number}"
            groups = list(rule.get("apiGroups") or ())
            resources = list(rule.get("resources") or ())
            verbs = list(rule.get("verbs") or ())
            if rule.get("nonResourceURLs"):
                problems.append(f"{at}: nonResourceURLs (discovery is granted by default)")
            if "*" in groups + verbs or any(r == "*" or r.startswith("*/") for r in resources):
                problems.append(f"{at}: a wildcard (it covers resources and verbs added later)")
            if ESCALATING_VERBS & set(verbs):
                problems.append(f"{at}: {sorted(ESCALATING_VERBS & set(verbs))} escalate privilege")
            if FORBIDDEN_RESOURCES & set(resources):
                problems.append(f"{at}: {sorted(FORBIDDEN_RESOURCES & set(resources))}")
            for resource in sorted(NAMED_ONLY.keys() & set(resources)):
                if not rule.get("resourceNames"):
                    problems.append(f"{at}: {resource} on any object; name them (resourceNames)")
                beyond = sorted(set(verbs) - NAMED_ONLY[resource])
                if beyond:
                    problems.append(
                        f"{at}: {beyond} on {resource} (only {sorted(NAMED_ONLY[resource])})"
                    )
            subresources = [r for r in resources if "/" in r]
            if subresources and len(subresources) != len(resources):
                problems.append(
                    f"{at}: a subresource ({', '.join(subresources)}) shares a rule with its "
                    "resource; grant subresources in rules of their own"
                )
            unrestricted = sorted(UNRESTRICTABLE_BY_NAME & set(verbs))
            if rule.get("resourceNames") and unrestricted:
                problems.append(f"{at}: resourceNames do not restrict {unrestricted}")
            if kind == "ClusterRole" and "coordination.k8s.io" in groups and "leases" in resources:
                problems.append(f"{at}: Leases belong in a Role in the operator's namespace")
    return problems
