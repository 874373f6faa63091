"""The PostgresUser controller: a single-purpose controller that makes one role exist.

For a PostgresUser it makes the role ``spec.roleName`` exist on the instance's server with
LOGIN, the password held in ``spec.passwordSecretRef`` (key ``password`` by default), the
connection limit, the database ``spec.database`` (created when absent) and the grants of
``spec.privileges`` (``ReadWrite``: use and create in schema ``public``, all on its tables;
``ReadOnly``: select only). It is idempotent: an existing role is converged, never dropped and
recreated, and its password is rewritten only when it does not match. Drift (a role dropped
or changed by hand) is repaired at the next reconcile, at the latest ``resync_after`` seconds
later (default 600).

Failures of the database are written to the ``Ready`` condition (reason ``DatabaseError``,
the server's message without secrets) and retried with the controller's backoff, as is a
missing password or admin Secret (``InvalidConfiguration``: Secrets are not watched). A name
the server would refuse is ``InvalidSpec`` and a terminal error: only a new PostgresUser can
fix it. Passwords are never logged, put in an event, a condition or a SQL statement in clear.

A finalizer (``postgres.crpy.io/drop-role``) drops the role when the PostgresUser is deleted
(its objects are reassigned to the administrator: data is kept; the database is kept too).
When the instance is gone, or is an in-cluster instance being deleted, there is nothing left
to drop the role from and the finalizer is released without it (confirmed by a live read: a
cache behind the instance's creation must not strand the role).

Every role this controller creates carries the operator's ownership mark (a comment naming
the instance, see :mod:`controllers.postgres.ownership`), and a role it converges gets the
mark when it has no comment: the instance's orphan sweep (:mod:`controllers.postgres.sweep`)
drops a marked role that no PostgresUser claims any more, e.g. one created by a reconcile
that was interrupted between ``CREATE ROLE`` and its check that the user still exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller_runtime import (
    Client,
    Condition,
    Controller,
    ControllerBuilder,
    ControllerOptions,
    EnqueueRequestsFromMapFunc,
    EventRecorder,
    Request,
    Result,
    TerminalError,
    contains_finalizer,
    handle_finalization,
    ignore_not_found,
    is_being_deleted,
    is_true,
    reconcile_logger,
)
from controller_runtime.builder import ControllerHost
from controllers.postgres import sql
from controllers.postgres.api import (
    API_VERSION,
    INSTANCE,
    USER,
    USER_FINALIZER,
    InvalidNameError,
    check_identifier,
    ref_name,
)
from controllers.postgres.common import (
    referrer_requests,
    set_conditions,
    status_copy,
    write_status,
)
from controllers.postgres.connection import (
    ConfigurationError,
    SpecOrDeletionChanged,
    admin_conninfo,
    read_secret,
)
from controllers.postgres.ownership import owner_of
from controllers.recording import controller_recorder

Obj = dict[str, Any]


def role_spec(user: Obj, password: str) -> sql.RoleSpec:
    """The role ``user`` asks for, marked as the operator's (for ``user``'s instance);
    :class:`InvalidNameError` for a name we refuse."""
    spec = user.get("spec") or {}
    return sql.RoleSpec(
        name=check_identifier(str(spec.get("roleName", "")), "spec.roleName"),
        password=password,
        database=check_identifier(str(spec.get("database", "")), "spec.database"),
        privileges="ReadOnly" if spec.get("privileges") == "ReadOnly" else "ReadWrite",
        connection_limit=int(spec.get("connectionLimit", -1)),
        owner=owner_of(user),
    )


class UserReconciler:
    """Reconciles one PostgresUser; see the module docs."""

    def __init__(
        self, client: Client, recorder: EventRecorder, *, resync_after: float = 600.0
    ) -> None:
        self.client = client
        self.recorder = recorder
        self.resync_after = resync_after

    async def _instance(self, user: Obj) -> Obj | None:
        name = ref_name(user, "instanceRef")
        if name is None:
            return None
        return await ignore_not_found(
            self.client.get(
                API_VERSION, INSTANCE, name=name, namespace=user["metadata"]["namespace"]
            )
        )

    async def reconcile(self, request: Request) -> Result | None:
        user = await ignore_not_found(self.client.get(API_VERSION, USER, request))
        if user is None:
            return None
        instance = await self._instance(user)

        async def drop(obj: Obj) -> None:
            await self._drop(obj, instance)

        outcome = await handle_finalization(self.client, user, USER_FINALIZER, drop)
        if outcome.deleting or outcome.obj is None:
            return None
        user = outcome.obj
        generation = user["metadata"].get("generation")
        status = status_copy(user)
        status["observedGeneration"] = generation
        spec = user.get("spec") or {}
        status["roleName"] = spec.get("roleName")
        status["database"] = spec.get("database")

        async def not_ready(reason: str, message: str) -> None:
            set_conditions(status, generation, Condition("Ready", False, reason, message))
            await write_status(self.client, user, status)

        if instance is None:
            await not_ready(
                "InstanceNotFound",
                f"PostgresInstance {ref_name(user, 'instanceRef')!r} does not exist",
            )
            return None  # its creation brings us back (the instance watch)
        if not is_true((instance.get("status") or {}).get("conditions") or [], "Ready"):
            await not_ready(
                "InstanceNotReady",
                f"PostgresInstance {instance['metadata']['name']!r} is not Ready",
            )
            return None
        secret_ref = spec.get("passwordSecretRef") or {}
        try:
            secret = await read_secret(
                self.client, str(secret_ref.get("name", "")), user["metadata"]["namespace"]
            )
            key = secret_ref.get("key", "password")
            if secret is None or not secret.get(key):
                raise ConfigurationError(
                    f"Secret {secret_ref.get('name')!r} with key {key!r} does not exist"
                )
            role = role_spec(user, secret[key])
            info = await admin_conninfo(self.client, instance)
        except InvalidNameError as err:
            await not_ready("InvalidSpec", str(err))
            raise TerminalError(str(err)) from err  # only a new PostgresUser can fix it
        except ConfigurationError as err:
            # A Secret created or fixed later makes it work: retried with backoff (Secrets are
            # not watched).
            await not_ready("InvalidConfiguration", str(err))
            raise
        try:
            changed = await sql.ensure_role(info, role)
        except sql.DatabaseError as err:
            await not_ready("DatabaseError", str(err))
            raise
        if changed.role_created and not await self._role_still_wanted(user, role.name):
            # Deleted while we created its role: its finalizer will never run. The API server
            # can delete an object whose finalizer was added concurrently
            # (kubernetes/kubernetes#77988), and a new leader's cache can lag behind a
            # deletion, or behind a re-creation under the same name that asks for another
            # role; either way nothing else would ever drop this role.
            await sql.drop_role(info, role.name, role.database)
            reconcile_logger(__name__).info(
                "dropped role %s again: its PostgresUser was deleted meanwhile", role.name
            )
            return None
        self._announce(user, role, changed)
        set_conditions(
            status,
            generation,
            Condition(
                "Ready",
                True,
                "RoleReady",
                f"role {role.name} can log in to database {role.database} ({role.privileges})",
            ),
        )
        await write_status(self.client, user, status)
        return Result(requeue_after=self.resync_after)

    async def _role_still_wanted(self, user: Obj, role: str) -> bool:
        """Whether the server's PostgresUser of ``user``'s name (read live) still stands for
        role ``role`` on the same instance, and its finalizer will drop it one day.

        Identity is the UID, not the name: an object re-created under the name is another
        PostgresUser, and keeps the role only when it asks for the same role on the same
        instance (``roleName`` and ``instanceRef`` cannot change, so the same UID always
        does). One being deleted without this controller's finalizer (the API server's
        delete/finalizer race) will never drop it: not wanted."""
        meta = user["metadata"]
        live = await ignore_not_found(
            self.client.live.get(API_VERSION, USER, name=meta["name"], namespace=meta["namespace"])
        )
        if live is None:
            return False
        if live["metadata"].get("uid") != meta.get("uid"):
            spec = live.get("spec") or {}
            same_role = spec.get("roleName") == role
            if not same_role or ref_name(live, "instanceRef") != ref_name(user, "instanceRef"):
                return False
        return not is_being_deleted(live) or contains_finalizer(live, USER_FINALIZER)

    def _announce(self, user: Obj, role: sql.RoleSpec, changed: sql.RoleOutcome) -> None:
        """Log and record what ``ensure_role`` changed."""
        log = reconcile_logger(__name__)
        if changed.role_created:
            log.info("created role %s", role.name)
            self.recorder.record(
                user, "Normal", "RoleCreated", f"created role {role.name}", "CreateRole"
            )
        elif changed.password_set:
            log.info("reset the password of role %s", role.name)
            self.recorder.record(
                user,
                "Normal",
                "PasswordSet",
                f"set the password of role {role.name}",
                "ConvergeRole",
            )
        if changed.database_created:
            self.recorder.record(
                user,
                "Normal",
                "DatabaseCreated",
                f"created database {role.database}",
                "CreateDatabase",
            )

    async def _drop(self, user: Obj, instance: Obj | None) -> None:
        spec = user.get("spec") or {}
        role = str(spec.get("roleName", ""))
        if _no_server(instance):
            # Releasing without a drop is for good: the cache's word is not enough (a new
            # leader's instance cache may lag behind its users cache).
            instance = await ignore_not_found(
                self.client.live.get(
                    API_VERSION,
                    INSTANCE,
                    name=ref_name(user, "instanceRef") or "",
                    namespace=user["metadata"]["namespace"],
                )
            )
        if _no_server(instance):
            self.recorder.record(
                user,
                "Normal",
                "RoleNotDropped",
                "the instance is gone: no role to drop",
                "DropRole",
            )
            return
        assert instance is not None
        try:
            check_identifier(role, "spec.roleName")
        except InvalidNameError:
            return  # never created
        info = await admin_conninfo(self.client, instance)
        try:
            dropped = await sql.drop_role(info, role, spec.get("database"))
        except sql.DatabaseError as err:
            status = status_copy(user)
            set_conditions(
                status,
                user["metadata"].get("generation"),
                Condition("Ready", False, "DropFailed", str(err)),
            )
            await write_status(self.client, user, status)
            raise
        if dropped:
            reconcile_logger(__name__).info("dropped role %s", role)
            self.recorder.record(user, "Normal", "RoleDropped", f"dropped role {role}", "DropRole")


def _no_server(instance: Obj | None) -> bool:
    """Whether there is no server left to drop a role from: the instance is gone, or is an
    in-cluster one being deleted."""
    return instance is None or (
        is_being_deleted(instance) and not (instance.get("spec") or {}).get("external")
    )


async def setup_user_controller(
    host: ControllerHost,
    client: Client,
    *,
    options: ControllerOptions | None = None,
    recorder: EventRecorder | None = None,
    resync_after: float = 600.0,
) -> Controller:
    """Build the PostgresUser controller on ``host``: watches users (spec changes and
    deletions) and instances (a change, e.g. turning Ready, reconciles their users)."""
    recorder = controller_recorder(host, "postgres.crpy.io/user-controller", recorder)
    cache = client.cache

    def instance_users(instance: Mapping[str, Any]) -> list[Request]:
        return referrer_requests(cache, API_VERSION, USER, dict(instance))

    return await (
        ControllerBuilder(host)
        .named("postgresuser")
        .for_(API_VERSION, USER, predicates=[SpecOrDeletionChanged()])
        .watches(API_VERSION, INSTANCE, EnqueueRequestsFromMapFunc(instance_users))
        .with_options(options)
        .complete(UserReconciler(client, recorder, resync_after=resync_after))
    )
