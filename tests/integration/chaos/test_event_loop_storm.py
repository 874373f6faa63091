"""The event loop under a connection-refused storm: operator and client processes on uvloop,
the API server stopped and started in a loop (:mod:`bench.loop_storm`). No process may die of
a signal (an abort in the event loop's C code: ``Fatal Python error: Aborted``); exits with a
status (an operator that lost its Lease exits 1, by design) are expected.

``make chaos`` only: it runs for ``CHAOS_STORM_MINUTES`` (default 5) on its own control plane
(the API server restarts would disturb every other test's). On asyncio's loop (the default)
it must pass; on uvloop it is expected to fail now and then (an upstream abort, reproduced
here: docs/reliability.md, "The event loop"), so that variant is a non-strict xfail that
reports whether it hit the abort.
"""

from __future__ import annotations

import argparse
import os

import pytest

from bench.loop_storm import run
from controller_runtime.envtest import use_existing_cluster

pytestmark = [pytest.mark.integration, pytest.mark.chaos_only]

MINUTES = float(os.environ.get("CHAOS_STORM_MINUTES", "5"))


UVLOOP_ABORTS = pytest.mark.xfail(
    reason="uvloop 0.23.0 (libuv 1.52.1) aborts when a watched fd was closed behind its back "
    "(libuv#5130); seen once in 1.8 minutes of this storm, not in 41 others: "
    "docs/reliability.md, 'The event loop'",
    strict=False,
)


@pytest.mark.timeout(int(MINUTES * 60 + 600))
@pytest.mark.parametrize("loop", [pytest.param("uvloop", marks=UVLOOP_ABORTS), "asyncio"])
async def test_no_process_dies_of_a_signal_under_a_connection_refused_storm(loop: str) -> None:
    if use_existing_cluster():
        pytest.skip("stops and starts a local API server")
    args = argparse.Namespace(
        loop=loop,
        minutes=MINUTES,
        tasks=300,
        operators=2,
        clients=2,
        concurrency=100,
        watches=10,
        down=3.0,
        up=6.0,
        gdb=False,
        stop_at_first=True,
    )
    result = await run(args)
    print("loop storm:", {k: v for k, v in result.items() if k != "exits"})
    assert result["apiserver_restarts"] > 0, "the API server was never restarted"
    assert not result["deaths"] and not result["cores"], (
        f"a process died of a signal on {loop}: {result['deaths']}, cores {result['cores']}; "
        f"logs in {result['dir']}"
    )
