"""The event loop under a connection-refused storm: operator and client processes on uvloop,
the API server stopped and started in a loop (:mod:`bench.loop_storm`). No process may die of
a signal (an abort in the event loop's C code: ``Fatal Python error: Aborted``); exits with a
status (an operator that lost its Lease exits 1, by design) are expected.

``make chaos`` only: it runs for ``CHAOS_STORM_MINUTES`` (default 5) on its own control plane
(the API server restarts would disturb every other test's). What longer runs found is in
docs/reliability.md, "The event loop".
"""

from __future__ import annotations

import argparse
import os

import pytest

from bench.loop_storm import run
from controller_runtime.envtest import use_existing_cluster

pytestmark = [pytest.mark.integration, pytest.mark.chaos_only]

MINUTES = float(os.environ.get("CHAOS_STORM_MINUTES", "5"))


@pytest.mark.timeout(int(MINUTES * 60 + 600))
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
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
    assert not result["deaths"], (
        f"a process died of a signal on {loop}: {result['deaths']}; logs in {result['dir']}"
    )
