"""The PostgreSQL API's webhooks: a validator and a defaulter for PostgresInstances, a validator
for ServiceBindings, and the PostgresInstance conversion between v1alpha1 and v1beta1.

The decisions are :mod:`controllers.postgres.admission` (pure); here they meet the request and
the client. The other objects a rule needs (the version policy, the bindings and users of a
namespace) are read from the manager's cache. :func:`setup_webhooks` holds those kinds in the
cache itself, for the cache's life, rather than borrowing the controllers' watches: a
controller releases its kinds when it stops, which at SIGTERM comes before the webhook server
stops answering (its shutdown delay), and a review then would find nothing cached. A webhook
is still registered only beside its controller (the operator runs what it is asked to).
Deletes are never refused (a finalizer does the cleanup), nor are status updates (the
validating configuration covers the main resource only).

:func:`setup_webhooks` registers them at controller-runtime's paths
(``/validate-postgres-crpy-io-v1beta1-postgresinstance``, ...) and ``/convert``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controller_runtime import Manager
from controller_runtime.client import Client
from controller_runtime.webhook import (
    AdmissionRequest,
    Denied,
    HubConverter,
    Spoke,
    WebhookBuilder,
    WebhookPaths,
)
from controllers.api.postgres.conversion import (
    V1ALPHA1_API_VERSION,
    V1BETA1_API_VERSION,
    instance_to_v1alpha1,
    instance_to_v1beta1,
)
from controllers.postgres.admission import (
    Refusal,
    binding_role_conflict,
    defaulted_version,
    instance_refusals,
)
from controllers.postgres.api import API_VERSION, BINDING, INSTANCE, POLICY, USER
from controllers.postgres.common import version_policy

__all__ = [
    "INSTANCE_CONVERTER",
    "BindingValidator",
    "InstanceDefaulter",
    "InstanceValidator",
    "setup_webhooks",
]

INSTANCE_CONVERTER = HubConverter(
    hub=V1BETA1_API_VERSION,
    spokes={V1ALPHA1_API_VERSION: Spoke(to_hub=instance_to_v1beta1, from_hub=instance_to_v1alpha1)},
)
"""PostgresInstance: v1beta1 is the hub (the storage version), v1alpha1 its one spoke."""


def _deny(refusals: Sequence[Refusal]) -> None:
    """Raise one denial naming every rule broken (the first one's field)."""
    if refusals:
        raise Denied("; ".join(r.message for r in refusals), field=refusals[0].field)


async def _policy(client: Client) -> dict[str, Any] | None:
    policy = await version_policy(client)
    return dict(policy) if policy is not None else None


class InstanceValidator:
    """PostgresInstance: the version policy, no major downgrade, storage never shrinks."""

    async def validate_create(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any]
    ) -> Sequence[str]:
        _deny(instance_refusals(obj, None, await _policy(client)))
        return ()

    async def validate_update(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any], old: dict[str, Any]
    ) -> Sequence[str]:
        _deny(instance_refusals(obj, old, await _policy(client)))
        return ()

    async def validate_delete(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any]
    ) -> Sequence[str]:
        return ()


class InstanceDefaulter:
    """PostgresInstance: ``spec.version`` from the policy's ``defaultVersion`` when empty."""

    async def default(self, request: AdmissionRequest, client: Client, obj: dict[str, Any]) -> None:
        version = defaulted_version(obj, await _policy(client))
        if version is not None:
            spec = obj.get("spec")
            if isinstance(spec, dict):
                spec["version"] = version


class BindingValidator:
    """ServiceBinding: its role is not another binding's or user's role on its instance."""

    async def validate_create(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any]
    ) -> Sequence[str]:
        await self._check(client, obj)
        return ()

    async def validate_update(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any], old: dict[str, Any]
    ) -> Sequence[str]:
        await self._check(client, obj)
        return ()

    async def validate_delete(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any]
    ) -> Sequence[str]:
        return ()

    @staticmethod
    async def _check(client: Client, obj: dict[str, Any]) -> None:
        namespace = (obj.get("metadata") or {}).get("namespace")
        if not isinstance(namespace, str):
            return
        bindings = await client.list(API_VERSION, BINDING, namespace=namespace)
        users = await client.list(API_VERSION, USER, namespace=namespace)
        refusal = binding_role_conflict(obj, bindings, users)
        if refusal is not None:
            _deny([refusal])


async def setup_webhooks(manager: Manager, controllers: Sequence[str]) -> list[WebhookPaths]:
    """Register the conversion, and the admission webhooks of the chosen ``controllers``
    (``postgres-instance`` brings the PostgresInstance validator and defaulter,
    ``service-binding`` the ServiceBinding validator), and hold in the manager's cache the
    kinds they read (module docstring). The conversion is always registered: reads of
    v1alpha1, and of objects still stored as v1alpha1, need it whatever runs."""
    instance = (
        WebhookBuilder(manager).for_(API_VERSION, INSTANCE).with_converter(INSTANCE_CONVERTER)
    )
    read: list[str] = []
    if "postgres-instance" in controllers:
        instance = instance.with_validator(InstanceValidator()).with_defaulter(InstanceDefaulter())
        read.append(POLICY)
    paths = [instance.complete()]
    if "service-binding" in controllers:
        paths.append(
            WebhookBuilder(manager)
            .for_(API_VERSION, BINDING)
            .with_validator(BindingValidator())
            .complete()
        )
        read += [BINDING, USER]
    for kind in read:
        await manager.cache.watch(API_VERSION, kind, holder=WEBHOOKS)
    return paths


WEBHOOKS = "postgres-webhooks"
"""The cache holder of the kinds the webhooks read: never released, so they stay cached
until the cache stops, after the webhook server."""
