"""Which image the instances' agent sidecar runs: the operator's own (the agent is a module of
the operator, :mod:`controllers.postgres.agent`), so both always speak the same protocol.

In order: ``$CRPY_AGENT_IMAGE`` if set; else, in a Pod (``$POD_NAME`` and ``$POD_NAMESPACE``,
from the downward API: ``manifests/deployment.yaml`` sets them), the image of that Pod's
``operator`` container (its first container if none is named so), read once with a ``list``
of that one Pod (the operator may list Pods); else :data:`DEFAULT` (a development run outside
the cluster, where no Pod of an instance runs anyway). The answer is kept for the process's
life: a new image comes with a new operator Pod.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from controller_runtime import Client

log = logging.getLogger(__name__)

ENV = "CRPY_AGENT_IMAGE"
DEFAULT = "controller-runtime-py/operator:0.2.0"
_resolved: str | None = None


async def agent_image(client: Client, env: Mapping[str, str] = os.environ) -> str:
    """The agent's image (module docs)."""
    global _resolved  # noqa: PLW0603 (one answer per process)
    if _resolved is not None:
        return _resolved
    if env.get(ENV):
        _resolved = env[ENV]
        return _resolved
    pod_name, namespace = env.get("POD_NAME"), env.get("POD_NAMESPACE")
    if not (pod_name and namespace):
        return DEFAULT
    pods = await client.live.list(
        "v1", "Pod", namespace=namespace, field_selector=f"metadata.name={pod_name}"
    )
    containers = [c for p in pods for c in (p.get("spec") or {}).get("containers") or ()]
    named = [c for c in containers if c.get("name") == "operator"] or containers
    if not named:
        log.warning(
            "cannot find the operator's own Pod %s/%s: agents use %s", namespace, pod_name, DEFAULT
        )
        return DEFAULT
    _resolved = str(named[0]["image"])
    log.info("the instances' agent runs %s (the operator's image)", _resolved)
    return _resolved


def forget() -> None:
    """Forget the answer (tests)."""
    global _resolved  # noqa: PLW0603
    _resolved = None
