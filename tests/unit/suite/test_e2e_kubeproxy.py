"""Reading kube-proxy's lag from its metrics (tests/e2e/kubeproxy.py)."""

from __future__ import annotations

import math

from tests.e2e.kubeproxy import parse_histogram, summary

METRICS = """\
# HELP kubeproxy_network_programming_duration_seconds [ALPHA] In Cluster Network Programming
# TYPE kubeproxy_network_programming_duration_seconds histogram
kubeproxy_network_programming_duration_seconds_bucket{le="0.25"} 2
kubeproxy_network_programming_duration_seconds_bucket{le="0.5"} 5
kubeproxy_network_programming_duration_seconds_bucket{le="1"} 8
kubeproxy_network_programming_duration_seconds_bucket{le="5"} 9
kubeproxy_network_programming_duration_seconds_bucket{le="+Inf"} 10
kubeproxy_network_programming_duration_seconds_sum 19.5
kubeproxy_network_programming_duration_seconds_count 10
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.001"} 0
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.512"} 38
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="1.024"} 40
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="+Inf"} 40
kubeproxy_sync_proxy_rules_duration_seconds_sum 8
kubeproxy_sync_proxy_rules_duration_seconds_count 40
kubeproxy_sync_proxy_rules_iptables_total{table="filter"} 7
kubeproxy_sync_proxy_rules_iptables_total{table="nat"} 61
"""


def test_a_histogram_is_read_with_its_buckets_sum_and_count() -> None:
    histogram = parse_histogram(METRICS, "kubeproxy_network_programming_duration_seconds")
    assert histogram is not None
    assert histogram.buckets == ((0.25, 2), (0.5, 5), (1.0, 8), (5.0, 9), (math.inf, 10))
    assert (histogram.count, histogram.mean()) == (10, 1.95)
    assert (histogram.quantile(0.5), histogram.quantile(0.9), histogram.quantile(1)) == (
        0.5,
        5.0,
        math.inf,
    )
    assert (histogram.above(1.0), histogram.above(5.0)) == (2, 1)
    assert parse_histogram(METRICS, "kubeproxy_absent_seconds") is None


def test_the_summary_names_both_histograms_and_the_rules() -> None:
    numbers = summary(METRICS)
    assert numbers["kube_proxy_programming_count"] == 10
    assert numbers["kube_proxy_programming_p90_le_s"] == 5.0
    assert numbers["kube_proxy_programming_over_1s"] == 2
    assert numbers["kube_proxy_sync_mean_s"] == 0.2
    # No bound at 1 s: counted from 0.512 s, the largest bound below it (an upper estimate).
    assert numbers["kube_proxy_sync_over_1s"] == 2
    assert numbers["kube_proxy_iptables_rules_nat"] == 61
    assert summary("") == {}
