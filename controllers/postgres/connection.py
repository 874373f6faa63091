"""How the operator reaches an instance's server as its administrator.

Secrets are read live (a GET), never from a cache: the operator does not hold every Secret of
the cluster in memory (nor needs ``list``/``watch`` on them), and a decision about credentials
never rests on a stale read.
"""

from __future__ import annotations

from typing import Any

from controller_runtime import Client, Predicate, StoreDelta, ignore_not_found
from controllers.postgres.common import decode_secret
from controllers.postgres.render import SUPERUSER, Names, endpoint
from controllers.postgres.sql import ConnInfo


class ConfigurationError(ValueError):
    """Something the spec points at is missing or malformed; the message says what."""


async def read_secret(client: Client, name: str, namespace: str) -> dict[str, str] | None:
    """The decoded data of Secret ``namespace/name`` (live read), or ``None`` if absent."""
    secret = await ignore_not_found(client.live.get("v1", "Secret", name=name, namespace=namespace))
    return decode_secret(secret) if secret is not None else None


async def admin_conninfo(client: Client, instance: dict[str, Any]) -> ConnInfo:
    """The administrator's connection to ``instance``'s server.

    External: ``spec.external`` (host, port, ``database`` default ``postgres``, ``sslMode``
    default ``prefer``) with the credentials of ``spec.external.adminSecretRef`` (keys
    ``username`` and ``password`` unless ``usernameKey``/``passwordKey`` say otherwise).
    In-cluster: the primary Service as ``postgres`` with the superuser Secret, ``sslmode``
    ``require`` when TLS is on. Raises :class:`ConfigurationError` when the Secret or a key
    is missing.
    """
    meta, spec = instance["metadata"], instance.get("spec") or {}
    where = endpoint(instance)
    external = spec.get("external")
    if external:
        ref = external.get("adminSecretRef") or {}
        secret_name = ref.get("name", "")
        user_key = ref.get("usernameKey", "username")
        password_key = ref.get("passwordKey", "password")
        dbname = external.get("database", "postgres")
        sslmode = external.get("sslMode", "prefer")
    else:
        secret_name, user_key, password_key = Names(meta["name"]).superuser, "username", "password"
        dbname = "postgres"
        sslmode = "require" if (spec.get("tls") or {}).get("secretName") else "prefer"
    data = await read_secret(client, secret_name, meta["namespace"])
    if data is None:
        raise ConfigurationError(f"the admin Secret {secret_name!r} does not exist")
    if password_key not in data:
        raise ConfigurationError(f"the admin Secret {secret_name!r} has no key {password_key!r}")
    user = data.get(user_key) or (SUPERUSER if not external else "")
    if not user:
        raise ConfigurationError(f"the admin Secret {secret_name!r} has no key {user_key!r}")
    return ConnInfo(where["host"], int(where["port"]), user, data[password_key], dbname, sslmode)


class SpecOrDeletionChanged(Predicate):
    """Updates that change the spec (``metadata.generation``) or start a deletion
    (``deletionTimestamp``) pass; status-only and metadata-only updates (our own status and
    finalizer writes among them) do not. Creates and deletes pass."""

    __slots__ = ()

    def update(self, delta: StoreDelta) -> bool:
        new, old = delta.obj["metadata"], (delta.old or {}).get("metadata") or {}
        return bool(
            new.get("generation") != old.get("generation")
            or new.get("deletionTimestamp") != old.get("deletionTimestamp")
        )
