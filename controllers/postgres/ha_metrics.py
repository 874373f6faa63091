"""Prometheus metrics of in-cluster PostgresInstances, as the high-availability controller
last observed them (:mod:`controllers.postgres.ha`), in the runtime's registry.

Every series carries ``namespace`` and ``instance``; per-member series also ``pod``. Values
are what the last observation saw (the leader observes each replicated instance every second,
a lone one every few seconds); an instance that is deleted, or whose leader lost the lease,
has no series. Followers export none.

========================================================= =========================================
``crpy_postgres_member_up{pod}``                          1 when the member's agent answered
``crpy_postgres_member_role{pod, role}``                  1 for the role it reports (primary,
                                                          standby, fenced, starting)
``crpy_postgres_replication_lag_bytes{pod}``              WAL the primary wrote that the standby
                                                          has not replayed (from the primary's
                                                          ``pg_stat_replication``)
``crpy_postgres_replication_lag_seconds{pod}``            its ``replay_lag`` (0 when caught up)
``crpy_postgres_primary_available``                       1 while a healthy primary serves
``crpy_postgres_ha_phase{phase}``                         1 for the failover machine's phase
``crpy_postgres_failovers_total``                         failovers completed (status.failovers)
``crpy_postgres_switchovers_total``                       switchovers completed
``crpy_postgres_last_transition_duration_seconds``        the last failover's or switchover's
                                                          duration
``crpy_postgres_last_backup_success_timestamp_seconds``   completion of the newest Succeeded
                                                          Backup of the instance
``crpy_postgres_seconds_since_last_backup``               now minus that (or minus the
                                                          instance's creation without any)
``crpy_postgres_backup_interval_seconds``                 the shortest interval between two runs
                                                          of the BackupPlans of the instance
========================================================= =========================================
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller_runtime.metrics import REGISTRY

ROLES = ("primary", "standby", "fenced", "starting")
PHASES = ("Bootstrap", "Healthy", "Fencing", "Promoting")


@dataclass(frozen=True)
class InstanceSample:
    """One instance as last observed."""

    up: Mapping[str, bool] = field(default_factory=dict)
    roles: Mapping[str, str] = field(default_factory=dict)
    lag_bytes: Mapping[str, int] = field(default_factory=dict)
    lag_seconds: Mapping[str, float] = field(default_factory=dict)
    primary_available: bool = False
    phase: str = "Bootstrap"
    failovers: int = 0
    switchovers: int = 0
    last_transition_seconds: float | None = None
    last_backup: float | None = None
    seconds_since_backup: float | None = None
    backup_interval: float | None = None


class PostgresCollector(Collector):
    """The samples of every instance, exported when the registry is collected."""

    def __init__(self) -> None:
        self._samples: dict[tuple[str, str], InstanceSample] = {}
        self._lock = threading.Lock()

    def update(self, namespace: str, name: str, sample: InstanceSample) -> None:
        with self._lock:
            self._samples[(namespace, name)] = sample

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._samples.pop((namespace, name), None)

    def clear(self) -> None:
        with self._lock:
            self._samples.clear()

    def sample(self, namespace: str, name: str) -> InstanceSample | None:
        with self._lock:
            return self._samples.get((namespace, name))

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            samples = dict(self._samples)
        labels = ["namespace", "instance"]
        up = GaugeMetricFamily(
            "crpy_postgres_member_up", "1 when the member's agent answered", labels=[*labels, "pod"]
        )
        role = GaugeMetricFamily(
            "crpy_postgres_member_role",
            "1 for the role the member reports",
            labels=[*labels, "pod", "role"],
        )
        lag_bytes = GaugeMetricFamily(
            "crpy_postgres_replication_lag_bytes",
            "WAL written by the primary and not replayed by the standby",
            labels=[*labels, "pod"],
        )
        lag_seconds = GaugeMetricFamily(
            "crpy_postgres_replication_lag_seconds",
            "The standby's replay lag as the primary measures it",
            labels=[*labels, "pod"],
        )
        available = GaugeMetricFamily(
            "crpy_postgres_primary_available", "1 while a healthy primary serves", labels=labels
        )
        phase = GaugeMetricFamily(
            "crpy_postgres_ha_phase",
            "1 for the failover machine's phase",
            labels=[*labels, "phase"],
        )
        failovers = CounterMetricFamily(
            "crpy_postgres_failovers", "Failovers completed", labels=labels
        )
        switchovers = CounterMetricFamily(
            "crpy_postgres_switchovers", "Switchovers completed", labels=labels
        )
        transition = GaugeMetricFamily(
            "crpy_postgres_last_transition_duration_seconds",
            "Duration of the last failover or switchover",
            labels=labels,
        )
        last_backup = GaugeMetricFamily(
            "crpy_postgres_last_backup_success_timestamp_seconds",
            "Completion time of the newest successful Backup",
            labels=labels,
        )
        since_backup = GaugeMetricFamily(
            "crpy_postgres_seconds_since_last_backup",
            "Seconds since the newest successful Backup (since creation without any)",
            labels=labels,
        )
        interval = GaugeMetricFamily(
            "crpy_postgres_backup_interval_seconds",
            "Shortest interval between two runs of the instance's BackupPlans",
            labels=labels,
        )
        for (namespace, name), s in sorted(samples.items()):
            key = [namespace, name]
            for pod, answered in sorted(s.up.items()):
                up.add_metric([*key, pod], 1.0 if answered else 0.0)
            for pod, reported in sorted(s.roles.items()):
                for r in ROLES:
                    role.add_metric([*key, pod, r], 1.0 if reported == r else 0.0)
            for pod, value in sorted(s.lag_bytes.items()):
                lag_bytes.add_metric([*key, pod], float(value))
            for pod, seconds in sorted(s.lag_seconds.items()):
                lag_seconds.add_metric([*key, pod], seconds)
            available.add_metric(key, 1.0 if s.primary_available else 0.0)
            for p in PHASES:
                phase.add_metric([*key, p], 1.0 if s.phase == p else 0.0)
            failovers.add_metric(key, float(s.failovers))
            switchovers.add_metric(key, float(s.switchovers))
            if s.last_transition_seconds is not None:
                transition.add_metric(key, s.last_transition_seconds)
            if s.last_backup is not None:
                last_backup.add_metric(key, s.last_backup)
            if s.seconds_since_backup is not None:
                since_backup.add_metric(key, s.seconds_since_backup)
            if s.backup_interval is not None:
                interval.add_metric(key, s.backup_interval)
        yield from (up, role, lag_bytes, lag_seconds, available, phase, failovers, switchovers)
        yield from (transition, last_backup, since_backup, interval)


POSTGRES_METRICS = PostgresCollector()
REGISTRY.register(POSTGRES_METRICS)
