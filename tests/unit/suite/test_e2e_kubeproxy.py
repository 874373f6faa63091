"""Reading kube-proxy's lag from its metrics (tests/e2e/kubeproxy.py)."""

from __future__ import annotations

import math

from tests.e2e.kubeproxy import by_file, parse_histogram, summary, window

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
kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="filter"} 7
kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"} 61
kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv6",table="filter"} 3
kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv6",table="nat"} 5
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
    assert numbers["kube_proxy_iptables_rules_nat"] == 61  # IPv4: the IPv6 tables are empty
    assert numbers["kube_proxy_iptables_rules_filter"] == 7
    assert summary("") == {}


LATER = (
    METRICS.replace('le="0.25"} 2', 'le="0.25"} 3')
    .replace('le="0.5"} 5', 'le="0.5"} 6')
    .replace('le="1"} 8', 'le="1"} 9')
    .replace('le="5"} 9', 'le="5"} 12')
    .replace('le="+Inf"} 10', 'le="+Inf"} 13')
    .replace("seconds_sum 19.5", "seconds_sum 26.5")
    .replace("duration_seconds_count 10", "duration_seconds_count 13")
    .replace('IPv4",table="nat"} 61', 'IPv4",table="nat"} 75')
)
"""METRICS after three more endpoint changes: one under 0.25 s, two between 1 and 5 s."""


def test_a_window_holds_only_what_changed_during_the_test() -> None:
    found = window("tests/e2e/test_x.py::test_a", METRICS, LATER, load=3.5)
    assert found.programming is not None and found.sync is not None
    assert found.programming.count == 3 and found.programming.total == 7.0
    assert found.programming.buckets == ((0.25, 1), (0.5, 1), (1.0, 1), (5.0, 3), (math.inf, 3))
    assert (found.programming.above(1.0), found.sync.count) == (2, 0)
    assert found.nat_rules == 75
    line = found.line()
    assert line.startswith("tests/e2e/test_x.py::test_a; programming n=3 mean=2.33s")
    assert ">1s=2" in line and "sync -" in line and line.endswith("load 3.5 nat rules 75")


def test_a_window_without_metrics_says_so() -> None:
    found = window("t", "", "", load=0.5)
    assert found.programming is None and found.nat_rules is None
    assert found.line() == "t; programming -; sync -; load 0.5 nat rules -"
    # kube-proxy could be read only after the test: everything so far counts.
    first = window("t", "", METRICS, load=0.5)
    assert first.programming is not None and first.programming.count == 10


def test_windows_add_up_per_file() -> None:
    a = window("tests/e2e/test_x.py::test_a", METRICS, LATER, load=3.5)
    b = window("tests/e2e/test_x.py::test_b", "", METRICS, load=1.0)
    c = window("tests/e2e/test_y.py::test_c", "", "", load=9.0)
    x, y = by_file([a, b, c])
    assert x.test == "tests/e2e/test_x.py" and y.test == "tests/e2e/test_y.py"
    assert x.programming is not None and x.programming.count == 13
    assert x.programming.above(1.0) == 4 and x.load == 3.5 and x.nat_rules == 61
    assert y.programming is None and y.load == 9.0
