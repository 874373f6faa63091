"""The PrometheusRule in ``manifests/monitoring/``: each alert is complete (an expression, a
duration, a severity, a summary and a runbook), uses only metrics the operator exports, and
points at a runbook paragraph that exists in docs/postgres.md."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from controllers.postgres.ha_metrics import POSTGRES_METRICS, InstanceSample

ROOT = Path(__file__).resolve().parents[3]
RULE = ROOT / "manifests" / "monitoring" / "prometheus-rule.yaml"
DOCS = ROOT / "docs" / "postgres.md"


def alerts() -> list[dict[str, Any]]:
    (doc,) = [d for d in yaml.safe_load_all(RULE.read_text()) if d]
    assert doc["kind"] == "PrometheusRule" and doc["apiVersion"] == "monitoring.coreos.com/v1"
    return [rule for group in doc["spec"]["groups"] for rule in group["rules"]]


def exported_metric_names() -> set[str]:
    POSTGRES_METRICS.update(
        "ns",
        "db",
        InstanceSample(
            up={"db-0": True},
            roles={"db-0": "primary"},
            lag_bytes={"db-1": 1},
            lag_seconds={"db-1": 0.5},
            last_transition_seconds=1.0,
            last_backup=1.0,
            seconds_since_backup=2.0,
            backup_interval=3.0,
        ),
    )
    try:
        return {s.name for family in POSTGRES_METRICS.collect() for s in family.samples}
    finally:
        POSTGRES_METRICS.forget("ns", "db")


def test_every_alert_is_complete_and_has_a_runbook_in_the_docs() -> None:
    anchors = {
        re.sub(r"[^a-z0-9-]", "", line.lstrip("#").strip().lower().replace(" ", "-"))
        for line in DOCS.read_text().splitlines()
        if line.startswith("#")
    }
    found = alerts()
    assert len(found) >= 3
    for rule in found:
        assert rule["alert"] and rule["expr"] and rule["for"], rule
        assert rule["labels"]["severity"] in ("critical", "warning"), rule
        assert rule["annotations"]["summary"], rule
        path, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert path == "docs/postgres.md" and anchor in anchors, (
            f"{rule['alert']}: no section #{anchor} in docs/postgres.md"
        )


def test_alerts_use_only_the_metrics_the_operator_exports() -> None:
    exported = exported_metric_names()
    for rule in alerts():
        used = set(re.findall(r"\b(crpy_[a-z_]+)", rule["expr"]))
        assert used, rule["alert"]
        assert used <= exported, f"{rule['alert']}: {sorted(used - exported)} are not exported"
