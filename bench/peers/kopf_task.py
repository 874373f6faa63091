"""The kopf peer of the benchmark: the Task controller as a kopf operator.

    KUBECONFIG=FILE BENCH_MODE=normal python -m kopf run --standalone --quiet \\
        --namespace NS bench/peers/kopf_task.py

It derives the status with the very function the real controller uses
(:func:`controllers.task.derive_status`) and writes it through kopf's ``patch`` (kopf sends it
to the status subresource as a merge patch) when it differs from the object's status.

Why ``@kopf.on.event`` and not ``on.create``/``on.update``/``on.resume``: the change-detecting
handlers keep a diff base in an annotation (``kopf.zalando.org/last-handled-configuration``),
i.e. one more PATCH of the object per handled change, and one more watch event back. The event
handler needs no persisted state and writes nothing but the status: the same writes our
controller and the Go peer make. It runs on every watch event of the object, including the echo
of its own status write, where it finds nothing to change (kopf's price per event).

Settings: posting of k8s Events off (the other two post none), CRD scanning off, uvloop as the
CLI installs it when present; everything else is kopf's defaults, in particular no
``worker_limit``: one worker task per object, all at once (at 10k objects that is up to 10k
PATCHes in flight, and the API server answers some with 504; kopf retries them). A worker limit
is no cure: an object's worker stays for ``idle_timeout`` (5 s) after its last event, so a
limit of W handles at most W objects per 5 s (32 gave 6 objects/s). Environment:
``BENCH_MODE`` (``normal`` or ``write-heavy``), ``BENCH_STAMP``, ``BENCH_ROUNDS`` (see
:mod:`bench.runners.stamp`).
"""

from __future__ import annotations

import os
from typing import Any

import kopf

from bench.runners.stamp import stamped
from controllers.task import derive_status, utcnow

MODE = os.environ.get("BENCH_MODE", "normal")
STAMP = os.environ.get("BENCH_STAMP", "")
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "1"))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.enabled = False
    settings.scanning.disabled = True


@kopf.on.event("tasks.crpy.io", "v1", "tasks")
async def reconcile(type: str, body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    if type == "DELETED":
        return
    task: dict[str, Any] = {
        "metadata": dict(body.metadata),
        "spec": dict(body.spec),
        "status": dict(body.status),
    }
    now = utcnow()
    derived, _wake = derive_status(task, now)
    current = task["status"]
    if MODE == "write-heavy":
        status = stamped(
            derived,
            current,
            stamp=STAMP,
            rounds=ROUNDS,
            generation=task["metadata"].get("generation"),
            now=now,
        )
        if status is not None:
            patch["status"] = status
    elif derived != current:
        patch["status"] = derived
