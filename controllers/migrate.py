"""``python -m controllers.migrate``: rewrite the PostgreSQL API's objects that etcd still holds
in an older version, once, after an upgrade of the CRDs (docs/deploy.md, "Upgrades across the
API version"); manifests/upgrade/ runs it as a Job.

For each CRD of ``postgres.crpy.io`` whose ``status.storedVersions`` lists more than the
storage version, every object is rewritten unchanged (the API server stores it in the storage
version) and ``storedVersions`` is narrowed: :mod:`controller_runtime.storage_migration`.
Exit status: 0 when every CRD is migrated (or needed nothing), 1 when ``--timeout`` passed
first (the log says which CRD and why: the conversion webhook down, typically), 2 for bad
flags. Running it again is harmless: a migrated CRD costs one GET.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from controllers.api.postgres.group import GROUP

__all__ = ["CRDS", "main", "run"]

log = logging.getLogger("controllers.migrate")

CRDS = tuple(
    f"{plural}.{GROUP}"
    for plural in (
        "postgresversionpolicies",
        "postgresinstances",
        "postgresusers",
        "servicebindings",
        "backups",
        "backupplans",
    )
)
"""Every CRD of the PostgreSQL API, the ones the others refer to first."""


async def run(kubeconfig: str | None, context: str | None, timeout: float) -> int:
    from controller_runtime import load_config  # noqa: PLC0415
    from controller_runtime.cache import Cache, InformerFactory  # noqa: PLC0415
    from controller_runtime.client import Client, Transport  # noqa: PLC0415
    from controller_runtime.storage_migration import StorageVersionMigrator  # noqa: PLC0415

    config = await load_config(kubeconfig, context)
    async with Transport(config) as transport:
        cache = Cache(InformerFactory(transport))
        client = Client(transport, cache, field_manager="crpy-storage-migration")
        migrator = StorageVersionMigrator(client, CRDS)
        await migrator.start()
        try:
            await asyncio.wait_for(migrator.done.wait(), timeout)
        except TimeoutError:
            pending = [name for name in CRDS if name not in migrator.results]
            log.error(
                "storage migration not finished after %.0f s: %s still pending",
                timeout,
                ", ".join(pending),
            )
            return 1
        finally:
            await migrator.stop(0)
            await cache.stop()
    for name, result in migrator.results.items():
        if result is None:
            log.info("%s: every object is stored in the storage version already", name)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m controllers.migrate",
        description="Rewrite the PostgreSQL API's objects stored in an older version.",
        allow_abbrev=False,
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds before giving up (default 600)"
    )
    args = parser.parse_args(argv)
    from controller_runtime import configure_logging  # noqa: PLC0415

    configure_logging("info", "text")
    return asyncio.run(run(args.kubeconfig, args.context, args.timeout))


if __name__ == "__main__":
    sys.exit(main())
