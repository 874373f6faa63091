"""Runs first (file order), before the session's node takes the machine's one node lock: a
node whose process is killed with SIGKILL leaves things behind, and the next start removes
them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from controller_runtime.envtest.node import cleanup, network
from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.support import Images

START_AND_WAIT = """
import sys, time
from controller_runtime.envtest.node.cluster import LocalCluster
node = LocalCluster(crd_directory=None, images=[sys.argv[1]])
node.start()
print(node.workdir, flush=True)
time.sleep(600)
"""


def test_the_next_start_cleans_up_after_a_killed_node(images: Images) -> None:
    before = cleanup.record_kernel_settings()
    process = subprocess.Popen(
        [sys.executable, "-c", START_AND_WAIT, str(images.postgres_archive)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert process.stdout is not None
    workdir = Path(process.stdout.readline().strip())
    assert workdir.is_dir(), f"the node in a subprocess did not start (exit {process.poll()})"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert network.exists(), "a killed node should have left its namespace behind"
    assert workdir.exists(), f"a killed node should have left its work directory {workdir}"

    with LocalCluster(crd_directory=None) as node:
        assert not workdir.exists(), f"the killed node's {workdir} is still there"
        assert node.workdir != workdir, f"the new node reuses the killed node's {workdir}"
        leftovers = cleanup.pids_naming(str(workdir))
        assert not leftovers, f"processes of the killed node still run: {leftovers}"
    assert not network.exists(), f"network namespace {network.NETNS} left after a clean stop"
    after = cleanup.record_kernel_settings()
    assert after == before, f"kernel settings {after} after the nodes, {before} before"
