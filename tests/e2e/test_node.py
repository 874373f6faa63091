"""The local node itself: a Pod runs, resolves and reaches the API server through the
service range, and has no way out of the node."""

from __future__ import annotations

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.pods import run_pod
from tests.e2e.support import new_namespace

PROBE = r"""
set -u
echo "routes:"; cat /proc/net/route
echo "dns: $(retry_connect resolve kubernetes.default.svc.cluster.local || echo FAILED)"
retry_connect tcp_connect "$KUBERNETES_SERVICE_HOST" "$KUBERNETES_SERVICE_PORT" \
  && echo "api: connected"
if timeout 3 bash -c 'exec 3<>/dev/tcp/203.0.113.1/80' 2>/dev/null; then echo "outside: REACHED"; \
else echo "outside: unreachable"; fi
echo done
"""
"""Name resolution and the API server's Service are retried while CoreDNS and kube-proxy catch
up (tests/e2e/connect.py); the outside address is tried once: it must never answer."""


def test_a_pod_runs_resolves_reaches_the_api_server_and_nothing_else(
    cluster: LocalCluster,
) -> None:
    namespace = new_namespace(cluster, "node")
    log = run_pod(cluster, namespace, "probe", PROBE).log
    context = f"pod {namespace}/probe printed:\n{log}"
    routes = [line.split() for line in log.split("dns:")[0].splitlines()[2:]]
    assert routes, context
    assert all(fields[1] != "00000000" for fields in routes), f"a default route: {context}"
    assert "dns: 10.0.0.1" in log, context
    assert "api: connected" in log, context
    assert "outside: unreachable" in log, context
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
