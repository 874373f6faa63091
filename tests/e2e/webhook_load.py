"""Admission load for the webhook tests: PostgresInstance creates at a steady rate through the
API server, each one counted (admitted, or refused with its message), and the API server's own
webhook metrics, to show that the creates went through the operator's webhooks and that none
of those calls failed.

The creates are server-side dry runs (``?dryRun=All``): the API server runs them through
admission exactly as a real create (mutating webhooks, schema and CEL, validating webhooks;
the configurations declare ``sideEffects: None``), then stores nothing, so thousands of them
leave no instance for the operator to run. The client never retries (``max_retries=0``): a
refusal is counted once, as a user would see it.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from controller_runtime.envtest.node.cluster import LocalCluster
from kubeclient.errors import ApiError
from kubeclient.transport import Transport

VALIDATING = "vpostgresinstance.postgres.crpy.io"
MUTATING = "mpostgresinstance.postgres.crpy.io"


@dataclass
class Load:
    """What a run of creates gave."""

    rate: float
    sent: int = 0
    admitted: int = 0
    refused: list[tuple[float, int, str]] = field(default_factory=list)
    """(seconds since the start, HTTP status, message) of each refused create."""
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def achieved_rate(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0

    def latency(self, quantile: float) -> float:
        if len(self.latencies) < 2:
            return self.latencies[0] if self.latencies else 0.0
        return statistics.quantiles(self.latencies, n=100)[round(quantile * 100) - 1]

    def summary(self) -> str:
        return (
            f"{self.sent} creates in {self.seconds:.1f}s ({self.achieved_rate:.1f}/s), "
            f"{self.admitted} admitted, {len(self.refused)} refused; latency p50 "
            f"{self.latency(0.5) * 1000:.0f} ms, p99 {self.latency(0.99) * 1000:.0f} ms"
        )


def instance(namespace: str) -> dict[str, Any]:
    """A valid in-cluster PostgresInstance (version 15 is enabled by the tests' policy)."""
    return {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": f"load-{uuid.uuid4().hex[:10]}", "namespace": namespace},
        "spec": {"version": "15", "replicas": 1, "storage": {"size": "1Gi"}},
    }


async def create_at_rate(
    transport: Transport, namespace: str, stop: asyncio.Event, rate: float = 20.0
) -> Load:
    """Start a dry-run create every ``1/rate`` seconds (each on its own: a slow answer does
    not delay the next) until ``stop`` is set; then wait for the answers."""
    load = Load(rate)
    path = f"/apis/postgres.crpy.io/v1beta1/namespaces/{namespace}/postgresinstances"
    loop = asyncio.get_running_loop()
    started = loop.time()
    pending: set[asyncio.Task[None]] = set()

    async def create() -> None:
        sent_at = loop.time()
        try:
            await transport.request(
                "POST",
                path,
                params={"dryRun": "All"},
                body=instance(namespace),
                max_retries=0,
                timeout=30,
            )
        except ApiError as err:
            load.refused.append((sent_at - started, err.status, err.message))
        except Exception as err:  # the API server itself unreachable: count it too
            load.refused.append((sent_at - started, 0, f"{type(err).__name__}: {err}"))
        else:
            load.admitted += 1
            load.latencies.append(loop.time() - sent_at)

    due = started
    while not stop.is_set():
        task = asyncio.create_task(create())
        pending.add(task)
        task.add_done_callback(pending.discard)
        load.sent += 1
        due += 1 / rate
        # The schedule of the load, not a synchronisation: the next create is due then.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, due - loop.time())):
                await stop.wait()
    load.seconds = loop.time() - started
    if pending:
        await asyncio.gather(*pending)
    return load


async def read_at_rate(
    transport: Transport, path: str, stop: asyncio.Event, rate: float = 10.0
) -> Load:
    """GET ``path`` every ``1/rate`` seconds until ``stop`` (each on its own, never retried):
    a list of v1alpha1 PostgresInstances is converted by the operator's webhook."""
    load = Load(rate)
    loop = asyncio.get_running_loop()
    started = loop.time()
    pending: set[asyncio.Task[None]] = set()

    async def read() -> None:
        sent_at = loop.time()
        try:
            await transport.request("GET", path, max_retries=0, timeout=60)
        except ApiError as err:
            load.refused.append((sent_at - started, err.status, err.message))
        except Exception as err:
            load.refused.append((sent_at - started, 0, f"{type(err).__name__}: {err}"))
        else:
            load.admitted += 1
            load.latencies.append(loop.time() - sent_at)

    due = started
    while not stop.is_set():
        task = asyncio.create_task(read())
        pending.add(task)
        task.add_done_callback(pending.discard)
        load.sent += 1
        due += 1 / rate
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, due - loop.time())):
                await stop.wait()
    load.seconds = loop.time() - started
    if pending:
        await asyncio.gather(*pending)
    return load


@dataclass(frozen=True)
class WebhookCalls:
    """The API server's counters for one webhook (``apiserver_admission_webhook_*``)."""

    calls: float
    """Admission calls made to it (``admission_duration_seconds`` count)."""
    rejected_calling: float
    """Calls refused because the webhook could not be called (``rejection_count`` with
    ``error_type="calling_webhook_error"``, or ``apiserver_internal_error``)."""
    failed_open: float
    """Calls that failed and were admitted anyway (``failurePolicy: Ignore``;
    ``fail_open_count``)."""

    def __sub__(self, other: WebhookCalls) -> WebhookCalls:
        return WebhookCalls(
            self.calls - other.calls,
            self.rejected_calling - other.rejected_calling,
            self.failed_open - other.failed_open,
        )


def webhook_calls(cluster: LocalCluster, name: str) -> WebhookCalls:
    text = cluster.kubectl("get", "--raw", "/metrics")
    return parse_webhook_calls(text, name)


def parse_webhook_calls(text: str, name: str) -> WebhookCalls:
    calls = rejected = failed_open = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels: Mapping[str, str] = sample.labels
            if labels.get("name") != name:
                continue
            if sample.name == "apiserver_admission_webhook_admission_duration_seconds_count":
                calls += sample.value
            elif sample.name in (
                "apiserver_admission_webhook_rejection_count_total",
                "apiserver_admission_webhook_rejection_count",
            ):
                if labels.get("error_type") in (
                    "calling_webhook_error",
                    "apiserver_internal_error",
                ):
                    rejected += sample.value
            elif sample.name in (
                "apiserver_admission_webhook_fail_open_count_total",
                "apiserver_admission_webhook_fail_open_count",
            ):
                failed_open += sample.value
    return WebhookCalls(calls, rejected, failed_open)
