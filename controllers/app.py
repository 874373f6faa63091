"""Wiring the operator: settings → manager → controllers → run."""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable

from controller_runtime import (
    CacheSyncTimeoutError,
    ConfigError,
    ControllerOptions,
    LeaderElectionConfig,
    LeaderElectionLostError,
    Manager,
    ManagerOptions,
    ServerUnreachableError,
    UnknownKindError,
    load_config,
    run_until_signalled,
)
from controller_runtime.config import SERVICE_ACCOUNT_DIR, ClusterConfig
from controllers.cli import OperatorSettings
from controllers.task import setup_sharded_task_controller, setup_task_controller

log = logging.getLogger("controllers")

Setup = Callable[[Manager, ControllerOptions], Awaitable[object]]


async def _task(manager: Manager, options: ControllerOptions) -> object:
    # The builder hands the controller to the manager (manager.add), or to the shard ring.
    if manager.shard_ring is not None:
        return await setup_sharded_task_controller(manager, manager.client, options=options)
    return await setup_task_controller(manager, manager.client, options=options)


def _postgres(setup_name: str) -> Setup:
    """A PostgreSQL controller's setup, imported only when that controller is chosen: the
    PostgreSQL driver (psycopg) and the controllers cost ~13 MiB and a third of the start-up
    imports, which an operator running only the Task controller does not pay."""

    async def setup(manager: Manager, options: ControllerOptions) -> object:
        from controllers import postgres  # noqa: PLC0415

        build: Callable[..., Awaitable[object]] = getattr(postgres, setup_name)
        return await build(manager, manager.client, options=options)

    return setup


CONTROLLERS: dict[str, Setup] = {
    "task": _task,
    # The PostgreSQL data service: one single-purpose controller per resource.
    "postgres-instance": _postgres("setup_instance_controller"),
    "postgres-user": _postgres("setup_user_controller"),
    "service-binding": _postgres("setup_binding_controller"),
    "backup": _postgres("setup_backup_controller"),
    "backup-plan": _postgres("setup_plan_controller"),
}
"""Every controller the operator can run, by name (the names, for the flags, are
``controllers.cli.KNOWN_CONTROLLERS``)."""


def busy_port_message(settings: OperatorSettings, *, metrics_started: bool) -> str:
    """One line for an endpoint whose port is taken: which one, and the flag that moves it.
    The manager binds metrics first, so if metrics did not start (and are on), it was them."""
    metrics_on = settings.metrics_bind_address not in (None, "", "0")
    if metrics_on and not metrics_started:
        what, address, flag = "metrics", settings.metrics_bind_address, "--metrics-bind-address"
    else:
        what, address, flag = (
            "health probes",
            settings.health_probe_bind_address,
            "--health-probe-bind-address",
        )
    return (
        f"cannot serve {what} on {address}: the address is already in use (another operator "
        f"running?); choose a free one with {flag}=HOST:PORT, or {flag}=0 to turn it off"
    )


def _lease_namespace(settings: OperatorSettings, config: ClusterConfig) -> str:
    if settings.leader_election_namespace:
        return settings.leader_election_namespace
    namespace_file = SERVICE_ACCOUNT_DIR / "namespace"
    if config.source == "in-cluster" and namespace_file.is_file():
        return namespace_file.read_text().strip()
    return "default"


def build_manager(settings: OperatorSettings, config: ClusterConfig) -> Manager:
    election = None
    if settings.leader_elect:
        election = LeaderElectionConfig(
            namespace=_lease_namespace(settings, config),
            name=settings.leader_election_id,
            lease_duration=settings.lease_duration,
            renew_deadline=settings.renew_deadline,
            retry_period=settings.retry_period,
        )
    ring = None
    if settings.shard_ring:
        from controller_runtime.sharding import ShardRingConfig  # noqa: PLC0415 (only when sharding)

        ring = ShardRingConfig(
            name=settings.shard_ring,
            namespace=_lease_namespace(settings, config),
            slots=settings.shard_slots,
            lease_duration=settings.lease_duration,
            renew_deadline=settings.renew_deadline,
            retry_period=settings.retry_period,
        )
    webhook_server = None
    if settings.webhook_port:
        from controller_runtime.webhook import WebhookServer  # noqa: PLC0415

        webhook_server = WebhookServer(
            port=settings.webhook_port, cert_dir=settings.webhook_cert_dir
        )
    return Manager(
        config,
        ManagerOptions(
            webhook_server=webhook_server,
            namespaces=settings.namespaces or None,
            leader_election=election,
            shard_ring=ring,
            metrics_bind_address=settings.metrics_bind_address,
            health_probe_bind_address=settings.health_probe_bind_address,
            graceful_shutdown_timeout=settings.graceful_shutdown_timeout,
            read_your_writes=settings.read_your_writes,
            watch_timeout_seconds=settings.watch_timeout,
        ),
    )


async def setup_controllers(manager: Manager, settings: OperatorSettings) -> None:
    for name in settings.controllers:
        workers = settings.concurrency.get(name, settings.max_concurrent_reconciles)
        await CONTROLLERS[name](manager, ControllerOptions(max_concurrent_reconciles=workers))
    if settings.webhook_port:
        # The PostgreSQL API's webhooks (and the PostgreSQL code they import) only when asked.
        from controllers.postgres.webhooks import setup_webhooks  # noqa: PLC0415

        setup_webhooks(manager, settings.controllers)


# One exit status per way the operator can end, each with its own message.
async def run_operator(settings: OperatorSettings) -> int:  # noqa: PLR0911
    """Run until SIGTERM/SIGINT. Returns the process exit status."""
    try:
        config = await load_config(settings.kubeconfig, settings.context)
    except ConfigError as err:
        hint = "" if settings.kubeconfig else " (or name one with --kubeconfig FILE)"
        log.error("%s%s", err, hint)
        return 1
    # async with: whatever ends the operator before or during run, nothing stays open.
    async with build_manager(settings, config) as manager:
        try:
            await setup_controllers(manager, settings)
        except UnknownKindError as err:
            log.error("%s (install the CRDs: kubectl apply -k manifests/)", err)
            return 1
        except ServerUnreachableError as err:
            log.error("%s", err)
            return 1
        log.info(
            "operator starting against %s (%s): controllers %s, namespaces %s, leader election %s",
            config.server,
            config.source,
            ", ".join(settings.controllers),
            ", ".join(settings.namespaces) or "all",
            "on" if settings.leader_elect else "off",
        )
        if settings.shard_ring:
            log.info("Task controller sharded over ring %s", settings.shard_ring)
        try:
            await run_until_signalled(manager)
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
            log.error(
                "%s", busy_port_message(settings, metrics_started=manager.metrics_url is not None)
            )
            return 1
        except LeaderElectionLostError as err:
            log.error("%s; exiting so that the process restarts as a follower", err)
            return 1
        except CacheSyncTimeoutError as err:
            log.error("%s", err)
            return 1
        except Exception as err:
            # Logged with its traceback by Manager.run; exit non-zero so that the Pod restarts.
            log.error("operator failed (%s: %s); exiting with status 1", type(err).__name__, err)
            return 1
    log.info("operator stopped")
    return 0
