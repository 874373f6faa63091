"""What the operator's controllers may do: ``manifests/rbac/`` is generated from this.

``make manifests`` runs every controller's setup against a manager that never connects
(:func:`controller_runtime.rbac.record`): what each one *watches* (its builder's ``for_``,
``owns`` and ``watches``) becomes ``list`` and ``watch``. What it does beyond that is
declared here, per controller, each rule with the reason it is needed; the reason becomes the
comment above the rule. ``tests/integration/test_manifests.py`` runs the real operator under
the generated role and fails if a request is denied or a granted rule is never used, so a
rule here that the code stops needing fails it too.

Conventions (``docs/deploy.md`` explains each rule): cached kinds are never read live
(no ``get``) unless the code does read them live; subresources get rules of their own
(status: the verbs used; finalizers: ``update``, checked by admission when a controller sets
``blockOwnerDeletion`` in an owner reference); no wildcards.
"""

from __future__ import annotations

from controller_runtime import ControllerOptions, Manager
from controller_runtime.rbac import Rule, Section, allow
from controllers.api import Task
from controllers.cli import CONVERSION_CRDS, WEBHOOK_CONFIGURATION, WEBHOOK_SECRET

PG = "postgres.crpy.io"


async def setup_all(manager: Manager) -> None:
    """Every controller the operator can run, on ``manager`` (what the role must cover)."""
    from controllers.app import CONTROLLERS  # noqa: PLC0415 (app imports the controllers)

    for setup in CONTROLLERS.values():
        await setup(manager, ControllerOptions())


_FINALIZER = "finalizer: added and removed with JSON patches, and re-read live before cleanup"
_BLOCK_OWNER = "blockOwnerDeletion on the owner references of what it creates"

DECLARED: dict[str, tuple[Rule, ...]] = {
    "task": (
        allow(
            Task,
            "patch",
            subresource="status",
            why="a merge patch of status (state, conditions, observedGeneration)",
        ),
    ),
    "postgresinstance": (
        allow(f"postgresinstances.{PG}", "get", "patch", why=_FINALIZER),
        allow(f"postgresinstances.{PG}/status", "patch", why="its status"),
        allow(f"postgresinstances.{PG}/finalizers", "update", why=_BLOCK_OWNER),
        allow(
            "statefulsets.apps",
            "create",
            "patch",
            why="what an in-cluster instance renders (server-side apply: create, then patch)",
        ),
        allow("services", "create", "patch", why="the instance's Services (applied)"),
        allow(
            "serviceaccounts",
            "create",
            "patch",
            why="the instance Pods' ServiceAccount, for their agent (applied)",
        ),
        allow(
            "roles.rbac.authorization.k8s.io",
            "create",
            "patch",
            why="the agent's Role: get on its own PostgresInstance (applied)",
        ),
        allow(
            "rolebindings.rbac.authorization.k8s.io",
            "create",
            "patch",
            why="the agent's RoleBinding to its ServiceAccount (applied)",
        ),
        allow("configmaps", "create", "patch", why="the instance's configuration (applied)"),
        allow(
            "poddisruptionbudgets.policy",
            "create",
            "patch",
            "delete",
            why="applied for replicas; deleted when scaled back to one replica",
        ),
        allow("jobs.batch", "create", why="the restore Job of an instance made from a backup"),
        allow(f"backups.{PG}", "get", why="a restore reads its Backup live"),
        allow(
            "secrets",
            "get",
            "create",
            why="superuser Secrets: created, and read live (Secrets are never cached)",
        ),
        allow(
            "pods",
            "list",
            why="while an instance is not Ready its Pods are listed live (an image that "
            "cannot be pulled shows only in their container statuses); the operator's own Pod "
            "once, for its image (the agents run it)",
        ),
        allow(
            "persistentvolumeclaims",
            "list",
            "delete",
            why="deletionPolicy: Delete removes an instance's volume claims",
        ),
    ),
    "postgresfailover": (
        allow(
            f"postgresinstances.{PG}",
            "get",
            "patch",
            why="the switchover annotation is removed once the switchover is done; a status "
            "write refused because the instance controller wrote first is rebased on a live read",
        ),
        allow(f"postgresinstances.{PG}/status", "patch", why="the primary and the HA state"),
        allow(
            "pods",
            "patch",
            "delete",
            why="the role labels the primary and replicas Services select; a rolling update "
            "deletes Pods one at a time (OnDelete strategy)",
        ),
    ),
    "postgresuser": (
        allow(f"postgresusers.{PG}", "get", "patch", why=_FINALIZER),
        allow(f"postgresusers.{PG}/status", "patch", why="its status"),
        allow("secrets", "get", why="the superuser's credentials, read live"),
    ),
    "servicebinding": (
        allow(f"servicebindings.{PG}", "get", "patch", why=_FINALIZER),
        allow(f"servicebindings.{PG}/status", "patch", why="its status"),
        allow(f"servicebindings.{PG}/finalizers", "update", why=_BLOCK_OWNER),
        allow(
            f"postgresusers.{PG}",
            "get",
            "create",
            "patch",
            "delete",
            why="its PostgresUser: applied (created), read live and deleted while the "
            "binding is deleted",
        ),
        allow(
            "secrets",
            "get",
            "create",
            "patch",
            "delete",
            why="the binding Secret: created, updated and deleted; read live",
        ),
    ),
    "backup": (
        allow(
            f"backups.{PG}",
            "get",
            "patch",
            why="its finalizer (delete-object) patched on; read live before creating its Job",
        ),
        allow(f"backups.{PG}/status", "patch", why="its status"),
        allow(f"backups.{PG}/finalizers", "update", why=_BLOCK_OWNER),
        allow(
            "jobs.batch",
            "get",
            "create",
            "delete",
            why="backup Jobs; a deleted Backup's running Job is stopped, and the Job that "
            "deletes its object is read live and removed once finished",
        ),
    ),
    "backupplan": (
        allow(f"backups.{PG}", "create", "delete", why="a plan creates and prunes Backups"),
        allow(f"backupplans.{PG}/status", "patch", why="its status"),
        allow(f"backupplans.{PG}/finalizers", "update", why=_BLOCK_OWNER),
    ),
}
"""Per controller name: what it needs beyond the ``list``/``watch`` of what it watches."""

