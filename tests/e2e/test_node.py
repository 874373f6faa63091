"""The local node itself: a Pod runs, resolves and reaches the API server through the
service range, and has no way out of the node."""

from __future__ import annotations

import json

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.support import diagnostics, new_namespace, wait_for

PROBE = r"""
set -u
echo "routes:"; cat /proc/net/route
echo "dns: $(getent hosts kubernetes.default.svc.cluster.local || echo FAILED)"
token=$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)
exec 3<>/dev/tcp/$KUBERNETES_SERVICE_HOST/$KUBERNETES_SERVICE_PORT && echo "api: connected"
if timeout 3 bash -c 'exec 3<>/dev/tcp/203.0.113.1/80' 2>/dev/null; then echo "outside: REACHED"; \
else echo "outside: unreachable"; fi
echo done
"""


def test_a_pod_runs_resolves_reaches_the_api_server_and_nothing_else(
    cluster: LocalCluster,
) -> None:
    namespace = new_namespace(cluster, "node")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "probe",
                    "image": "postgres:15",
                    "imagePullPolicy": "Never",
                    "command": ["/bin/bash", "-c", PROBE],
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pod))

    def finished() -> bool:
        phase = cluster.kubectl(
            "get", "pod", "probe", "-n", namespace, "-o", "jsonpath={.status.phase}", check=False
        )
        return phase in ("Succeeded", "Failed")

    wait_for(
        finished,
        f"pod {namespace}/probe finishing",
        120,
        lambda: diagnostics(cluster, namespace, "pod probe"),
    )
    log = cluster.kubectl("logs", "-n", namespace, "probe")
    context = f"pod {namespace}/probe printed:\n{log}"
    routes = [line.split() for line in log.split("dns:")[0].splitlines()[2:]]
    assert routes, context
    assert all(fields[1] != "00000000" for fields in routes), f"a default route: {context}"
    assert "dns: 10.0.0.1" in log, context
    assert "api: connected" in log, context
    assert "outside: unreachable" in log, context
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
