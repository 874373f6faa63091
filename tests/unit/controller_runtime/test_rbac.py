"""RBAC from declarations: rules, what controllers watch (recorded offline), rendering."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from controller_runtime import (
    ControllerBuilder,
    EnqueueRequestsFromMapFunc,
    Manager,
    ManagerOptions,
    Request,
)
from controller_runtime.rbac import (
    ControllerPermissions,
    Rule,
    Section,
    allow,
    cluster_role,
    leader_election_role,
    permissions,
    permissions_of,
    record,
    role,
    shard_ring_role,
    storage_migration_role,
)
from controllers.api import Task


def test_allow_names_resources_as_kubectl_does() -> None:
    assert allow("configmaps", "patch", "create") == Rule("", ("configmaps",), ("create", "patch"))
    assert allow("statefulsets.apps", "get") == Rule("apps", ("statefulsets",), ("get",))
    assert allow("leases.coordination.k8s.io", "update").group == "coordination.k8s.io"
    assert allow("tasks.tasks.crpy.io/status", "patch").resources == ("tasks/status",)
    assert allow(Task, "patch", subresource="status") == Rule(
        "tasks.crpy.io", ("tasks/status",), ("patch",)
    )
    with pytest.raises(ValueError, match="at least one verb"):
        allow("configmaps")
    with pytest.raises(ValueError, match="subresource once"):
        allow("tasks/status", "patch", subresource="status")


def test_permissions_stack_on_classes_and_functions() -> None:
    first, second = allow("secrets", "get"), allow("configmaps", "create")

    @permissions(first)
    @permissions(second)
    class Reconciler:
        async def reconcile(self, request: Request) -> None:
            return None

    @permissions(first)
    async def reconcile(request: Request) -> None:
        return None

    assert permissions_of(Reconciler().reconcile) == (second, first)
    assert permissions_of(reconcile) == (first,)
    assert permissions_of(lambda request: None) == ()


@permissions(allow(Task, "patch", subresource="status", why="its status"))
class TaskStatusWriter:
    async def reconcile(self, request: Request) -> None:
        return None


async def setup_example(manager: Manager) -> None:
    await (
        ControllerBuilder(manager)
        .named("rbac-example")
        .for_(Task)
        .owns("v1", "ConfigMap")
        .owns("apps/v1", "StatefulSet")
        .watches("networking.k8s.io/v1", "NetworkPolicy", EnqueueRequestsFromMapFunc(lambda _: []))
        .caches("v1", "Namespace")
        .complete(TaskStatusWriter())
    )


async def test_record_finds_what_a_controller_watches_without_a_server() -> None:
    # The manager's server does not exist: anything that tried to reach it would fail.
    (recorded,) = await record([setup_example], options=ManagerOptions(namespaces=["a", "b"]))
    assert recorded.name == "rbac-example"
    assert recorded.watched == (
        ("tasks.crpy.io", "tasks"),
        ("", "configmaps"),
        ("apps", "statefulsets"),
        ("networking.k8s.io", "networkpolicies"),
        ("", "namespaces"),  # cached only (caches()): read, so list and watch too
    )
    assert recorded.declared == (allow(Task, "patch", subresource="status"),)
    # The controller's name is free again: recording twice works.
    assert len(await record([setup_example])) == 1


def rules_of(text: str) -> list[dict[str, Any]]:
    document = yaml.safe_load(text)
    rules: list[dict[str, Any]] = document["rules"]
    return rules


async def test_cluster_role_lists_watches_then_declared_rules_with_their_reasons() -> None:
    recorded = await record([setup_example])
    events = Section("events", (allow("events.events.k8s.io", "create", "patch", why="Events"),))
    text = cluster_role("example", recorded, sections=[events], header="line one\nline two")
    assert text.startswith("# line one\n# line two\n")
    assert rules_of(text) == [
        {"apiGroups": [""], "resources": ["configmaps", "namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["networking.k8s.io"],
            "resources": ["networkpolicies"],
            "verbs": ["list", "watch"],
        },
        {"apiGroups": ["tasks.crpy.io"], "resources": ["tasks"], "verbs": ["list", "watch"]},
        {"apiGroups": ["tasks.crpy.io"], "resources": ["tasks/status"], "verbs": ["patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    assert "  # its status\n  - apiGroups: [tasks.crpy.io]" in text
    assert "  # -- controller rbac-example " in text
    assert text == cluster_role("example", recorded, sections=[events], header="line one\nline two")


def test_rules_with_the_same_verbs_merge_and_subresources_stay_apart() -> None:
    controller = ControllerPermissions(
        "c",
        (),
        (
            allow("secrets", "get", "create", why="a"),
            allow("configmaps", "create", "get", why="b"),
            allow("configmaps/status", "get", "create"),
        ),
    )
    assert rules_of(cluster_role("r", [controller])) == [
        {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "create"]},
        {"apiGroups": [""], "resources": ["configmaps/status"], "verbs": ["get", "create"]},
    ]
    assert "  # a; b\n" in cluster_role("r", [controller])


def test_an_empty_role_is_valid() -> None:
    assert yaml.safe_load(cluster_role("r", []))["rules"] == []


def test_the_leader_election_role() -> None:
    document = yaml.safe_load(leader_election_role("le", "system"))
    assert document["kind"] == "Role" and document["metadata"]["namespace"] == "system"
    assert document["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]


def test_rules_limited_to_named_objects_merge_only_with_the_same_names() -> None:
    named = allow("secrets", "get", "update", resource_names=["certs", "certs"], why="own")
    assert named.resource_names == ("certs",)
    section = Section(
        "s",
        (
            named,
            allow("configmaps", "get", "update", resource_names=["certs"]),
            allow("secrets", "get", "update"),
        ),
    )
    assert rules_of(role("r", "system", [section])) == [
        {
            "apiGroups": [""],
            "resources": ["configmaps", "secrets"],
            "resourceNames": ["certs"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "update"]},
    ]
    with pytest.raises(ValueError, match="create cannot be limited to resource_names"):
        allow("secrets", "create", resource_names=["certs"])


def test_the_shard_ring_role_grants_what_the_ring_does_with_leases() -> None:
    document = yaml.safe_load(shard_ring_role("ring", "system"))
    assert (document["kind"], document["metadata"]["namespace"]) == ("Role", "system")
    (rule,) = document["rules"]
    assert rule == {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["list", "create", "patch", "delete"],
    }


def test_the_storage_migration_role_names_its_crds() -> None:
    crds = ["widgets.shop.example.com", "gadgets.shop.example.com", "things.other.io"]
    document = yaml.safe_load(storage_migration_role("migrate", crds))
    assert document["kind"] == "ClusterRole" and "namespace" not in document["metadata"]
    get, patch, *objects = document["rules"]
    assert get["resources"] == ["customresourcedefinitions"] and get["verbs"] == ["get"]
    assert patch["resources"] == ["customresourcedefinitions/status"]
    assert patch["verbs"] == ["patch"]
    assert get["resourceNames"] == patch["resourceNames"] == sorted(crds)
    assert objects == [
        {"apiGroups": ["other.io"], "resources": ["things"], "verbs": ["list", "update"]},
        {
            "apiGroups": ["shop.example.com"],
            "resources": ["gadgets", "widgets"],
            "verbs": ["list", "update"],
        },
    ]
    with pytest.raises(ValueError, match="not a CRD name"):
        storage_migration_role("m", ["widgets"])