_CA_BUNDLE = (
    "the webhooks' caBundle: every replica reads it (ready only once it trusts the served "
    "certificate); the leader writes the self-managed CA into it (a conditioned update)"
)

SECTIONS: tuple[Section, ...] = (
    Section(
        "event recorders (every controller)",
        (
            allow(
                "events.events.k8s.io",
                "create",
                "patch",
                why="an Event, and a patch for each series of repeats",
            ),
        ),
    ),
    Section(
        "webhooks (every replica; --webhook-configuration, --webhook-conversion-crds)",
        (
            allow(
                "validatingwebhookconfigurations.admissionregistration.k8s.io",
                "get",
                "update",
                resource_names=[WEBHOOK_CONFIGURATION],
                why=_CA_BUNDLE,
            ),
            allow(
                "mutatingwebhookconfigurations.admissionregistration.k8s.io",
                "get",
                "update",
                resource_names=[WEBHOOK_CONFIGURATION],
                why=_CA_BUNDLE,
            ),
            allow(
                "customresourcedefinitions.apiextensions.k8s.io",
                "get",
                "update",
                resource_names=CONVERSION_CRDS,
                why="the conversion webhook's caBundle, as for the configurations",
            ),
        ),
    ),
)
"""What no one controller owns."""

NAMESPACE_SECTIONS: tuple[Section, ...] = (
    Section(
        "webhook certificates (self-managed; --webhook-secret)",
        (
            allow(
                "secrets",
                "get",
                "update",
                resource_names=[WEBHOOK_SECRET],
                why="the CA and the serving certificate: read by every replica, rotated by "
                "the leader (an update conditioned on its resourceVersion)",
            ),
            allow(
                "secrets",
                "create",
                why="that Secret, created at the first start (a create cannot be restricted "
                "to a name)",
            ),
        ),
    ),
)
"""What the operator does in its own namespace only: ``manifests/rbac/role.yaml``
(:func:`other_manifests`)."""

NAMESPACE_HEADER = """\
What the operator does in its own namespace only: exactly the verbs the code uses, on the
objects it names. tests/integration/test_manifests.py runs the operator under this role and
fails if a request is denied or a rule here is never used.

Generated by `make manifests` from controllers/permissions.py (NAMESPACE_SECTIONS).
The names are the defaults of the operator's flags: change both together."""

HEADER = """\
What the controllers do to their resources in every namespace: exactly the verbs the code
uses, no wildcards, one section per controller. tests/integration/test_manifests.py runs the
operator under this role and fails if a request is denied or if a rule here is never used.

Generated by `make manifests` from controllers/permissions.py (what each controller declares)
and from what the controllers watch: edit those, then regenerate. Leases (leader election)
are not here: see leader-election-role.yaml."""


def other_manifests() -> dict[str, str]:
    """The roles beside the ClusterRole, generated too (``files`` in
    ``[tool.controller-runtime]``): the operator's Role in its own namespace (the webhook
    certificates' Secret), the sharded Deployment's shard ring, and the storage-version
    migration Job (``python -m controllers.migrate``) for every CRD it rewrites."""
    from controller_runtime.rbac import role, shard_ring_role, storage_migration_role  # noqa: PLC0415
    from controllers.migrate import CRDS  # noqa: PLC0415

    return {
        "manifests/rbac/role.yaml": role(
            "crpy-operator", "crpy-system", NAMESPACE_SECTIONS, header=NAMESPACE_HEADER
        ),
        "manifests/sharded/shard-ring-role.yaml": shard_ring_role(
            "crpy-operator-shard-ring",
            "crpy-system",
            header="The shard ring (controller_runtime/sharding.py): each replica creates its "
            "own Lease,\nrenews it and records its claimed slots with a conditional merge patch, "
            "lists the ring's\nLeases (by label; its own by name after a conflict), deletes its "
            "Lease when it leaves or\nis fenced, and deletes other members' expired Leases "
            "(conditioned on uid and version).\nGenerated by `make manifests` "
            "(controllers/permissions.py).",
        ),
        "manifests/upgrade/cluster-role.yaml": storage_migration_role(
            "crpy-storage-migration",
            CRDS,
            header="What python -m controllers.migrate does, and nothing else "
            "(controller_runtime.storage_migration):\nread the PostgreSQL API's CRDs, rewrite "
            "each object unchanged (list, then update: the API\nserver stores it in the storage "
            "version), then narrow the CRDs' status.storedVersions.\nGenerated by `make "
            "manifests` (controllers/permissions.py, controllers/migrate.py).",
        ),
    }
