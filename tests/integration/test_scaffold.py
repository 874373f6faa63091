"""From an empty directory to a green test suite, as a user does it: the library installed
from this checkout's wheel into a clean virtualenv, ``python -m controller_runtime init``,
``create api`` (two versions of a kind) and ``create webhook`` (a defaulter, a validator and
the conversion) there, the library's wheel put into the project's ``wheels/`` (it is on no
public index), then the project's own ``make test`` (which makes the project's virtualenv,
installs the project from ``wheels/``, checks its manifests and runs its generated tests on
the local control plane: the reconcile, and the webhooks through the API server) and ``make
run`` (its manager on a local control plane, until SIGTERM). Everything installs offline,
from the wheel and the wheel cache.

Also: the generated code is clean for ``ruff`` (check and format) and ``mypy --strict``; the
generated ``config/`` builds with kustomize and is accepted by the API server (a server-side
dry run), its Deployment's Pod by Pod Security "restricted"; the generated Dockerfile's install
step works from ``wheels/`` without the library on an index.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import fnmatch
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller_runtime.envtest import ControlPlane, ControlPlaneError
from tests.packaging_support import child_env, fresh_venv, offline_pip_env, run

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


WIDGET = ["--group", "shop", "--kind", "Widget"]


@pytest.fixture(scope="module")
def project(
    library_venv: Path, library_wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    root = tmp_path_factory.mktemp("scaffold") / "my-operator"
    root.mkdir()
    started = time.monotonic()
    cli: list[str | Path] = [library_venv, "-m", "controller_runtime"]
    run([*cli, "init", "--domain", "example.com", "--name", "my-operator"], cwd=root)
    run([*cli, "create", "api", *WIDGET, "--version", "v1"], cwd=root)
    print(f"[scaffold] init + create api: {time.monotonic() - started:.1f}s")
    run([*cli, "create", "api", *WIDGET, "--version", "v2"], cwd=root)
    hooks = ["--defaulting", "--programmatic-validation", "--conversion"]
    run([*cli, "create", "webhook", *WIDGET, "--version", "v1", *hooks], cwd=root)
    # What the generated README asks: the library's wheel in wheels/ (no public index has it).
    shutil.copy(library_wheel, root / "wheels")
    return root


def test_the_generated_project_passes_make_test(
    project: Path, library_wheels: list[Path], library_wheel: Path
) -> None:
    started = time.monotonic()
    dependencies = [d for d in library_wheels if d != library_wheel.parent]
    result = run(
        ["make", "test", "PYTEST_ARGS=-v"],
        cwd=project,
        # The library only from the project's wheels/, its dependencies from the wheel cache.
        env={**offline_pip_env(*dependencies), "PYTHON": sys.executable},
        what="make test in the generated project (its venv, its manifests, its tests)",
    )
    print(f"[scaffold] make test: {time.monotonic() - started:.1f}s")
    # The manager, the manifests, a Widget of each version reconciled, a default landed and
    # a denial refused through the API server, a Widget converted by the webhook.
    assert re.search(r"\b7 passed\b", result.stdout), result.stdout
    for test in (
        "test_the_defaulter_sets_the_size_class",
        "test_the_validator_refuses_a_shrink",
        "test_a_widget_is_converted_by_the_webhook",
    ):
        assert re.search(rf"::{test} PASSED", result.stdout), result.stdout
    assert (project / ".venv" / "bin" / "python").is_file()


async def test_make_run_starts_the_manager_on_a_local_control_plane(project: Path) -> None:
    # After make test: the project's virtualenv exists, so make run starts at once.
    assert (project / ".venv" / ".installed").is_file(), "runs after make test"
    process = await asyncio.create_subprocess_exec(
        "make",
        "run",
        "ARGS=--local=always --metrics-bind-address=0 --health-probe-bind-address=0",
        cwd=project,
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert process.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(180):
            while not any("caches synced" in line for line in seen):
                line = (await process.stdout.readline()).decode()
                if not line:
                    raise AssertionError("make run ended:\n" + "".join(seen))
                seen.append(line)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 60)
        await _group_gone(process.pid)
    output = "".join(seen)
    assert "local control plane; kubeconfig:" in output
    assert "caches synced: 1 kinds" in output, output


async def _group_gone(group: int, timeout: float = 60) -> None:
    """Wait until every process of ``group`` ended (make's child, the manager, shuts down
    gracefully after make itself is gone); only a cleanup, so polling is fine."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            await asyncio.sleep(0.1)


