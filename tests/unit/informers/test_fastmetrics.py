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
