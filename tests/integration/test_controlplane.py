"""The local control plane, proven against itself: raw API access, CRDs, watches, RBAC with a
restricted identity, and teardown that leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import psutil
import pytest

from controller_runtime.envtest import ControlPlane, use_existing_cluster
from kubeclient.config import load_kubeconfig
from kubeclient.errors import ForbiddenError
from kubeclient.transport import Transport
from tests.support import condition_true, until_allowed, watch_until

pytestmark = pytest.mark.integration


def widget_crd(plural: str, group: str = "test.example.com") -> dict[str, object]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural[:-1], "kind": plural.capitalize()[:-1]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"size": {"type": "integer"}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


async def test_namespace_crd_and_custom_resource_through_the_raw_api(
    transport: Transport, namespace: str
) -> None:
    plural = f"widgets{uuid.uuid4().hex[:6]}"
    crd = widget_crd(plural)
    name = f"{plural}.test.example.com"
    await transport.request(
        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd
    )
    await watch_until(
        transport,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        lambda e: condition_true(e["object"], "Established"),
        params={"fieldSelector": f"metadata.name={name}"},
    )

    base = f"/apis/test.example.com/v1/namespaces/{namespace}/{plural}"
    kind = crd["spec"]["names"]["kind"]  # type: ignore[index]
    for i in range(3):
        body = {
            "apiVersion": "test.example.com/v1",
            "kind": kind,
            "metadata": {"name": f"w{i}"},
            "spec": {"size": i},
        }
        created = (await transport.request("POST", base, body=body)).json()
        assert created["metadata"]["uid"]

    listed = await transport.get_json(base)
    assert sorted(item["metadata"]["name"] for item in listed["items"]) == ["w0", "w1", "w2"]
    list_rv = listed["metadata"]["resourceVersion"]

    # A watch from the list's resourceVersion sees exactly the later change.
    patch = {"spec": {"size": 42}}
    await transport.request(
        "PATCH", f"{base}/w1", body=patch, content_type="application/merge-patch+json"
    )
    event = await watch_until(
        transport, base, lambda e: e["type"] != "BOOKMARK", params={"resourceVersion": list_rv}
    )
    assert event["type"] == "MODIFIED"
    assert event["object"]["metadata"]["name"] == "w1"
    assert event["object"]["spec"]["size"] == 42


async def test_restricted_identity_is_denied_until_a_role_allows(
    control_plane: ControlPlane, transport: Transport, namespace: str
) -> None:
    identity = control_plane.mint_service_account(namespace, "restricted")
    async with Transport(await load_kubeconfig(identity.kubeconfig)) as restricted:
        configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
        with pytest.raises(ForbiddenError) as denied:
            await restricted.get_json(configmaps)
        assert "cannot list resource" in denied.value.message

        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "read-configmaps"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "read-configmaps"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "read-configmaps",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "restricted", "namespace": namespace}],
        }
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
        await transport.request("POST", f"{rbac}/roles", body=role)
        await transport.request("POST", f"{rbac}/rolebindings", body=binding)

        await until_allowed(restricted, "list", "configmaps", namespace)
        listed = await restricted.get_json(configmaps)
        assert listed["kind"] == "ConfigMapList"
        # ... and only what the Role grants.
        with pytest.raises(ForbiddenError):
            await restricted.get_json(f"/api/v1/namespaces/{namespace}/secrets")
        with pytest.raises(ForbiddenError):
            await restricted.request(
                "POST", configmaps, body={"metadata": {"name": "x"}, "data": {}}
            )


@pytest.mark.skipif(use_existing_cluster(), reason="starts its own local control plane")
def test_stop_leaves_no_process_or_directory() -> None:
    plane = ControlPlane(crd_directory=None)
    plane.start()
    pids = plane.pids()
    workdir = plane.workdir
    assert len(pids) == 2
    assert all(psutil.pid_exists(pid) for pid in pids)
    plane.stop()
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids
    )
    assert not workdir.exists()


@pytest.mark.skipif(use_existing_cluster(), reason="starts its own local control plane")
def test_killed_owner_takes_its_control_plane_along(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even SIGKILL of the owning process leaves no etcd or kube-apiserver running, and the
    next start sweeps the directory it left. Both control planes keep their directories in
    ``tmp_path``, so that no other control plane started on the machine meanwhile sweeps the
    directory before this test looks at it."""
    script = textwrap.dedent(
        """
        import sys, time
        from controller_runtime.envtest import ControlPlane
        plane = ControlPlane(crd_directory=None)
        plane.start()
        print(plane.workdir, *plane.pids(), flush=True)
        time.sleep(600)
        """
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        assert owner.stdout is not None
        workdir, *pid_texts = owner.stdout.readline().split()
        children = [psutil.Process(int(p)) for p in pid_texts]
        assert len(children) == 2
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    _gone, alive = psutil.wait_procs(children, timeout=20)
    assert not alive, f"left running: {alive}"
    assert Path(workdir).exists()
    assert Path(workdir).parent == tmp_path
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with ControlPlane(crd_directory=None):  # sweeping happens at start
        assert not Path(workdir).exists()
