"""The ServiceBinding controller: binds an application to a PostgresInstance.

For each ServiceBinding it keeps two objects, both controlled by the binding:

- a Secret (``spec.secretName``, default ``<binding>-credentials``) in the layout of the
  servicebinding.io specification: ``type``, ``provider``, ``host``, ``port``, ``database``,
  ``username`` (and ``user``), ``password``, ``sslmode`` and ``uri``;
- a PostgresUser for the binding's own role (``spec.roleName``, default derived from the
  namespace and name), whose password is that Secret's ``password``.

The password is generated once (``secrets``), when the Secret is created, and never replaced:
the Secret is read live and created with ``create`` (``AlreadyExists`` means someone,
perhaps our own earlier attempt, created it: its password is kept), so neither a repeated
reconcile nor a stale cache can lose it. Other keys follow the instance (e.g. a new host).
``status.binding.name`` names the Secret (the servicebinding.io duck type); ``Ready`` mirrors
the PostgresUser's.

What only the user can fix ends the reconcile without retries: an invalid role or database
name (``InvalidSpec``), and a Secret of that name that this binding does not control
(``SecretNotOwned``: Ready False, a Warning Event, and a ``TerminalError``; the binding is
reconciled again when it changes). A missing instance (``InstanceNotFound``) gets a Warning
Event too; the binding is reconciled again when the instance appears.

Deleting the binding (finalizer ``postgres.crpy.io/binding``, through
:func:`~controller_runtime.handle_finalization`) deletes the PostgresUser, whose own finalizer
drops the role, and the Secret, in one pass (both read live at once); the cleanup stays
pending (the finalizer stays) until the PostgresUser is gone, whose deletion event brings the
binding back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from controller_runtime import (
    AlreadyExistsError,
    CleanupPending,
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
    get_condition,
    handle_finalization,
    ignore_not_found,
    is_being_deleted,
    is_controlled_by,
    reconcile_logger,
    set_controller_reference,
)
from controller_runtime.builder import ControllerHost
from controllers.postgres.api import (
    API_VERSION,
    BINDING,
    BINDING_FINALIZER,
    INSTANCE,
    LABEL_BINDING,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    USER,
    InvalidNameError,
    check_identifier,
    identifier_from,
    ref_name,
)
from controllers.postgres.common import (
    decode_secret,
    encode_data,
    referrer_requests,
    set_conditions,
    status_copy,
    write_status,
)
from controllers.postgres.connection import SpecOrDeletionChanged
from controllers.postgres.scram import generate_password
from controllers.recording import controller_recorder

Obj = dict[str, Any]
FIELD_MANAGER = "service-binding"


def secret_name(binding: Obj) -> str:
    return str(
        (binding.get("spec") or {}).get("secretName")
        or f"{binding['metadata']['name']}-credentials"
    )


def role_and_database(binding: Obj) -> tuple[str, str]:
    """The role and database of ``binding`` (deterministic); :class:`InvalidNameError`."""
    meta, spec = binding["metadata"], binding.get("spec") or {}
    role = spec.get("roleName") or identifier_from(meta["namespace"], meta["name"])
    database = spec.get("database") or identifier_from(meta["name"])
    return (check_identifier(role, "spec.roleName"), check_identifier(database, "spec.database"))


def credentials(
    instance: Obj, endpoint: dict[str, Any], role: str, database: str, password: str
) -> dict[str, str]:
    """The Secret's data (decoded) for the given password."""
    spec = instance.get("spec") or {}
    external = spec.get("external") or {}
    if external:
        sslmode = external.get("sslMode", "prefer")
    else:
        sslmode = "require" if (spec.get("tls") or {}).get("secretName") else "prefer"
    host, port = str(endpoint["host"]), str(endpoint["port"])
    uri = (
        f"postgresql://{quote(role, safe='')}:{quote(password, safe='')}@{host}:{port}/"
        f"{quote(database, safe='')}?sslmode={sslmode}"
    )
    return {
        "type": "postgresql",
        "provider": MANAGED_BY,
        "host": host,
        "port": port,
        "database": database,
        "username": role,
        "user": role,
        "password": password,
        "sslmode": sslmode,
        "uri": uri,
    }


