"""How far kube-proxy lags behind the cluster, read from its own metrics: how long it took
from a change of a Service's endpoints to the node's rules carrying it, and how long each
rewrite of the rules took. The session prints them (docs/e2e.md, "From ready to reachable").

Each node's kube-proxy serves its metrics on the node's loopback (``127.0.0.1:10249`` inside
the node's network namespace), so they are read from inside each node's namespace; the
histograms of all nodes are summed.

- ``kubeproxy_network_programming_duration_seconds``: from the last change of an endpoint
  (the EndpointSlice's ``endpoints.kubernetes.io/last-change-trigger-time``, set by the
  controller-manager from the Pod's change) to the rules that carry it being written;
- ``kubeproxy_sync_proxy_rules_duration_seconds``: one rewrite of the rules
  (``iptables-restore``), whatever caused it.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from controller_runtime.envtest.node import network

METRICS_URL = "http://127.0.0.1:10249/metrics"
PROGRAMMING = "kubeproxy_network_programming_duration_seconds"
SYNC = "kubeproxy_sync_proxy_rules_duration_seconds"
RULES = "kubeproxy_sync_proxy_rules_iptables_total"
"""Gauge: the rules kube-proxy last wrote, by ``table``."""


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram: cumulative counts by upper bound, sum and count."""

    buckets: tuple[tuple[float, float], ...]
    total: float
    count: float

    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """The upper bound of the first bucket holding the ``q`` quantile (an upper
        estimate, as coarse as the buckets; ``inf`` when it is above the last bound)."""
        if not self.count:
            return math.nan
        for bound, cumulative in self.buckets:
            if cumulative >= q * self.count:
                return bound
        return math.inf

    def above(self, seconds: float) -> float:
        """How many observations were larger than ``seconds``: an upper estimate, counted
        from the largest bucket bound not above ``seconds``."""
        below = max((c for b, c in self.buckets if b <= seconds), default=0.0)
        return self.count - below


def parse_histogram(text: str, name: str) -> Histogram | None:
    """Histogram ``name`` in Prometheus text ``text`` (``None`` when absent). Label sets
    other than ``le`` are summed."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    found = False
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        if metric.startswith(f"{name}_bucket"):
            le = metric.split('le="', 1)[1].split('"', 1)[0]
            bound = math.inf if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(value)
            found = True
        elif metric.startswith(f"{name}_sum"):
            total += float(value)
            found = True
        elif metric.startswith(f"{name}_count"):
            count += float(value)
            found = True
    if not found:
        return None
    return Histogram(tuple(sorted(buckets.items())), total, count)


def summary(text: str) -> dict[str, float]:
    """The numbers the session prints: count, mean, p50/p90/p99 bucket bounds and how many
    took over 1 s and 5 s, for both histograms (module docs); the rules last written, by
    table."""
    numbers: dict[str, float] = {}
    for short, name in (("programming", PROGRAMMING), ("sync", SYNC)):
        histogram = parse_histogram(text, name)
        if histogram is None:
            continue
        numbers[f"kube_proxy_{short}_count"] = histogram.count
        numbers[f"kube_proxy_{short}_mean_s"] = round(histogram.mean(), 3)
        for q in (0.5, 0.9, 0.99):
            numbers[f"kube_proxy_{short}_p{round(q * 100)}_le_s"] = histogram.quantile(q)
        numbers[f"kube_proxy_{short}_over_1s"] = histogram.above(1.0)
        numbers[f"kube_proxy_{short}_over_5s"] = histogram.above(5.0)
    for line in text.splitlines():
        if line.startswith(f"{RULES}{{") and 'table="' in line:
            table = line.split('table="', 1)[1].split('"', 1)[0]
            numbers[f"kube_proxy_iptables_rules_{table}"] = float(line.rpartition(" ")[2])
    return numbers


def read_metrics(netns: Sequence[str], timeout: float = 10) -> str:
    """The metrics text of the kube-proxy of each node in ``netns`` (their network
    namespaces), one after the other (a node whose metrics cannot be read adds nothing:
    the numbers are for the record, not a test)."""
    script = (
        "import sys, urllib.request\n"
        f"sys.stdout.write(urllib.request.urlopen({METRICS_URL!r}, timeout=5).read().decode())\n"
    )
    texts = []
    for name in netns:
        result = subprocess.run(
            network.in_netns([sys.executable, "-c", script], name),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode == 0:
            texts.append(result.stdout)
    return "\n".join(texts)
