"""The local half of ``make run``: a control plane with example objects (two Tasks, and a
PostgreSQL data service: a version policy, an external PostgresInstance pointing at a local
PostgreSQL server started for the run, and a ServiceBinding whose Secret logs in to it), and
the operator on it. :mod:`controllers.dev` decides whether to come here.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

from controller_runtime import configure_logging
from controller_runtime.client import Transport
from controller_runtime.config import load_kubeconfig
from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.__main__ import plane_kubectl, print_access
from controller_runtime.manager import install_event_loop
from controllers.app import run_operator
from controllers.cli import settings_from
from controllers.dev import print_endpoints
from controllers.postgres.localserver import LocalPostgres, PostgresNotFoundError

DEMO_NAMESPACE = "demo"


async def create_examples(plane: ControlPlane) -> None:
    """A namespace and two Tasks: one due in two minutes (it turns Overdue while you watch),
    one already done."""
    due = (datetime.now(UTC) + timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    async with Transport(await load_kubeconfig(plane.kubeconfig)) as transport:
        await transport.request(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": DEMO_NAMESPACE}}
        )
        base = f"/apis/tasks.crpy.io/v1/namespaces/{DEMO_NAMESPACE}/tasks"
        for name, spec in (
            ("write-report", {"priority": 4, "details": "the quarterly report", "deadline": due}),
            ("book-room", {"priority": 2, "taskState": "Done"}),
        ):
            body = {
                "apiVersion": "tasks.crpy.io/v1",
                "kind": "Task",
                "metadata": {"name": name, "labels": {"app": "demo"}},
                "spec": spec,
            }
            await transport.request("POST", base, body=body)


async def create_postgres_examples(plane: ControlPlane, server: LocalPostgres) -> None:
    """The admin Secret of ``server``, a version policy enabling its major version, an
    external PostgresInstance using it and a ServiceBinding to it."""
    major = server.version.split(".")[0]
    group = "/apis/postgres.crpy.io/v1beta1"
    base = f"{group}/namespaces/{DEMO_NAMESPACE}"
    async with Transport(await load_kubeconfig(plane.kubeconfig)) as transport:
        await transport.request(
            "POST",
            f"/api/v1/namespaces/{DEMO_NAMESPACE}/secrets",
            body={
                "metadata": {"name": "demo-db-admin"},
                "stringData": {"username": server.user, "password": server.password},
            },
        )
        await transport.request(
            "POST",
            f"{group}/postgresversionpolicies",
            body={
                "apiVersion": "postgres.crpy.io/v1beta1",
                "kind": "PostgresVersionPolicy",
                "metadata": {"name": "default"},
                "spec": {
                    "versions": [
                        {"version": v, "enabled": True} for v in sorted({major, "16", "17"})
                    ]
                },
            },
        )
        for plural, kind, name, spec in (
            (
                "postgresinstances",
                "PostgresInstance",
                "demo-db",
                {
                    "external": {
                        "host": server.host,
                        "port": server.port,
                        "adminSecretRef": {"name": "demo-db-admin"},
                    }
                },
            ),
            ("servicebindings", "ServiceBinding", "shop", {"instanceRef": {"name": "demo-db"}}),
        ):
            body = {
                "apiVersion": "postgres.crpy.io/v1beta1",
                "kind": kind,
                "metadata": {"name": name},
                "spec": spec,
            }
            await transport.request("POST", f"{base}/{plural}", body=body)


def print_postgres_access(plane: ControlPlane, kubectl_executable: str = "kubectl") -> None:
    kubectl = f"{kubectl_executable} --kubeconfig {plane.kubeconfig}"
    print(f"postgres:    {kubectl} get pgvp,pgi,pgsb,pgu -n {DEMO_NAMESPACE}")
    print(f"             {kubectl} describe postgresinstance demo-db -n {DEMO_NAMESPACE}")
    print(f"             {kubectl} get events -n {DEMO_NAMESPACE}")
    print(
        f'connect:     psql "$({kubectl} get secret shop-credentials -n {DEMO_NAMESPACE} '
        "-o jsonpath='{.data.uri}' | base64 -d)\""
    )


def run_on_local_plane(args: list[str]) -> int:
    """Start the control plane and PostgreSQL, create the examples, print how to look, and
    run the operator with ``args`` until interrupted. Returns its exit status."""
    # Both started here, in the main thread: they die with it (PR_SET_PDEATHSIG).
    with ControlPlane() as plane, contextlib.ExitStack() as stack:
        asyncio.run(create_examples(plane))
        server = LocalPostgres()
        try:
            stack.enter_context(server)  # stopped (and its directory removed) on exit
            asyncio.run(create_postgres_examples(plane, server))
            postgres = True
        except (PostgresNotFoundError, RuntimeError) as err:
            print(f"no local PostgreSQL, so no postgres examples: {err}", flush=True)
            postgres = False
        kubectl_executable = plane_kubectl(plane)
        print_access(plane, kubectl_executable)
        kubectl = f"{kubectl_executable} --kubeconfig {plane.kubeconfig}"
        print(f"watch:       {kubectl} get tasks -n {DEMO_NAMESPACE} -w")
        print(f"             {kubectl} describe task write-report -n {DEMO_NAMESPACE}")
        if postgres:
            print_postgres_access(plane, kubectl_executable)
        settings = settings_from(["--kubeconfig", str(plane.kubeconfig), *args])
        print_endpoints(settings)
        print("Ctrl-C stops the operator, PostgreSQL and the control plane.", flush=True)
        configure_logging(settings.log_level, settings.log_format)
        install_event_loop()
        return asyncio.run(run_operator(settings))
