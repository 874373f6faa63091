"""manifests/ holds what the code generates: the CRDs from the classes in controllers/api,
the ClusterRole and the leader-election Role from what the controllers watch and declare
(controllers/permissions.py). Run `make manifests` after changing either."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import yaml

from controller_runtime.manifests import ProjectError, generate, load_project, run

ROOT = Path(__file__).resolve().parents[3]


async def test_the_committed_manifests_are_what_the_code_generates() -> None:
    assert await run(ROOT, check=True) == 0


async def test_every_crd_in_manifests_is_generated() -> None:
    directories, files = await generate(load_project(ROOT))
    (crds,) = directories.values()
    committed = sorted(p.name for p in (ROOT / "manifests" / "crds").glob("*.yaml"))
    assert committed == sorted(crds), "a CRD in manifests/crds/ has no class in controllers/api"
    assert {str(p.relative_to(ROOT)) for p in files} == {
        "manifests/rbac/cluster-role.yaml",
        "manifests/rbac/leader-election-role.yaml",
        "manifests/sharded/shard-ring-role.yaml",
        "manifests/upgrade/cluster-role.yaml",
    }


async def test_every_role_in_manifests_is_generated() -> None:
    """No hand-written Role or ClusterRole is left to drift from the code that needs it."""
    _, files = await generate(load_project(ROOT))
    roles = set()
    for path in sorted((ROOT / "manifests").rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") in ("Role", "ClusterRole"):
                roles.add(path)
    assert roles, "no role found: the search is broken"
    assert roles <= set(files), f"hand-written roles: {sorted(map(str, roles - set(files)))}"


async def test_a_declaration_for_a_controller_that_does_not_exist_is_refused(
    tmp_path: Path,
) -> None:
    module = tmp_path / "stale_declarations.py"
    module.write_text(
        "from controller_runtime.rbac import allow\n"
        "DECLARED = {'renamed-controller': (allow('secrets', 'get'),)}\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        project = dataclasses.replace(load_project(ROOT), declarations="stale_declarations")
        with pytest.raises(ProjectError, match="renamed-controller"):
            await generate(project)
    finally:
        sys.path.remove(str(tmp_path))
