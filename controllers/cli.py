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

WEBHOOK_CERTIFICATES = ("cert-dir", "self-managed")
"""Where the webhook server's certificate comes from (``--webhook-certificates``)."""
WEBHOOK_SECRET = "crpy-operator-webhook-certs"
WEBHOOK_SERVICES: tuple[str, ...] = ("crpy-operator-webhook", "crpy-operator-conversion")
WEBHOOK_CONFIGURATION = "crpy-operator"
CONVERSION_CRDS: tuple[str, ...] = ("postgresinstances.postgres.crpy.io",)
"""The defaults of the webhook flags: the names ``manifests/`` gives these objects (and
``controllers/permissions.py`` grants access to, by name)."""


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
    webhook_certificates: str = "cert-dir"
    webhook_namespace: str | None = None
    webhook_secret: str = WEBHOOK_SECRET
    webhook_services: tuple[str, ...] = WEBHOOK_SERVICES
    webhook_extra_hosts: tuple[str, ...] = ()
    webhook_configuration: str = WEBHOOK_CONFIGURATION
    webhook_conversion_crds: tuple[str, ...] = CONVERSION_CRDS
    webhook_handler_timeout: float = 4.0
    webhook_shutdown_delay: float = 5.0
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


def _seconds_or_zero(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {value}")
    return number


def _names(value: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in value.split(",") if name.strip())


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
    webhooks = p.add_argument_group(
        "webhooks (with --webhook-port; docs/deploy.md, 'Webhook certificates')"
    )
    webhooks.add_argument(
        "--webhook-certificates",
        choices=WEBHOOK_CERTIFICATES,
        default="cert-dir",
        help="where the serving certificate comes from: cert-dir reads --webhook-cert-dir "
        "(e.g. a cert-manager Certificate's Secret mounted there); self-managed keeps a CA and "
        "the certificate in the Secret --webhook-secret, created and rotated by the leader, "
        "and writes the CA into the webhook configurations and the CRDs' conversion "
        "(default: %(default)s; manifests/ use self-managed)",
    )
    webhooks.add_argument(
        "--webhook-cert-dir",
        default="/tmp/k8s-webhook-server/serving-certs",
        help="cert-dir: directory with the webhook's tls.crt and tls.key (and ca.crt), re-read "
        "when they change (default: %(default)s)",
    )
    webhooks.add_argument(
        "--webhook-namespace",
        metavar="NS",
        help="namespace of the webhook Services and of the certificates' Secret (default: the "
        "Pod's namespace in a cluster, else default)",
    )
    webhooks.add_argument(
        "--webhook-secret",
        default=WEBHOOK_SECRET,
        metavar="NAME",
        help="self-managed: the Secret holding the CA and the serving certificate "
        "(default: %(default)s)",
    )
    webhooks.add_argument(
        "--webhook-services",
        type=_names,
        default=",".join(WEBHOOK_SERVICES),
        metavar="NAME,...",
        help="the Services the API server calls the webhooks through: the certificate is made "
        "for (self-managed) and checked against (readiness) <name>.<namespace>.svc of the "
        "first; the others are added to a self-managed certificate (default: %(default)s)",
    )
    webhooks.add_argument(
        "--webhook-extra-hosts",
        type=_names,
        default="",
        metavar="HOST,...",
        help="self-managed: more names or IP addresses for the certificate, e.g. 127.0.0.1 "
        "when the API server calls a process outside the cluster by URL (default: none)",
    )
    webhooks.add_argument(
        "--webhook-configuration",
        default=WEBHOOK_CONFIGURATION,
        metavar="NAME",
        help="the Validating- and MutatingWebhookConfiguration of these webhooks: readiness "
        "requires their caBundle to trust the certificate; self-managed writes the CA there "
        "(default: %(default)s; empty: none)",
    )
    webhooks.add_argument(
        "--webhook-conversion-crds",
        type=_names,
        default=",".join(CONVERSION_CRDS),
        metavar="CRD,...",
        help="CRDs whose conversion webhook is this server: as --webhook-configuration, for "
        "their spec.conversion.webhook.clientConfig.caBundle (default: %(default)s)",
    )
    webhooks.add_argument(
        "--webhook-handler-timeout",
        type=_seconds,
        default=4.0,
        metavar="SECONDS",
        help="longest a review may take before it is answered with a 500 and its reason; "
        "keep it under the configurations' timeoutSeconds (5 in manifests/) so the reason "
        "reaches the API server (default: %(default)s)",
    )
    webhooks.add_argument(
        "--webhook-shutdown-delay",
        type=_seconds_or_zero,
        default=5.0,
        metavar="SECONDS",
        help="after SIGTERM, keep answering reviews this long (not ready, every answer "
        "'Connection: close') before the port closes, while the Service's endpoints and "
        "kube-proxy stop sending new connections here (default: %(default)s)",
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
    if args.webhook_port and not _as_names(args.webhook_services):
        p.error("--webhook-services: name at least the Service the API server calls")
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
        webhook_certificates=args.webhook_certificates,
        webhook_namespace=args.webhook_namespace,
        webhook_secret=args.webhook_secret,
        webhook_services=_as_names(args.webhook_services),
        webhook_extra_hosts=_as_names(args.webhook_extra_hosts),
        webhook_configuration=args.webhook_configuration,
        webhook_conversion_crds=_as_names(args.webhook_conversion_crds),
        webhook_handler_timeout=args.webhook_handler_timeout,
        webhook_shutdown_delay=args.webhook_shutdown_delay,
        controllers=tuple(enabled),
        max_concurrent_reconciles=args.max_concurrent_reconciles,
        concurrency=dict(args.concurrency),
        graceful_shutdown_timeout=args.graceful_shutdown_timeout,
        read_your_writes=args.read_your_writes,
        watch_timeout=args.watch_timeout,
        log_level=args.log_level,
        log_format=args.log_format,
    )


def _as_names(value: str | tuple[str, ...]) -> tuple[str, ...]:
    # argparse applies ``type`` to a string default too, but not to a default that is a
    # tuple already: accept both.
    return _names(value) if isinstance(value, str) else tuple(value)