def test_the_generated_code_is_lint_and_type_clean(project: Path) -> None:
    for command in (["ruff", "check", "."], ["ruff", "format", "--check", "."]):
        run([BIN / command[0], *command[1:]], cwd=project)
    result = subprocess.run(
        [BIN / "mypy", "--strict", "my_operator", "tests"],
        cwd=project,
        env={**os.environ, "MYPYPATH": str(project)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout


# -- the generated config/ and Dockerfile -----------------------------------------------------


def built_config(project: Path, plane: ControlPlane) -> list[dict[str, Any]]:
    """``kubectl kustomize config``: what ``kubectl apply -k config/`` would send."""
    return [d for d in yaml.safe_load_all(plane.kubectl("kustomize", str(project / "config"))) if d]


def one(documents: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [
        d
        for d in documents
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    return found


def test_the_generated_config_builds_and_the_api_server_accepts_it(
    project: Path, control_plane: ControlPlane, tmp_path: Path
) -> None:
    documents = built_config(project, control_plane)
    deployment = one(documents, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--webhooks=self-managed" in container["args"]
    assert {"name": "webhook-server", "containerPort": 9443} in container["ports"]
    service = one(documents, "Service", "my-operator-webhook-service")
    assert service["spec"]["ports"][0]["targetPort"] == "webhook-server"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (hook,) = one(documents, kind)["webhooks"]
        assert hook["clientConfig"]["service"]["name"] == service["metadata"]["name"]
    crd = one(documents, "CustomResourceDefinition", "widgets.shop.example.com")
    assert crd["spec"]["conversion"]["strategy"] == "Webhook"
    assert sorted(v["name"] for v in crd["spec"]["versions"]) == ["v1", "v2"]

    # The namespace for real (its Pod Security labels included), everything else as a
    # server-side dry run: the API server validates and admits each object, stores nothing.
    applied_namespace(documents, control_plane, tmp_path)
    rest = tmp_path / "config.yaml"
    rest.write_text(yaml.safe_dump_all([d for d in documents if d["kind"] != "Namespace"]))
    # --force-conflicts: the session's control plane may hold a CRD of that name already
    # (the docs' Widget), applied by another field manager; a dry run changes nothing.
    dry_run = ["--server-side", "--dry-run=server", "--force-conflicts", "--field-manager=test"]
    applied = control_plane.kubectl("apply", *dry_run, "-f", str(rest))
    assert "deployment.apps/my-operator-manager serverside-applied (server dry run)" in applied


def applied_namespace(documents: list[dict[str, Any]], plane: ControlPlane, tmp_path: Path) -> str:
    """Apply the config's Namespace (for real: namespaced objects need it, even in a dry
    run); its name. It says enforce=restricted."""
    namespace = one(documents, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    manifest = tmp_path / "namespace.yaml"
    manifest.write_text(yaml.safe_dump(namespace))
    plane.kubectl("apply", "--server-side", "--field-manager=test", "-f", str(manifest))
    return str(namespace["metadata"]["name"])


def pod_of(deployment: dict[str, Any]) -> dict[str, Any]:
    template = copy.deepcopy(deployment["spec"]["template"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": "pod-security-probe"},
        "spec": template["spec"],
    }


def test_the_generated_deployment_runs_under_pod_security_restricted(
    project: Path, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """Pod Security admission enforces on Pods, not on Deployments: the Deployment's Pod,
    created (dry run) in the namespace labelled enforce=restricted, is admitted, and the
    same Pod made to run as root is refused (the check can fail)."""
    documents = built_config(project, control_plane)
    namespace = applied_namespace(documents, control_plane, tmp_path)
    pod = pod_of(one(documents, "Deployment"))
    # A cluster's ServiceAccount admission (the local control plane has it off) refuses a Pod
    # whose ServiceAccount does not exist: the config's own is applied first.
    account = one(documents, "ServiceAccount", pod["spec"]["serviceAccountName"])
    (tmp_path / "account.yaml").write_text(yaml.safe_dump(account))
    control_plane.kubectl(
        "apply", "--server-side", "--field-manager=test", "-f", str(tmp_path / "account.yaml")
    )
    good = tmp_path / "pod.yaml"
    good.write_text(yaml.safe_dump(pod))
    created = control_plane.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", str(good), check=False
    )
    assert "pod/pod-security-probe created (server dry run)" in created, created
    root = copy.deepcopy(pod)
    root["spec"]["securityContext"]["runAsNonRoot"] = False
    root["spec"]["containers"][0]["securityContext"].pop("runAsNonRoot")
    root["spec"]["containers"][0]["securityContext"]["runAsUser"] = 0
    bad = tmp_path / "root-pod.yaml"
    bad.write_text(yaml.safe_dump(root))
    with pytest.raises(ControlPlaneError, match=r"violates PodSecurity \"restricted:latest\""):
        control_plane.kubectl("create", "--dry-run=server", "-n", namespace, "-f", str(bad))


def copied_sources(project: Path, dockerfile: str) -> list[str]:
    """The build context's sources the builder stage COPYs, each checked against
    .dockerignore (``*`` then ``!`` exceptions, the generated file's shape)."""
    patterns = [
        line.strip()
        for line in (project / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def included(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negated = pattern.startswith("!")
            body = pattern.removeprefix("!").rstrip("/")
            if fnmatch.fnmatch(path, body) or path.startswith(body + "/"):
                keep = negated
        return keep

    sources: list[str] = []
    for line in dockerfile.splitlines():
        words = shlex.split(line) if line.startswith("COPY ") else []
        if words and not any(w.startswith("--from") for w in words):
            for source in words[1:-1]:
                path = source.rstrip("/")
                assert (project / path).exists(), f"COPY {source}: not in the project"
                assert included(path), f"COPY {source}: .dockerignore leaves it out"
                sources.append(path)
    return sources


def test_the_dockerfile_installs_the_project_from_its_wheels_directory(
    project: Path, library_wheel: Path, library_wheels: list[Path], tmp_path: Path
) -> None:
    """The builder stage, replayed outside a container (no image builder here): its COPYs
    into a fresh /src, its RUN's pip install into a fresh virtualenv, with the library only
    in wheels/ and no index; then the image's entry point runs."""
    dockerfile = (project / "Dockerfile").read_text()
    sources = copied_sources(project, dockerfile)
    assert {"wheels", "pyproject.toml", "my_operator"} <= set(sources)
    assert any(p.name == library_wheel.name for p in (project / "wheels").iterdir())
    src = tmp_path / "src"
    src.mkdir()
    for source in sources:
        origin = project / source
        if origin.is_dir():
            shutil.copytree(origin, src / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(origin, src / source)
    (install,) = [line for line in dockerfile.splitlines() if line.startswith("RUN ")]
    pip = shlex.split(install.split("&&", 1)[1])
    assert pip[0] == "/opt/operator/bin/pip" and "--find-links" in pip and pip[-1] == "."
    python = fresh_venv(tmp_path / "opt-operator")
    dependencies = [d for d in library_wheels if d != library_wheel.parent]
    run(
        [python, "-m", "pip", *pip[1:]],
        cwd=src,
        env=offline_pip_env(*dependencies),
        what="the Dockerfile's pip install, from wheels/",
    )
    shown = run([python, "-m", "my_operator", "--help"], cwd=tmp_path).stdout
    assert "--webhooks {off,self-managed,cert-dir}" in shown
    run([python, "-c", "import cryptography, controller_runtime.webhook.selfmanaged"])
