"""Which kubectl the printed command lines use: the one on PATH when it supports the server
(Kubernetes' skew policy: one minor version either way), else the one built with the control
plane."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from controller_runtime.envtest.kubectl import kubectl_command, within_skew
from controllers.dev import endpoint

minors = st.integers(min_value=0, max_value=60)


@given(client=minors, server=minors, patch=st.integers(0, 20), suffix=st.sampled_from(["", "-x"]))
def test_within_skew_is_one_minor_either_way(
    client: int, server: int, patch: int, suffix: str
) -> None:
    assert within_skew(f"v1.{client}.{patch}{suffix}", f"1.{server}.3") == (
        abs(client - server) <= 1
    )


def test_other_majors_and_garbage_are_not_within_skew() -> None:
    assert not within_skew("v2.36.0", "1.36.3")
    assert not within_skew("unknown", "1.36.3")
    assert not within_skew("", "1.36.3")


def test_an_old_path_kubectl_gives_way_to_the_built_one(tmp_path: Path) -> None:
    built = tmp_path / "kubectl"
    built.write_text("")
    assert kubectl_command(built, "1.36.3", path_version="v1.32.4-dispatcher") == str(built)
    assert kubectl_command(built, "1.36.3", path_version="v1.35.0") == "kubectl"
    assert kubectl_command(built, "1.36.3", path_version="v1.37.1") == "kubectl"
    # Nothing better to offer: plain kubectl.
    assert kubectl_command(tmp_path / "absent", "1.36.3", path_version="v1.20.0") == "kubectl"
    assert kubectl_command(None, "1.36.3", path_version="v1.20.0") == "kubectl"


def test_make_run_prints_where_metrics_and_probes_listen() -> None:
    assert endpoint("127.0.0.1:8080", "/metrics") == "http://127.0.0.1:8080/metrics"
    assert endpoint(":8081", "/healthz") == "http://0.0.0.0:8081/healthz"
    assert endpoint("0", "/metrics") == "off"
    assert endpoint(None, "/metrics") == "off"
    assert endpoint("127.0.0.1:0", "/metrics").startswith("a free port")


def test_the_flags_know_every_controller_the_operator_can_run() -> None:
    from controllers.app import CONTROLLERS  # noqa: PLC0415 (heavy: only this test needs it)
    from controllers.cli import ENABLED_BY_DEFAULT, KNOWN_CONTROLLERS  # noqa: PLC0415

    assert tuple(CONTROLLERS) == KNOWN_CONTROLLERS
    assert set(ENABLED_BY_DEFAULT) <= set(KNOWN_CONTROLLERS)
