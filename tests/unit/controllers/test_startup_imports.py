"""What ``python -m controllers`` loads depends on the flags: nothing it does not use.

A fresh interpreter imports exactly what the command imports before it serves (the flags, the
runtime, the app), and the test lists the modules that must not be there: the Prometheus client
(metrics are exported only when scraped), aiohttp's server half (only to serve metrics or
probes), the webhook server, the shard ring, the PostgreSQL driver and controllers, and
kubernetes-asyncio (only for an exec-plugin kubeconfig). Then it uses each of them the way
the flags would, and checks they load then.
"""

from __future__ import annotations

import json
import subprocess
import sys

OPERATOR_IMPORTS = (
    "import controllers.__main__; "
    "from controller_runtime import configure_logging; "
    "from controller_runtime.manager import install_event_loop; "
    "from controllers.app import run_operator"
)

NOT_LOADED = (
    "prometheus_client",
    "aiohttp.web",
    "http.server",
    "controller_runtime.webhook",
    "controller_runtime.sharding",
    "controller_runtime.sharded_controller",
    "psycopg",
    "controllers.postgres",
    "kubernetes_asyncio",
)


def loaded_after(statement: str) -> set[str]:
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_task_operator_loads_no_module_its_flags_do_not_use() -> None:
    loaded = loaded_after(OPERATOR_IMPORTS)
    assert "controllers.task" in loaded  # the test imports what the command imports
    unexpected = sorted(
        m for m in loaded if any(m == n or m.startswith(f"{n}.") for n in NOT_LOADED)
    )
    assert unexpected == []


def test_what_the_flags_ask_for_loads_when_used() -> None:
    loaded = loaded_after(
        OPERATOR_IMPORTS
        + "\nimport controller_runtime as ctrl, informers.metrics as m"
        + "\nctrl.WebhookBuilder"  # the webhook names of the package root, on first use
        + "\nm.REGISTRY.get_sample_value('informer_watches_open')"  # a collection
        + "\nfrom controller_runtime.manager import Manager"
    )
    assert {"controller_runtime.webhook", "prometheus_client"} <= loaded
