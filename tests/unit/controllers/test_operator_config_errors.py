"""The operator's command line has --kubeconfig: its error for a missing configuration says
so (the library's own message cannot, a library program has no such flag)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from controllers.app import run_operator
from controllers.cli import settings_from


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No $KUBECONFIG, no service account, an empty home."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


async def test_the_operator_adds_its_own_flag_to_the_hint(
    no_cluster: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="controllers"):
        assert await run_operator(settings_from([])) == 1
    assert "(or name one with --kubeconfig FILE)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="controllers"):
        assert await run_operator(settings_from(["--kubeconfig", str(no_cluster / "x")])) == 1
    assert (
        "(the path given): no such file" in caplog.text and "--kubeconfig FILE" not in caplog.text
    )
