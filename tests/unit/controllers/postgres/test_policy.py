"""The version policy's decisions."""

from __future__ import annotations

from typing import Any

import pytest

from controllers.postgres.policy import (
    Version,
    evaluate,
    image_for,
    lookup,
    parse_version,
    server_version,
)


def policy(*entries: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"spec": {"versions": list(entries), **spec}}


def test_versions_parse() -> None:
    assert parse_version("16") == Version(16)
    assert parse_version(" 15.4 ") == Version(15, 4)
    assert str(Version(15, 4)) == "15.4"
    assert server_version(150004) == Version(15, 4)
    for bad in ("", "15.x", "v15", "15.4.1"):
        with pytest.raises(ValueError, match="MAJOR"):
            parse_version(bad)


def test_an_exact_entry_wins_over_its_major() -> None:
    p = policy({"version": "15", "enabled": True}, {"version": "15.2", "enabled": False})
    assert lookup(p, Version(15, 2)) == {"version": "15.2", "enabled": False}
    assert lookup(p, Version(15, 3)) == {"version": "15", "enabled": True}
    assert lookup(p, Version(16)) is None


def test_images() -> None:
    p = policy({"version": "15", "image": "mirror/pg:15.7"}, defaultImage="reg/pg:{version}")
    assert image_for(p, Version(15)) == "mirror/pg:15.7"
    assert image_for(p, Version(16, 1)) == "reg/pg:16.1"
    assert image_for(None, Version(14)) == "postgres:14"


def test_an_enabled_version_is_accepted() -> None:
    verdict = evaluate(policy({"version": "16"}), "16", None)
    assert (verdict.accepted, verdict.version, verdict.reason) == (
        True,
        Version(16),
        "VersionEnabled",
    )
    assert verdict.image == "postgres:16"


@pytest.mark.parametrize(
    ("p", "reason", "message"),
    [
        (None, "NoVersionPolicy", "no PostgresVersionPolicy 'default'"),
        (
            policy({"version": "14", "enabled": False}),
            "VersionDisabled",
            "version 14 is disabled by the version policy",
        ),
        (policy({"version": "16"}), "VersionDisabled", "version 14 is not enabled"),
    ],
)
def test_a_new_instance_cannot_choose_a_version_that_is_not_enabled(
    p: dict[str, Any] | None, reason: str, message: str
) -> None:
    verdict = evaluate(p, "14", None)
    assert not verdict.accepted and verdict.version is None and verdict.reason == reason
    assert message in verdict.message


def test_a_running_version_that_gets_disabled_keeps_running_and_says_so() -> None:
    verdict = evaluate(policy({"version": "14", "enabled": False}), "14", Version(14))
    assert verdict.accepted and verdict.disabled and verdict.reason == "VersionDisabled"
    assert "keeps running, but cannot be newly chosen" in verdict.message


def test_changing_to_a_disabled_version_keeps_the_running_one() -> None:
    p = policy({"version": "15"}, {"version": "15.6", "enabled": False})
    verdict = evaluate(p, "15.6", Version(15, 5))
    assert not verdict.accepted and verdict.version == Version(15, 5)
    assert verdict.image == "postgres:15.5" and "15.5 keeps running" in verdict.message


def test_a_major_change_needs_permission_a_minor_one_does_not() -> None:
    p = policy({"version": "15"}, {"version": "16"})
    refused = evaluate(p, "16", Version(15))
    assert not refused.accepted and refused.reason == "MajorUpgradeRefused"
    assert refused.version == Version(15) and "allowMajorVersionUpgrade" in refused.message
    assert evaluate(p, "16", Version(15), allow_major_upgrade=True).accepted
    minor = evaluate(p, "15.7", Version(15, 6))
    assert minor.accepted and minor.image == "postgres:15.7"


def test_an_invalid_version_is_refused_without_touching_the_running_one() -> None:
    verdict = evaluate(policy({"version": "15"}), "fifteen", Version(15))
    assert not verdict.accepted and verdict.reason == "InvalidVersion"
    assert verdict.version == Version(15)


@pytest.mark.parametrize("allow", [False, True])
def test_a_major_downgrade_is_refused_even_with_permission(allow: bool) -> None:
    p = policy({"version": "15"}, {"version": "16"})
    refused = evaluate(p, "15", Version(16, 2), allow_major_upgrade=allow)
    assert not refused.accepted and refused.reason == "MajorDowngradeRefused"
    assert refused.version == Version(16, 2) and "16.2 keeps running" in refused.message
