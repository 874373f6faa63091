"""An application that writes through ``<name>-primary`` while the end-to-end tests break its
PostgreSQL, and what its log says afterwards.

:func:`app_pod` is a Pod in the operator's image (Python with psycopg) running
:data:`SCRIPT`, two threads:

- the **writer** commits one row per statement (``INSERT INTO <table> (id)``, autocommit; the
  table ``acked`` unless another is given, so two applications never share ids) through the
  primary Service, as an application would: on any error it drops the connection,
  reconnects (2 s connect timeout, TCP keepalives and a 5 s user timeout so a dead peer is
  noticed) and never reuses an id whose outcome it did not see. It prints ``ack <id> <time>``
  for each acknowledged commit and ``err <time> <message>`` for each failure;
- the **sampler** connects to every member directly (``<pod>.<headless>``) four times a second
  and prints ``sample <time> <writable members>``: the members that answer
  ``pg_is_in_recovery() = false`` in that round.

Times are ``time.time()`` of the Pod, the machine's one clock. :func:`parse` reads the log back;
:func:`write_gap` and :func:`double_primaries` are what the tests assert and record.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.pods import secret_env

SCRIPT = r"""
import os, sys, threading, time
import psycopg

lock = threading.Lock()
TABLE = os.environ["TABLE"]
def out(line):
    with lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

common = dict(user="postgres", password=os.environ["PGPASSWORD"], dbname="postgres",
              autocommit=True, keepalives=1, keepalives_idle=2, keepalives_interval=1,
              keepalives_count=2, tcp_user_timeout=5000, application_name="crpy-e2e-app")

def first_line(err):
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__

def writer():
    conn, next_id = None, 1
    while True:
        try:
            if conn is None:
                conn = psycopg.connect(host=os.environ["PRIMARY"], connect_timeout=2, **common)
                conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigint PRIMARY KEY)")
            conn.execute(f"INSERT INTO {TABLE} (id) VALUES (%s)", (next_id,))
            out(f"ack {next_id} {time.time():.3f}")
            next_id += 1
            time.sleep(0.02)
        except Exception as err:
            out(f"err {time.time():.3f} {first_line(err)}")
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass
            conn = None
            next_id += 1
            time.sleep(0.1)

def sampler():
    members = os.environ["MEMBERS"].split()
    while True:
        writable = []
        for member in members:
            try:
                with psycopg.connect(host=member, connect_timeout=1, **common) as conn:
                    if conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is False:
                        writable.append(member.split(".")[0])
            except Exception:
                pass
        out(f"sample {time.time():.3f} {','.join(writable)}")
        time.sleep(0.25)

threading.Thread(target=sampler, daemon=True).start()
writer()
"""


def app_pod(
    name: str,
    namespace: str,
    instance: str,
    members: int,
    image: str,
    *,
    node: str | None = None,
    primary: str | None = None,
    table: str = "acked",
) -> dict[str, Any]:
    """The application Pod for ``instance`` (its superuser Secret, ``members`` Pods sampled),
    on ``node`` if given, writing to ``primary`` (default the ``<instance>-primary``
    Service) into ``table``."""
    headless = f"{instance}-headless"
    placement = {"nodeSelector": {"kubernetes.io/hostname": node}} if node else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            **placement,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "app",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-u", "-c", SCRIPT],
                    "env": [
                        {
                            "name": "PRIMARY",
                            "value": primary or f"{instance}-primary.{namespace}.svc",
                        },
                        {"name": "TABLE", "value": table},
                        {
                            "name": "MEMBERS",
                            "value": " ".join(
                                f"{instance}-{i}.{headless}.{namespace}.svc" for i in range(members)
                            ),
                        },
                        secret_env("PGPASSWORD", f"{instance}-superuser", "password"),
                    ],
                }
            ],
        },
    }


def start_app(
    cluster: LocalCluster,
    namespace: str,
    instance: str,
    members: int,
    image: str,
    *,
    name: str = "app",
    node: str | None = None,
    primary: str | None = None,
    table: str = "acked",
) -> str:
    pod = app_pod(
        name, namespace, instance, members, image, node=node, primary=primary, table=table
    )
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pod))
    return name


@dataclass
class Log:
    """What the application printed."""

    acks: list[tuple[int, float]] = field(default_factory=list)
    errors: list[tuple[float, str]] = field(default_factory=list)
    samples: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)

    def acked_ids(self) -> set[int]:
        return {i for i, _ in self.acks}

    def acked_after(self, since: float) -> int:
        return sum(1 for _, t in self.acks if t > since)


def parse(text: str) -> Log:
    """The application's log (other lines, and partial ones, ignored)."""
    log = Log()
    for line in text.splitlines():
        parts = line.split(" ", 2)
        try:
            if parts[0] == "ack" and len(parts) == 3:
                log.acks.append((int(parts[1]), float(parts[2])))
            elif parts[0] == "err" and len(parts) >= 2:
                log.errors.append((float(parts[1]), parts[2] if len(parts) > 2 else ""))
            elif parts[0] == "sample" and len(parts) >= 2:
                members = tuple(m for m in (parts[2] if len(parts) > 2 else "").split(",") if m)
                log.samples.append((float(parts[1]), members))
        except ValueError:
            continue
    return log


def write_gap(log: Log, since: float, until: float | None = None) -> float:
    """The longest time without an acknowledgement from the last one before ``since`` to the
    last one before ``until``: how long writes stopped because of what happened at
    ``since``."""
    times = sorted(t for _, t in log.acks)
    before = [t for t in times if t <= since]
    after = [t for t in times if t > since and (until is None or t <= until)]
    points = ([before[-1]] if before else [since]) + after
    return max((b - a for a, b in itertools.pairwise(points)), default=0.0)


def double_primaries(log: Log) -> list[tuple[float, tuple[str, ...]]]:
    """Samples in which more than one member was writable."""
    return [(t, members) for t, members in log.samples if len(members) > 1]


def errors_between(log: Log, since: float, until: float) -> dict[str, int]:
    found: dict[str, int] = {}
    for t, message in log.errors:
        if since <= t <= until:
            found[message] = found.get(message, 0) + 1
    return found
