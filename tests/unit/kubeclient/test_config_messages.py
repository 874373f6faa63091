"""A configuration that cannot be found says where the path came from and what to change,
in the library's terms: a library program has no ``--kubeconfig`` flag to suggest (the
operator's command line, which has one, adds it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeclient.config import ConfigError, load_config, load_kubeconfig


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No $KUBECONFIG, no service account, an empty home."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


async def test_a_path_from_kubeconfig_env_says_so(
    no_cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(no_cluster / "missing"))
    with pytest.raises(ConfigError) as missing:
        await load_config()
    message = str(missing.value)
    assert f"no kubeconfig at {no_cluster / 'missing'} (from $KUBECONFIG)" in message
    assert "correct $KUBECONFIG or unset it" in message
    assert "--kubeconfig" not in message


async def test_a_path_given_says_so(no_cluster: Path) -> None:
    for load in (load_config, load_kubeconfig):
        with pytest.raises(ConfigError) as missing:
            await load(str(no_cluster / "given"))
        assert "(the path given): no such file" in str(missing.value)
        assert "--kubeconfig" not in str(missing.value)


async def test_no_configuration_at_all_names_the_places_looked_at(no_cluster: Path) -> None:
    with pytest.raises(ConfigError) as missing:
        await load_config()
    message = str(missing.value)
    assert "no $KUBECONFIG, not in a Pod, and no ~/.kube/config" in message
    assert "--kubeconfig" not in message
