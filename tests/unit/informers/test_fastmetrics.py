"""The fast counters and histograms expose exactly what prometheus_client's would."""

from __future__ import annotations

import prometheus_client
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from informers import fastmetrics

BUCKETS = (1e-8, 0.005, 0.1, 1.0, 10.0, 1000.0)


def _exposition(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return sorted(line for line in text.splitlines() if "_created" not in line)


@given(
    counts=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5)), max_size=20),
    values=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.floats(0, 5000, allow_nan=False)), max_size=50
    ),
)
def test_same_exposition_as_prometheus_client(
    counts: list[tuple[str, int]], values: list[tuple[str, float]]
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast_c = fastmetrics.Counter("things_total", "Things.", ["kind"], registry=ours)
    slow_c = prometheus_client.Counter("things_total", "Things.", ["kind"], registry=theirs)
    fast_h = fastmetrics.Histogram("took_seconds", "Took.", ["kind"], buckets=BUCKETS,
                                   registry=ours)  # fmt: skip
    slow_h = prometheus_client.Histogram("took_seconds", "Took.", ["kind"], buckets=BUCKETS,
                                         registry=theirs)  # fmt: skip
    for kind, n in counts:
        fast_c.labels(kind).inc(n)
        slow_c.labels(kind).inc(n)
    for kind, v in values:
        fast_h.labels(kind=kind).observe(v)
        slow_h.labels(kind=kind).observe(v)
    assert _exposition(ours) == _exposition(theirs)


def test_bad_labels_and_negative_increments_are_refused() -> None:
    registry = CollectorRegistry()
    counter = fastmetrics.Counter("x_total", "X.", ["a", "b"], registry=registry)
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("1")
    with pytest.raises(ValueError, match="missing label"):
        counter.labels(a="1", c="2")
    child = counter.labels("1", "2")
    with pytest.raises(ValueError, match="only go up"):
        child.inc(-1)
    assert child.value == 0


@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.sampled_from(["set", "inc", "dec"]),
            st.floats(-1e6, 1e6, allow_nan=False),
        ),
        max_size=30,
    )
)
def test_gauges_expose_what_prometheus_client_gauges_do(ops: list[tuple[str, str, float]]) -> None:
    ours, theirs = fastmetrics.Registry(), CollectorRegistry()
    fast = fastmetrics.Gauge("level", "Level.", ["kind"], registry=ours)
    slow = prometheus_client.Gauge("level", "Level.", ["kind"], registry=theirs)
    for kind, op, value in ops:
        getattr(fast.labels(kind), op)(value)
        getattr(slow.labels(kind), op)(value)
    fast.labels("fn").set_function(lambda: 7.5)
    slow.labels("fn").set_function(lambda: 7.5)
    assert _exposition(ours) == _exposition(theirs)  # type: ignore[arg-type]
    for kind in ("a", "b", "fn"):
        labels = {"kind": kind}
        assert ours.get_sample_value("level", labels) == theirs.get_sample_value("level", labels)


def test_the_registry_reads_samples_and_refuses_a_name_twice() -> None:
    registry = fastmetrics.Registry()
    counter = fastmetrics.Counter("hits_total", "Hits.", ["code"], registry=registry)
    gauge = fastmetrics.Gauge("open", "Open.", ["code"], registry=registry)
    counter.labels("200").inc(3)
    gauge.labels("200").set(2)
    assert registry.get_sample_value("hits_total", {"code": "200"}) == 3.0
    assert registry.get_sample_value("open", {"code": "200"}) == 2.0
    assert registry.get_sample_value("open", {"code": "500"}) is None
    with pytest.raises(ValueError, match="Duplicated"):
        fastmetrics.Gauge("open", "Open again.", ["code"], registry=registry)
    gauge.remove("200")
    assert registry.get_sample_value("open", {"code": "200"}) is None
    gauge.remove("200")  # nothing to remove: no error
    registry.unregister(counter)
    assert registry.get_sample_value("hits_total", {"code": "200"}) is None
    fastmetrics.Counter("hits_total", "Hits.", ["code"], registry=registry)  # the name is free


def test_a_removed_series_is_no_longer_exported() -> None:
    registry = CollectorRegistry()
    counter = fastmetrics.Counter("x_total", "X.", ["a"], registry=registry)
    histogram = fastmetrics.Histogram("y_seconds", "Y.", ["a"], buckets=BUCKETS, registry=registry)
    for family in (counter, histogram):
        family.labels("gone")
        family.labels("kept")
        family.remove("gone")
        family.remove("never there")  # nothing to remove: no error
    exported = {s.labels.get("a") for f in registry.collect() for s in f.samples}
    assert exported == {"kept"}
