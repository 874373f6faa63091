"""How far kube-proxy lags behind the cluster, read from its own metrics: how long it took
from a change of a Service's endpoints to the node's rules carrying it, and how long each
rewrite of the rules took. The session prints them (docs/e2e.md, "From ready to reachable")
for the whole session and for each test (:class:`Window`: what changed from before the test
to after it, with the load average), so that a whole run can be compared with one file run
alone.

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
"""Gauge: the rules kube-proxy manages, by ``table`` (and ``ip_family``: the IPv4 ones count)."""
RULES_KEY = "kube_proxy_iptables_rules_"
"""Prefix of the rules' numbers in :func:`summary` (then the table's name)."""


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

    def minus(self, earlier: Histogram | None) -> Histogram:
        """The observations made since ``earlier`` (the same histogram read before; ``None``:
        all of them). Buckets, sum and count are cumulative, so they subtract."""
        if earlier is None:
            return self
        before = dict(earlier.buckets)
        return Histogram(
            tuple((bound, count - before.get(bound, 0.0)) for bound, count in self.buckets),
            self.total - earlier.total,
            self.count - earlier.count,
        )

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
        # The node's Pods are IPv4 only: the IPv6 tables (labelled ip_family="IPv6") stay empty.
        if line.startswith(f"{RULES}{{") and 'table="' in line and "IPv6" not in line:
            table = line.split('table="', 1)[1].split('"', 1)[0]
            numbers[f"{RULES_KEY}{table}"] = float(line.rpartition(" ")[2])
    return numbers


@dataclass(frozen=True)
class Window:
    """kube-proxy over one test: the endpoint changes it programmed and the rewrites it did
    from before the test to after it, the 1-minute load average at the end, and the NAT
    rules then (they grow with the Services and endpoints in the cluster)."""

    test: str
    programming: Histogram | None
    sync: Histogram | None
    load: float
    nat_rules: float | None

    def line(self) -> str:
        """One line for the session's report (``-`` where kube-proxy could not be read)."""
        parts = [self.test]
        for name, histogram in (("programming", self.programming), ("sync", self.sync)):
            if histogram is None or not histogram.count:
                parts.append(f"{name} -")
                continue
            parts.append(
                f"{name} n={histogram.count:g} mean={histogram.mean():.2f}s "
                f"p90<={histogram.quantile(0.9):g}s max<={histogram.quantile(1.0):g}s "
                f">1s={histogram.above(1.0):g} >2s={histogram.above(2.0):g}"
            )
        rules = "-" if self.nat_rules is None else f"{self.nat_rules:g}"
        parts.append(f"load {self.load:.1f} nat rules {rules}")
        return "; ".join(parts)


def window(test: str, before: str, after: str, load: float) -> Window:
    """The :class:`Window` of ``test`` from kube-proxy's metrics text read ``before`` and
    ``after`` it."""
    histograms = []
    for name in (PROGRAMMING, SYNC):
        now = parse_histogram(after, name)
        histograms.append(None if now is None else now.minus(parse_histogram(before, name)))
    return Window(test, histograms[0], histograms[1], load, summary(after).get(f"{RULES_KEY}nat"))


def _added(a: Histogram | None, b: Histogram | None) -> Histogram | None:
    if a is None or b is None:
        return a or b
    counts = dict(a.buckets)
    for bound, count in b.buckets:
        counts[bound] = counts.get(bound, 0.0) + count
    return Histogram(tuple(sorted(counts.items())), a.total + b.total, a.count + b.count)


def by_file(windows: list[Window]) -> list[Window]:
    """``windows`` added up per test file (in the order the files ran); the load is the
    highest seen, the rules the last."""
    files: dict[str, Window] = {}
    for w in windows:
        name = w.test.split("::", 1)[0]
        seen = files.get(name)
        if seen is None:
            files[name] = Window(name, w.programming, w.sync, w.load, w.nat_rules)
            continue
        files[name] = Window(
            name,
            _added(seen.programming, w.programming),
            _added(seen.sync, w.sync),
            max(seen.load, w.load),
            w.nat_rules if w.nat_rules is not None else seen.nat_rules,
        )
    return list(files.values())


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
