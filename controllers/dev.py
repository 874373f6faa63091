"""``make run``: the operator against the configured cluster, or, when none is configured, on an
embedded local control plane with a few example objects to watch it work: two Tasks, and a
PostgreSQL data service (a version policy, an external PostgresInstance pointing at a local
PostgreSQL server started for the run, and a ServiceBinding whose Secret logs in to it).

A cluster counts as configured when ``$KUBECONFIG`` names a file, ``~/.kube/config`` exists,
or the process runs in a Pod. Extra arguments are passed to the operator
(``python -m controllers --help``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from controllers.cli import OperatorSettings, parser, settings_from


def cluster_configured() -> bool:
    env = os.environ.get("KUBECONFIG", "")
    if env and Path(env.split(os.pathsep)[0]).is_file():
        return True
    if (Path.home() / ".kube" / "config").is_file():
        return True
    from controller_runtime.config import in_cluster_available  # noqa: PLC0415 (after the flags)

    return in_cluster_available()


def dev_parser() -> argparse.ArgumentParser:
    return parser(
        prog="python -m controllers.dev",
        description="make run: the operator against the configured cluster, or on a local "
        "control plane with example objects when none is configured. Takes the operator's "
        "flags (python -m controllers --help).",
    )


def endpoint(address: str | None, path: str) -> str:
    """Where the operator will serve ``path`` for a bind ``address`` flag."""
    if not address or address == "0":
        return "off"
    host, _, port = address.rpartition(":")
    if port == "0":
        return f"a free port, logged at start ({path})"
    return f"http://{host or '0.0.0.0'}:{port}{path}"


def print_endpoints(settings: OperatorSettings) -> None:
    print(f"metrics:     {endpoint(settings.metrics_bind_address, '/metrics')}")
    probes = endpoint(settings.health_probe_bind_address, "/healthz")
    print(f"probes:      {probes}" + (" and /readyz" if probes.startswith("http") else ""))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # --help and bad flags answer here, before anything heavy is imported or started.
    requested = settings_from(args, p=dev_parser())
    if cluster_configured() or requested.kubeconfig:
        print("a cluster is configured: running the operator against it", flush=True)
        print_endpoints(requested)
        from controllers.__main__ import main as operator_main  # noqa: PLC0415

        return operator_main(args)
    from controllers.devplane import run_on_local_plane  # noqa: PLC0415

    return run_on_local_plane(args)


if __name__ == "__main__":
    sys.exit(main())