class SecretNotOwnedError(Exception):
    """The binding's Secret exists and another owner (or nobody) controls it."""


class BindingReconciler:
    """Reconciles one ServiceBinding; see the module docs."""

    def __init__(self, client: Client, recorder: EventRecorder) -> None:
        self.client = client
        self.recorder = recorder

    async def reconcile(self, request: Request) -> Result | None:
        binding = await ignore_not_found(self.client.get(API_VERSION, BINDING, request))
        if binding is None:
            return None
        outcome = await handle_finalization(self.client, binding, BINDING_FINALIZER, self._cleanup)
        if outcome.deleting or outcome.obj is None:
            return outcome.result
        binding = outcome.obj
        meta = binding["metadata"]
        generation = meta.get("generation")
        status = status_copy(binding)
        status["observedGeneration"] = generation

        async def not_ready(reason: str, message: str) -> None:
            set_conditions(status, generation, Condition("Ready", False, reason, message))
            await write_status(self.client, binding, status)

        try:
            role, database = role_and_database(binding)
        except InvalidNameError as err:
            await not_ready("InvalidSpec", str(err))
            return None  # only a spec change can fix it
        instance_name = ref_name(binding, "instanceRef") or ""
        instance = await ignore_not_found(
            self.client.get(API_VERSION, INSTANCE, name=instance_name, namespace=meta["namespace"])
        )
        if instance is None:
            message = f"PostgresInstance {instance_name!r} does not exist"
            await not_ready("InstanceNotFound", message)
            self.recorder.record(binding, "Warning", "InstanceNotFound", message, "Bind")
            return None  # the instance watch brings the binding back when it appears
        endpoint = (instance.get("status") or {}).get("endpoint")
        if not endpoint:
            await not_ready(
                "InstanceNotReady", f"PostgresInstance {instance_name!r} has no endpoint yet"
            )
            return None
        name = secret_name(binding)
        try:
            await self._ensure_secret(binding, instance, endpoint, role, database)
        except SecretNotOwnedError as err:
            await not_ready("SecretNotOwned", str(err))
            self.recorder.record(binding, "Warning", "SecretNotOwned", str(err), "Bind")
            raise TerminalError(str(err)) from err
        user = {
            "apiVersion": API_VERSION,
            "kind": USER,
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "labels": {LABEL_BINDING: meta["name"], LABEL_MANAGED_BY: MANAGED_BY},
            },
            "spec": {
                "instanceRef": {"name": instance_name},
                "roleName": role,
                "database": database,
                "privileges": (binding.get("spec") or {}).get("privileges", "ReadWrite"),
                "passwordSecretRef": {"name": name, "key": "password"},
            },
        }
        set_controller_reference(binding, user, owner_namespaced=True, obj_namespaced=True)
        applied = await self.client.apply(user, field_manager=FIELD_MANAGER, force=True)
        user_ready = get_condition((applied.get("status") or {}).get("conditions") or [], "Ready")
        status["binding"] = {"name": name}
        status["roleName"] = role
        status["database"] = database
        if user_ready and user_ready.get("status") == "True":
            ready = Condition(
                "Ready", True, "Bound", f"Secret {name} holds the credentials of role {role}"
            )
        else:
            reason = (user_ready or {}).get("reason") or "UserPending"
            message = (user_ready or {}).get("message") or "waiting for the PostgresUser"
            ready = Condition("Ready", False, reason, message)
        set_conditions(status, generation, ready)
        await write_status(self.client, binding, status)
        return None

    async def _ensure_secret(
        self, binding: Obj, instance: Obj, endpoint: dict[str, Any], role: str, database: str
    ) -> None:
        meta = binding["metadata"]
        name = secret_name(binding)
        log = reconcile_logger(__name__)
        existing = await ignore_not_found(
            self.client.live.get("v1", "Secret", name=name, namespace=meta["namespace"])
        )
        if existing is not None and not is_controlled_by(existing, binding):
            raise SecretNotOwnedError(
                f"Secret {name} exists and is not controlled by this binding: delete it, or set "
                "spec.secretName to another name (on a new binding: it cannot change)"
            )
        current = decode_secret(existing) if existing is not None else {}
        password = current.get("password") or generate_password()
        desired = credentials(instance, endpoint, role, database, password)
        if existing is None:
            secret: Obj = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "servicebinding.io/postgresql",
                "metadata": {
                    "name": name,
                    "namespace": meta["namespace"],
                    "labels": {LABEL_BINDING: meta["name"], LABEL_MANAGED_BY: MANAGED_BY},
                },
                "data": encode_data(desired),
            }
            set_controller_reference(binding, secret, owner_namespaced=True, obj_namespaced=True)
            try:
                await self.client.create(secret)
            except AlreadyExistsError:
                # Created meanwhile (a lost answer to our own create, say): keep its password;
                # the next reconcile converges the other keys.
                raise RuntimeError(f"Secret {name} appeared while creating it; retrying") from None
            log.info("created Secret %s", name)
            self.recorder.record(
                binding, "Normal", "SecretCreated", f"created Secret {name} for role {role}", "Bind"
            )
            return
        if current != desired:
            patch = {
                "metadata": {"resourceVersion": existing["metadata"]["resourceVersion"]},
                "data": encode_data(desired),
            }
            await self.client.patch(existing, patch)
            log.info("updated Secret %s", name)

    async def _cleanup(self, binding: Obj) -> CleanupPending | None:
        """Delete the binding's PostgresUser and Secret (both read live, at once); pending
        until the PostgresUser (whose own finalizer drops the role) is gone."""
        meta = binding["metadata"]
        user, secret = await asyncio.gather(
            self._controlled(binding, API_VERSION, USER, meta["name"]),
            self._controlled(binding, "v1", "Secret", secret_name(binding)),
        )
        # The PostgresUser first (its deletion is what the role's drop waits for), then the
        # Secret, in the same pass: the last pass, once the user is gone, only confirms.
        remaining = None
        if user is not None:
            remaining = user if is_being_deleted(user) else await self._delete(user)
        if secret is not None:
            await self._delete(secret)
        if remaining is not None:
            return CleanupPending(f"PostgresUser {meta['name']} is dropping its role")
        self.recorder.record(
            binding, "Normal", "Unbound", "deleted the PostgresUser and the Secret", "Unbind"
        )
        return None

    async def _controlled(self, binding: Obj, api_version: str, kind: str, name: str) -> Obj | None:
        """The live object ``kind/name`` of the binding's namespace if the binding controls
        it (compared by UID), else ``None``."""
        obj = await ignore_not_found(
            self.client.live.get(
                api_version, kind, name=name, namespace=binding["metadata"]["namespace"]
            )
        )
        return obj if obj is not None and is_controlled_by(obj, binding) else None

    async def _delete(self, obj: Obj) -> Obj | None:
        """Delete ``obj`` itself (its UID is a precondition); what remains of it (``None``:
        gone now, or already)."""
        return await ignore_not_found(
            self.client.delete(obj, preconditions={"uid": obj["metadata"]["uid"]})
        )


async def setup_binding_controller(
    host: ControllerHost,
    client: Client,
    *,
    options: ControllerOptions | None = None,
    recorder: EventRecorder | None = None,
) -> Controller:
    """Build the ServiceBinding controller on ``host``: watches bindings (spec changes and
    deletions), the PostgresUsers they own, and instances (a new endpoint or readiness
    reconciles their bindings)."""
    recorder = controller_recorder(host, "postgres.crpy.io/binding-controller", recorder)
    cache = client.cache

    def instance_bindings(instance: Mapping[str, Any]) -> list[Request]:
        return referrer_requests(cache, API_VERSION, BINDING, dict(instance))

    return await (
        ControllerBuilder(host)
        .named("servicebinding")
        .for_(API_VERSION, BINDING, predicates=[SpecOrDeletionChanged()])
        .owns(API_VERSION, USER)
        .watches(API_VERSION, INSTANCE, EnqueueRequestsFromMapFunc(instance_bindings))
        .with_options(options)
        .complete(BindingReconciler(client, recorder))
    )
