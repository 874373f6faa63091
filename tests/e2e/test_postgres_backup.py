"""Backups on a real node against a real S3 server (SeaweedFS in the node's namespace).

A PostgresInstance with 50k rows (about 5 MB) is backed up by the in-cluster operator: the
Backup's Job runs pg_dump and the AWS CLI, the object is listed in the bucket through the S3
API; a new instance restored from it holds the rows; deleting a Backup deletes its object; a
BackupPlan on a one-minute schedule creates Backups and its retention prunes them from the
cluster and from the bucket; wrong credentials end in a clear terminal state with nothing stuck;
an instance deleted mid-backup fails the Backup with reason ``InstanceDeleted`` and a Warning
Event, or, when the Job finished first, leaves a complete object in the bucket.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.backups import (
    FILL_SQL,
    ROWS,
    apply,
    backup_phase,
    backup_spec,
    bucket_keys,
    condition,
    create_instance,
    credentials_secret,
    get_backup,
    jobs_in,
    key_of,
    psql,
    s3_endpoint,
)
from tests.e2e.support import TIMINGS, diagnostics, get_json, new_namespace, wait_for

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Filled:
    namespace: str
    instance: str


@pytest.fixture(scope="module")
def filled(cluster: LocalCluster, operator: str) -> Iterator[Filled]:
    """One Ready instance ``db`` holding ``ROWS`` rows in ``items``, and the S3 Secret."""
    namespace = new_namespace(cluster, "bk")
    credentials_secret(cluster, namespace)
    TIMINGS["backup_instance_apply_to_ready"] = create_instance(cluster, namespace, "db")
    psql(cluster, namespace, "db", "fill", FILL_SQL)
    yield Filled(namespace, "db")
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def take_backup(
    cluster: LocalCluster, filled: Filled, name: str, timeout: float = 180
) -> dict[str, Any]:
    """Create Backup ``name`` of ``filled`` and wait until it finished; return it."""
    ns = filled.namespace
    apply(
        cluster,
        {
            "apiVersion": "postgres.crpy.io/v1beta1",
            "kind": "Backup",
            "metadata": {"name": name, "namespace": ns},
            "spec": backup_spec(cluster, filled.instance),
        },
    )
    wait_for(
        lambda: backup_phase(cluster, ns, name) in TERMINAL,
        f"backup {ns}/{name} finished",
        timeout,
        lambda: diagnostics(cluster, ns, f"backup {name}"),
    )
    return get_backup(cluster, ns, name)


@pytest.fixture(scope="module")
def first_backup(cluster: LocalCluster, filled: Filled) -> dict[str, Any]:
    started = time.monotonic()
    backup = take_backup(cluster, filled, "first")
    TIMINGS["backup_50k_rows_create_to_succeeded"] = time.monotonic() - started
    return backup


def test_backup_uploads_the_dump_to_the_bucket(
    cluster: LocalCluster, filled: Filled, first_backup: dict[str, Any]
) -> None:
    ns = filled.namespace
    status = first_backup.get("status") or {}
    why = f"backup {ns}/first: {status}\n" + diagnostics(cluster, ns, "backup first")
    assert status.get("phase") == "Succeeded", why
    assert condition(first_backup, "Complete").get("status") == "True", why
    assert condition(first_backup, "Failed").get("status") == "False", why
    assert status.get("completionTime") and status.get("startTime"), why
    bucket = s3_endpoint(cluster).bucket
    key = key_of(status["location"], bucket)
    assert key == f"e2e/{ns}/db/first.dump", why
    objects = bucket_keys(cluster, f"e2e/{ns}/")
    assert objects.get(key, 0) > 100_000, f"bucket listing {objects}\n{why}"
    TIMINGS["backup_50k_rows_object_bytes"] = objects[key]
    events = cluster.kubectl(
        "get", "events", "-n", ns, "--field-selector", "reason=BackupSucceeded"
    )
    assert "first" in events, f"no BackupSucceeded event for backup first: {events}\n{why}"


def test_restore_from_the_backup_holds_the_rows(
    cluster: LocalCluster, filled: Filled, first_backup: dict[str, Any]
) -> None:
    ns = filled.namespace
    assert backup_phase(cluster, ns, "first") == "Succeeded", diagnostics(cluster, ns, "first")
    TIMINGS["restore_50k_rows_apply_to_ready"] = create_instance(
        cluster, ns, "restored", restore_from="first"
    )
    instance = get_json(cluster, "postgresinstance", "restored", "-n", ns)
    restore = (instance.get("status") or {}).get("restore") or {}
    assert restore.get("phase") == "Succeeded", f"{restore}\n{diagnostics(cluster, ns, 'restored')}"
    count = psql(cluster, ns, "restored", "count-restored", "SELECT count(*) FROM items")
    assert count.strip() == str(ROWS), f"restored instance {ns}/restored has {count!r} rows"
    digest = "SELECT md5(string_agg(body, ',' ORDER BY id)) FROM items"
    assert psql(cluster, ns, "restored", "sum-restored", digest) == psql(
        cluster, ns, "db", "sum-db", digest
    ), f"restored instance {ns}/restored differs from {ns}/db"
    cluster.kubectl("delete", "postgresinstance", "restored", "-n", ns, timeout=180)


def test_deleting_a_backup_deletes_its_object(cluster: LocalCluster, filled: Filled) -> None:
    ns = filled.namespace
    backup = take_backup(cluster, filled, "to-delete")
    bucket = s3_endpoint(cluster).bucket
    key = key_of(backup["status"]["location"], bucket)
    assert key in bucket_keys(cluster, key), diagnostics(cluster, ns, "backup to-delete")
    started = time.monotonic()
    cluster.kubectl("delete", "backup", "to-delete", "-n", ns, "--wait=false")
    wait_for(
        lambda: not get_backup(cluster, ns, "to-delete"),
        f"backup {ns}/to-delete gone",
        120,
        lambda: diagnostics(cluster, ns, "backup to-delete"),
    )
    TIMINGS["backup_delete_to_gone"] = time.monotonic() - started
    assert key not in bucket_keys(cluster, key), (
        f"object {key} of deleted backup {ns}/to-delete stayed in the bucket"
    )
    wait_for(
        lambda: not [j for j in jobs_in(cluster, ns) if j.startswith("to-delete")],
        f"the Jobs of backup {ns}/to-delete gone",
        60,
        lambda: diagnostics(cluster, ns, "backup to-delete"),
    )


def test_plan_creates_backups_and_retention_prunes_them_from_the_bucket(
    cluster: LocalCluster, filled: Filled
) -> None:
    """A one-minute schedule (cron's finest) keeping 1: the second Backup's success prunes
    the first from the cluster and from the bucket. Beside it, a plan with wrong bucket
    credentials says so (condition and Event) and its failed Backups do not pile up."""
    ns = filled.namespace
    credentials_secret(cluster, ns, "wrong-credentials", wrong=True)
    for name, secret in (("nightly", "s3-credentials"), ("denied", "wrong-credentials")):
        apply(
            cluster,
            {
                "apiVersion": "postgres.crpy.io/v1beta1",
                "kind": "BackupPlan",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "schedule": "* * * * *",
                    "retention": {"keepLast": 1},
                    "backupTemplate": {"spec": backup_spec(cluster, filled.instance, secret)},
                },
            },
        )
    seen: dict[str, str] = {}

    def plan_backups() -> dict[str, str]:
        items = get_json(
            cluster, "backups", "-n", ns, "-l", "postgres.crpy.io/backup-plan=nightly"
        )["items"]
        current = {
            b["metadata"]["name"]: (b.get("status") or {}).get("location", "") for b in items
        }
        seen.update({k: v for k, v in current.items() if v})
        return current

    def describe() -> str:
        return f"plan backups seen {seen}\n" + diagnostics(cluster, ns, "backupplan nightly")

    def two_created() -> bool:
        plan_backups()
        return len(seen) >= 2

    wait_for(two_created, f"backupplan {ns}/nightly created two Backups", 200, describe)
    first, second = sorted(seen)[:2]
    wait_for(
        lambda: first not in plan_backups() and backup_phase(cluster, ns, second) == "Succeeded",
        f"backupplan {ns}/nightly pruned {first} after {second} succeeded",
        150,
        describe,
    )
    bucket = s3_endpoint(cluster).bucket
    objects = bucket_keys(cluster, f"e2e/{ns}/db/nightly-")
    assert key_of(seen[second], bucket) in objects, f"{objects}\n{describe()}"
    assert key_of(seen[first], bucket) not in objects, (
        f"pruned backup {first} left its object in the bucket: {objects}"
    )
    plan = get_json(cluster, "backupplan", "nightly", "-n", ns)
    assert (plan.get("status") or {}).get("lastSuccessfulTime"), (
        f"backupplan {ns}/nightly: {plan.get('status')}"
    )
    assert condition(plan, "LastBackupSucceeded").get("status") == "True", (
        f"backupplan {ns}/nightly: {plan.get('status')}\n{describe()}"
    )

    def denied_plan() -> dict[str, Any]:
        return dict(get_json(cluster, "backupplan", "denied", "-n", ns))

    wait_for(
        lambda: condition(denied_plan(), "LastBackupSucceeded").get("reason") == "BackupFailed",
        f"backupplan {ns}/denied reporting its failed Backup",
        150,
        lambda: diagnostics(cluster, ns, "backupplan denied"),
    )
    message = condition(denied_plan(), "LastBackupSucceeded")["message"]
    assert "denied-" in message and "failed" in message, f"backupplan {ns}/denied: {message}"
    events = cluster.kubectl(
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        "reason=BackupFailed,involvedObject.kind=BackupPlan",
    )
    assert "denied" in events, f"no BackupFailed event on backupplan {ns}/denied: {events}"
    denied_jobs = [j for j in jobs_in(cluster, ns) if j.startswith("denied-2")]
    assert len(denied_jobs) <= 2, f"backupplan {ns}/denied: failed Backups pile up: {denied_jobs}"
    landed = bucket_keys(cluster, f"e2e/{ns}/db/denied-")
    assert not landed, f"backupplan {ns}/denied: a denied upload landed: {landed}"
    cluster.kubectl("delete", "backupplan", "nightly", "denied", "-n", ns)


def test_wrong_credentials_fail_the_backup_clearly(cluster: LocalCluster, filled: Filled) -> None:
    ns = filled.namespace
    credentials_secret(cluster, ns, "wrong-credentials", wrong=True)
    apply(
        cluster,
        {
            "apiVersion": "postgres.crpy.io/v1beta1",
            "kind": "Backup",
            "metadata": {"name": "refused", "namespace": ns},
            "spec": backup_spec(cluster, filled.instance, "wrong-credentials"),
        },
    )
    wait_for(
        lambda: backup_phase(cluster, ns, "refused") in TERMINAL,
        f"backup {ns}/refused finished",
        200,
        lambda: diagnostics(cluster, ns, "backup refused"),
    )
    backup = get_backup(cluster, ns, "refused")
    why = f"backup {ns}/refused: {backup.get('status')}\n" + diagnostics(cluster, ns, "refused")
    assert backup["status"]["phase"] == "Failed", why
    assert condition(backup, "Failed").get("status") == "True", why
    assert condition(backup, "Complete").get("status") == "False", why
    events = cluster.kubectl("get", "events", "-n", ns, "--field-selector", "reason=BackupFailed")
    assert "refused" in events, f"no BackupFailed event on backup {ns}/refused: {events}\n{why}"
    assert [j for j in jobs_in(cluster, ns) if j.startswith("refused")] == ["refused-backup"], why
    pods = get_json(cluster, "pods", "-n", ns, "-l", "postgres.crpy.io/backup=refused")["items"]
    assert 1 <= len(pods) <= 3, f"{len(pods)} Pods for one Backup (backoffLimit 2)\n{why}"
    assert not bucket_keys(cluster, f"e2e/{ns}/db/refused"), why
    # Deleting a failed Backup does not hang on its (absent) object.
    cluster.kubectl("delete", "backup", "refused", "-n", ns, timeout=120)


def test_instance_deleted_while_its_backup_runs(cluster: LocalCluster, operator: str) -> None:
    ns = new_namespace(cluster, "bkdel")
    credentials_secret(cluster, ns)
    create_instance(cluster, ns, "doomed")
    psql(cluster, ns, "doomed", "fill", FILL_SQL)
    apply(
        cluster,
        {
            "apiVersion": "postgres.crpy.io/v1beta1",
            "kind": "Backup",
            "metadata": {"name": "orphan", "namespace": ns},
            "spec": backup_spec(cluster, "doomed"),
        },
    )
    wait_for(
        lambda: "orphan-backup" in jobs_in(cluster, ns),
        f"backup {ns}/orphan's Job created",
        60,
        lambda: diagnostics(cluster, ns, "backup orphan"),
    )
    cluster.kubectl("delete", "postgresinstance", "doomed", "-n", ns, timeout=180)
    wait_for(
        lambda: backup_phase(cluster, ns, "orphan") in TERMINAL,
        f"backup {ns}/orphan finished after its instance was deleted",
        180,
        lambda: diagnostics(cluster, ns, "backup orphan"),
    )
    backup = get_backup(cluster, ns, "orphan")
    why = f"backup {ns}/orphan: {backup.get('status')}\n" + diagnostics(cluster, ns, "orphan")
    phase = backup["status"]["phase"]
    key = f"e2e/{ns}/doomed/orphan.dump"
    if phase == "Failed":
        # The operator saw the deletion before the Job finished: it says so and stops the Job.
        failed = condition(backup, "Failed")
        assert failed.get("status") == "True" and failed.get("reason") == "InstanceDeleted", why
        assert "PostgresInstance 'doomed'" in failed.get("message", ""), why
        assert condition(backup, "Complete").get("reason") == "InstanceDeleted", why
        assert backup["status"].get("completionTime"), why
        warning = _event_of_backup(cluster, ns, "orphan", "BackupFailed")
        assert warning.get("type") == "Warning", f"backup {ns}/orphan: event {warning}\n{why}"
        assert "PostgresInstance 'doomed'" in warning.get("message", ""), f"{warning}\n{why}"
        wait_for(
            lambda: "orphan-backup" not in jobs_in(cluster, ns),
            f"the Job of backup {ns}/orphan deleted after its instance was",
            60,
            lambda: why,
        )
        assert key not in bucket_keys(cluster, key), (
            f"backup {ns}/orphan failed but its object {key} is in the bucket\n{why}"
        )
    else:
        # The Job finished before the operator saw the deletion: the dump must be complete.
        assert phase == "Succeeded", why
        assert condition(backup, "Complete").get("status") == "True", why
        assert key_of(backup["status"]["location"], s3_endpoint(cluster).bucket) == key, why
        size = bucket_keys(cluster, key).get(key, 0)
        assert size > 100_000, f"backup {ns}/orphan succeeded, its object {key}: {size} B\n{why}"
        done = _event_of_backup(cluster, ns, "orphan", "BackupSucceeded")
        assert done.get("type") == "Normal", f"backup {ns}/orphan: event {done}\n{why}"
    print(f"\nbackup {ns}/orphan ended {phase}: {condition(backup, 'Failed')}")
    cluster.kubectl("delete", "backup", "orphan", "-n", ns, timeout=120)
    assert not get_backup(cluster, ns, "orphan"), why
    assert not bucket_keys(cluster, f"e2e/{ns}/"), f"objects left after deletion\n{why}"
    # The operator still serves: a new Backup is reconciled (its instance is gone).
    apply(
        cluster,
        {
            "apiVersion": "postgres.crpy.io/v1beta1",
            "kind": "Backup",
            "metadata": {"name": "after", "namespace": ns},
            "spec": backup_spec(cluster, "doomed"),
        },
    )
    wait_for(
        lambda: (
            condition(get_backup(cluster, ns, "after"), "Complete").get("reason")
            == "InstanceNotFound"
        ),
        f"backup {ns}/after reconciled (InstanceNotFound)",
        60,
        lambda: diagnostics(cluster, ns, "backup after"),
    )
    cluster.kubectl("delete", "namespace", ns, timeout=180)


def _event_of_backup(cluster: LocalCluster, ns: str, name: str, reason: str) -> dict[str, Any]:
    """The Event ``reason`` recorded on Backup ``name`` (events are written asynchronously,
    so it is waited for; the test fails without it)."""
    selector = f"involvedObject.kind=Backup,involvedObject.name={name},reason={reason}"
    found: list[dict[str, Any]] = []

    def recorded() -> bool:
        found[:] = get_json(cluster, "events", "-n", ns, "--field-selector", selector)["items"]
        return bool(found)

    wait_for(
        recorded,
        f"a {reason} event on backup {ns}/{name}",
        30,
        lambda: cluster.kubectl(
            "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
        ),
    )
    return dict(found[-1])
