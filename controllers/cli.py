"""The operator's flags and the settings they make, with nothing heavy imported.

``python -m controllers --help`` and ``python -m controllers.dev --help`` (and any bad flag)
answer from here, before the runtime, the controllers or a control plane are loaded or
started. :mod:`controllers.app` turns the settings into a running manager.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field

KNOWN_CONTROLLERS: tuple[str, ...] = (
    "task",
    "postgres-instance",
    "postgres-user",
    "service-binding",
    "backup",
    "backup-plan",
)
"""Every controller the operator can run, by name (``controllers.app.CONTROLLERS`` builds
them; a test keeps the two in step)."""

ENABLED_BY_DEFAULT: tuple[str, ...] = KNOWN_CONTROLLERS


@dataclass(frozen=True)
class OperatorSettings:
    """What the command line decides (see ``python -m controllers --help``)."""

    kubeconfig: str | None = None
    context: str | None = None
    namespaces: tuple[str, ...] = ()
    leader_elect: bool = False
    leader_election_namespace: str | None = None
    leader_election_id: str = "controller-runtime-py-operator"
    shard_ring: str | None = None
    shard_slots: int = 16
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    metrics_bind_address: str | None = "127.0.0.1:8080"
    health_probe_bind_address: str | None = "127.0.0.1:8081"
    webhook_port: int = 0
    webhook_cert_dir: str = "/tmp/k8s-webhook-server/serving-certs"
    controllers: tuple[str, ...] = ENABLED_BY_DEFAULT
    max_concurrent_reconciles: int = 2
    concurrency: dict[str, int] = field(default_factory=dict)
    graceful_shutdown_timeout: float = 30.0
    read_your_writes: bool = True
    watch_timeout: int = 300
    log_level: str = "info"
    log_format: str = "text"


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return number


def _seconds(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {value}")
    return number


def _concurrency(value: str) -> tuple[str, int]:
    name, sep, count = value.partition("=")
    if not sep or name not in KNOWN_CONTROLLERS:
        raise argparse.ArgumentTypeError(
            f"expected CONTROLLER=N with CONTROLLER one of {', '.join(KNOWN_CONTROLLERS)}; "
            f"got {value!r}"
        )
    return name, _positive(count)


def parser(
    prog: str = "python -m controllers",
    description: str = "Run the operator: the Task and PostgreSQL controllers on one manager.",
) -> argparse.ArgumentParser:
    # No abbreviations: "--metrics-bind 1" must not silently mean --metrics-bind-address.
    p = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    cluster = p.add_argument_group("cluster")
    cluster.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: $KUBECONFIG, else in-cluster, else ~/.kube/config)",
    )
    cluster.add_argument("--context", help="kubeconfig context (default: the current one)")
    cluster.add_argument(
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch only this namespace (repeatable; default: all namespaces)",
    )
    election = p.add_argument_group("leader election")
    election.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="campaign for a Lease before reconciling (default: off; on in the Deployment)",
    )
    election.add_argument(
        "--leader-election-namespace",
        help="namespace of the Lease (default: the Pod's namespace in a cluster, else default)",
    )
    election.add_argument(
        "--leader-election-id",
        default="controller-runtime-py-operator",
        help="name of the Lease (default: %(default)s)",
    )
    election.add_argument(
        "--lease-duration", type=_seconds, default=15.0, help="seconds (default: %(default)s)"
    )
    election.add_argument(
        "--renew-deadline", type=_seconds, default=10.0, help="seconds (default: %(default)s)"
    )
    election.add_argument(
        "--retry-period", type=_seconds, default=2.0, help="seconds (default: %(default)s)"
    )
    sharding = p.add_argument_group("sharding (horizontal scale-out; see docs/scaling.md)")
    sharding.add_argument(
        "--shard-ring",
        metavar="NAME",
        help="run the Task controller sharded: join the ring NAME of replicas (one Lease per "
        "replica in the leader-election namespace, same timings) and reconcile only this "
        "replica's share of the Tasks; the other controllers stay as they are (leader-elected "
        "with --leader-elect). Default: no sharding",
    )
    sharding.add_argument(
        "--shard-slots",
        type=_positive,
        default=16,
        help="slots the hash space is cut into; the same on every replica (default: %(default)s)",
    )
    serving = p.add_argument_group("endpoints")
    serving.add_argument(
        "--metrics-bind-address",
        default="127.0.0.1:8080",
        help='address of /metrics; "0" turns it off (default: %(default)s; the Deployment '
        'uses ":8080")',
    )
    serving.add_argument(
        "--health-probe-bind-address",
        default="127.0.0.1:8081",
        help='address of /healthz and /readyz; "0" turns it off (default: %(default)s)',
    )
    serving.add_argument(
        "--webhook-port",
        type=int,
        default=0,
        help="serve the PostgreSQL API's admission and conversion webhooks on this port, on "
        "every replica (manifests/ use 9443); 0 serves none (default: %(default)s)",
    )
    serving.add_argument(
        "--webhook-cert-dir",
        default="/tmp/k8s-webhook-server/serving-certs",
        help="directory with the webhook's tls.crt and tls.key (and ca.crt), re-read when they "
        "change, e.g. a cert-manager Secret mounted there (default: %(default)s)",
    )
    work = p.add_argument_group("controllers")
    work.add_argument(
        "--controllers",
        default=",".join(ENABLED_BY_DEFAULT),
        help=f"comma-separated controllers to run, of {', '.join(KNOWN_CONTROLLERS)} "
        "(default: %(default)s)",
    )
    work.add_argument(
        "--max-concurrent-reconciles",
        type=_positive,
        default=2,
        help="workers per controller (default: %(default)s)",
    )
    work.add_argument(
        "--concurrency",
        type=_concurrency,
        action="append",
        default=[],
        metavar="CONTROLLER=N",
        help="workers for one controller, overriding --max-concurrent-reconciles (repeatable)",
    )
    work.add_argument(
        "--graceful-shutdown-timeout",
        type=_seconds,
        default=30.0,
        help="seconds in-flight reconciles may take to finish on SIGTERM (default: %(default)s)",
    )
    work.add_argument(
        "--no-read-your-writes",
        dest="read_your_writes",
        action="store_false",
        help="turn off the stale-cache guard (on by default)",
    )
    work.add_argument(
        "--watch-timeout",
        type=_positive,
        default=300,
        metavar="SECONDS",
        help="each watch ends after a random [N, 2N) seconds, and a watch silent for that "
        "long plus 10 s is presumed dead and re-opened (default: %(default)s, client-go's)",
    )
    logs = p.add_argument_group("logging")
    logs.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="(default: %(default)s)",
    )
    logs.add_argument(
        "--log-format", default="text", choices=["text", "json"], help="(default: %(default)s)"
    )
    return p


def settings_from(
    argv: Sequence[str] | None = None, *, p: argparse.ArgumentParser | None = None
) -> OperatorSettings:
    """The settings ``argv`` asks for; ``--help`` and bad flags exit (status 0 and 2) here,
    before anything starts. ``p``: the parser to use (default: :func:`parser`)."""
    p = p or parser()
    args = p.parse_args(argv)
    enabled = [c.strip() for c in args.controllers.split(",") if c.strip()]
    unknown = [c for c in enabled if c not in KNOWN_CONTROLLERS]
    if unknown or not enabled:
        p.error(
            f"--controllers: unknown {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(KNOWN_CONTROLLERS)}"
        )
    if (
        args.leader_elect or args.shard_ring
    ) and not args.lease_duration > args.renew_deadline > 1.2 * args.retry_period:
        p.error("need --lease-duration > --renew-deadline > 1.2 x --retry-period")
    return OperatorSettings(
        kubeconfig=args.kubeconfig,
        context=args.context,
        namespaces=tuple(args.namespaces or ()),
        leader_elect=args.leader_elect,
        leader_election_namespace=args.leader_election_namespace,
        leader_election_id=args.leader_election_id,
        shard_ring=args.shard_ring,
        shard_slots=args.shard_slots,
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        metrics_bind_address=args.metrics_bind_address,
        health_probe_bind_address=args.health_probe_bind_address,
        webhook_port=args.webhook_port,
        webhook_cert_dir=args.webhook_cert_dir,
        controllers=tuple(enabled),
        max_concurrent_reconciles=args.max_concurrent_reconciles,
        concurrency=dict(args.concurrency),
        graceful_shutdown_timeout=args.graceful_shutdown_timeout,
        read_your_writes=args.read_your_writes,
        watch_timeout=args.watch_timeout,
        log_level=args.log_level,
        log_format=args.log_format,
    )
