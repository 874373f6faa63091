"""Runs first (conftest's RUNS_FIRST), before the session's cluster takes the machine's one
node lock: a cluster whose process is killed with SIGKILL leaves things behind on every node
(here two, one of them lost, its Pods' cgroup tree frozen), and the next start removes them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from controller_runtime.envtest.node import cgroups, cleanup
from controller_runtime.envtest.node.cluster import LocalCluster, leftovers
from tests.e2e.support import Images

START_AND_WAIT = """
import sys, time
from pathlib import Path
from controller_runtime.envtest.node.cluster import LocalCluster
node = LocalCluster(crd_directory=None, images=[Path(sys.argv[1])], nodes=2)
node.start()
pod = '{"spec": {"nodeName": "crpy-node-2"}}'
for _ in range(60):  # until the controller-manager has made the default ServiceAccount
    out = node.kubectl("run", "sleeper", "--image=postgres:15", "--image-pull-policy=Never",
                       f"--overrides={pod}", "--command", "--", "sleep", "3600", check=False)
    if out:
        break
    time.sleep(1)
node.kubectl("wait", "pod/sleeper", "--for=condition=Ready", "--timeout=120s")
node.node("crpy-node-2").lose()
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
    line = process.stdout.readline().strip()
    assert line, f"the cluster in a subprocess did not start (exit {process.wait()})"
    workdir = Path(line)
    assert workdir.is_dir(), f"the cluster in a subprocess did not start (exit {process.poll()})"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    left = leftovers(workdir)
    for netns in ("crpy-net", "crpy-node-1", "crpy-node-2"):
        assert f"network namespace {netns}" in left, f"a killed cluster left only {left}"
    assert cgroups.is_frozen("crpy-node-2"), "the lost node's Pods should still be frozen"
    frozen = cgroups.pids_under("crpy-node-2")
    assert frozen, "the lost node's Pod should have left its frozen processes"
    assert workdir.exists(), f"a killed node should have left its work directory {workdir}"

    with LocalCluster(crd_directory=None) as node:
        assert not workdir.exists(), f"the killed node's {workdir} is still there"
        assert node.workdir != workdir, f"the new node reuses the killed node's {workdir}"
        running = cleanup.pids_naming(str(workdir))
        assert not running, f"processes of the killed node still run: {running}"
        still = [pid for pid in frozen if Path(f"/proc/{pid}").exists()]
        assert not still, f"the lost node's frozen processes still exist: {still}"
    assert not leftovers(workdir), f"{leftovers(workdir)} left after a clean stop"
    assert not cgroups.pids_under(), f"Pods' processes left: {cgroups.pids_under()}"
    after = cleanup.record_kernel_settings()
    assert after == before, f"kernel settings {after} after the nodes, {before} before"
