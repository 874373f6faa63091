"""Small pieces every PostgreSQL controller uses: writing status only when it changed,
reading Secrets and the version policy."""

from __future__ import annotations

import base64
import copy
import logging
from collections.abc import Mapping
from typing import Any

from controller_runtime import (
    Client,
    Condition,
    Request,
    ignore_not_found,
    request_for,
    status_conditions,
)
from controller_runtime import set_conditions as set_all
from controller_runtime.cache import Cache
from controller_runtime.patches import merge_patch
from controllers.postgres.api import API_VERSION, POLICY, POLICY_NAME, ref_name

log = logging.getLogger(__name__)

Obj = dict[str, Any]


async def write_status(client: Client, obj: Obj, status: Mapping[str, Any]) -> Obj:
    """Merge-patch ``obj``'s status to ``status`` if it differs from what ``obj`` shows;
    return the latest object. The patch carries the resourceVersion that was read, so a
    status computed from an outdated object is refused (``ConflictError``: retried)."""
    current = obj.get("status") or {}
    if current == status:
        return obj
    patch = {
        "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
        "status": merge_patch(current, dict(status)),
    }
    return await client.patch_status(obj, patch)


def set_conditions(status: Obj, generation: int | None, *conditions: Condition) -> None:
    """Set ``conditions`` on a status dict (in place), observed at ``generation``."""
    set_all(status_conditions({"status": status}), *conditions, observed_generation=generation)


def status_copy(obj: Obj) -> Obj:
    """A deep copy of ``obj``'s status (empty dict when absent), to compute the next one."""
    return copy.deepcopy(obj.get("status") or {})


def decode_secret(secret: Mapping[str, Any]) -> dict[str, str]:
    """The Secret's ``data`` decoded (``stringData`` is write-only and never read back)."""
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def encode_data(values: Mapping[str, str]) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with every secret replaced by ``***``: for messages that may quote a
    connection string or a server's error (conditions, events, logs)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


async def version_policy(client: Client) -> Obj | None:
    """The cached version policy (the cluster-scoped ``default`` one), ``None`` when there is
    none: see :mod:`controllers.postgres.policy`."""
    return await ignore_not_found(client.get(API_VERSION, POLICY, name=POLICY_NAME))


async def instance_referrers(
    client: Client, api_version: str, kind: str, instance: Obj
) -> list[Obj]:
    """Objects of ``kind`` in ``instance``'s namespace whose ``spec.instanceRef`` names it,
    read through ``client``'s cache (bodies a memory budget evicted are fetched)."""
    meta = instance["metadata"]
    return [
        obj
        for obj in await client.list(api_version, kind, namespace=meta["namespace"])
        if ref_name(obj, "instanceRef") == meta["name"]
    ]


def referrer_requests(cache: Cache, api_version: str, kind: str, instance: Obj) -> list[Request]:
    """For map functions, which are synchronous and cannot fetch: the requests for the
    cached objects of ``kind`` in ``instance``'s namespace whose ``spec.instanceRef`` names
    it, and, under a memory budget, for those of the namespace held as metadata only (their
    spec is not there to read: a reconcile too many is safe, one too few is not)."""
    meta = instance["metadata"]
    bodies, evicted = cache.list_held(api_version, kind, namespace=meta["namespace"])
    return [
        request_for(obj) for obj in bodies if ref_name(obj, "instanceRef") == meta["name"]
    ] + evicted
