"""CRD generation: types to schemas, classes to CRDs, CRDs to files."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
import yaml

from controller_runtime.crdgen import (
    GENERATED_MARK,
    CrdError,
    SchemaError,
    crd_documents,
    render_all,
    sync,
    type_schema,
)
from controller_runtime.resource import (
    Default,
    Description,
    EmbeddedResource,
    Enum,
    ExclusiveMinimum,
    Format,
    Int32,
    Maximum,
    MaxItems,
    Minimum,
    Nullable,
    Pattern,
    PrinterColumn,
    Resource,
    Rule,
    Schema,
    SchemaPatch,
    WebhookConversion,
    crd,
    field,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("tp", "schema"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (datetime, {"type": "string", "format": "date-time"}),
        (bytes, {"type": "string", "format": "byte"}),
        (Int32, {"type": "integer", "format": "int32"}),
        (list[str], {"type": "array", "items": {"type": "string"}}),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
        (dict[str, Any], {"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
        (Any, {"x-kubernetes-preserve-unknown-fields": True}),
        (int | str, {"x-kubernetes-int-or-string": True}),
        (str | None, {"type": "string"}),
        (Annotated[str, Nullable()] | None, {"type": "string", "nullable": True}),
        (
            Annotated[int, Minimum(1), Maximum(5)],
            {"type": "integer", "minimum": 1, "maximum": 5},
        ),
        (
            Annotated[float, ExclusiveMinimum(0)],
            {"type": "number", "minimum": 0, "exclusiveMinimum": True},
        ),
        (
            Annotated[str, Pattern("^a"), Enum("a", "ab")],
            {"type": "string", "pattern": "^a", "enum": ["a", "ab"]},
        ),
        (
            Annotated[list[int], MaxItems(3)],
            {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        ),
        (
            Annotated[str, Format("uri"), Description("where")],
            {"description": "where", "type": "string", "format": "uri"},
        ),
        (
            Annotated[dict[str, Any], EmbeddedResource()],
            {
                "type": "object",
                "x-kubernetes-embedded-resource": True,
                "x-kubernetes-preserve-unknown-fields": True,
            },
        ),
        (
            Annotated[str, SchemaPatch({"x-kubernetes-map-type": "atomic"})],
            {"type": "string", "x-kubernetes-map-type": "atomic"},
        ),
    ],
)
def test_type_schemas(tp: Any, schema: dict[str, Any]) -> None:
    assert type_schema(tp) == schema


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        (Literal["a", "b"], r"Annotated\[str, Enum"),
        (int | float, "no structural schema"),
        (dict[int, str], "keys must be str"),
        (list, "item type"),
        (complex, "no JSON schema"),
    ],
)
def test_types_without_a_structural_schema_are_refused_with_advice(tp: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        type_schema(tp, "Widget.spec.x")


class Part(Schema):
    """One part."""

    name: str
    """The part's name."""
    count: Annotated[int, Minimum(0)] = 1
    """How many."""


class WidgetSpec(Schema):
    """What the widget should be."""

    size: Annotated[int, Minimum(1), Maximum(10)]
    """How big, 1 to 10."""
    color: Annotated[str, Enum("red", "blue")] = "red"
    zero: int = 0
    """Zero values are no defaults."""
    tags: Annotated[list[str], Default(["a"])] = field(default_factory=list)
    part: Part | None = None
    """The main part (this text wins over the class docstring)."""
    parts: list[Part] = field(default_factory=list)

    __markers__ = (Rule("self.size <= 5 || self.color == 'blue'", message="big ones are blue"),)


class WidgetStatus(Schema):
    ready: bool = False


@crd(
    group="example.com",
    version="v1",
    short_names=("wdg",),
    categories=("all",),
    printer_columns=(PrinterColumn("Size", ".spec.size", "integer", priority=1),),
    selectable_fields=(".spec.color",),
    scale=(".spec.size", ".status.size", ""),
)
class Widget(Resource):
    """A widget."""

    spec: WidgetSpec
    status: WidgetStatus = field(default_factory=WidgetStatus)


@crd(
    group="example.com",
    version="v1beta1",
    kind="Widget",
    storage=False,
    deprecated=True,
    short_names=("wdg",),
    categories=("all",),
    deprecation_warning="use v1",
)
class WidgetV1beta1(Resource):
    spec: WidgetSpec


@crd(
    group="example.com",
    version="v1alpha1",
    kind="Widget",
    storage=False,
    short_names=("wdg",),
    categories=("all",),
)
class WidgetV1alpha1(Resource):
    spec: dict[str, Any] = field(default_factory=dict)


def one_crd(*classes: type[Resource]) -> dict[str, Any]:
    (document,) = [doc for _, doc, _ in crd_documents(classes)]
    return document


def test_a_resource_class_makes_its_crd() -> None:
    spec = one_crd(Widget)["spec"]
    assert spec["names"] == {
        "plural": "widgets",
        "singular": "widget",
        "kind": "Widget",
        "listKind": "WidgetList",
        "shortNames": ["wdg"],
        "categories": ["all"],
    }
    (version,) = spec["versions"]
    assert version["subresources"] == {
        "status": {},
        "scale": {"specReplicasPath": ".spec.size", "statusReplicasPath": ".status.size"},
    }
    assert version["selectableFields"] == [{"jsonPath": ".spec.color"}]
    assert version["additionalPrinterColumns"] == [
        {"name": "Size", "type": "integer", "priority": 1, "jsonPath": ".spec.size"}
    ]
    root = version["schema"]["openAPIV3Schema"]
    assert root["description"] == "A widget."
    assert root["required"] == ["spec"]
    assert "metadata" not in root["properties"]
    widget = root["properties"]["spec"]
    assert widget["description"] == "What the widget should be."
    assert widget["required"] == ["size"]
    props = widget["properties"]
    assert props["size"] == {
        "description": "How big, 1 to 10.",
        "type": "integer",
        "minimum": 1,
        "maximum": 10,
    }
    assert props["color"] == {"type": "string", "enum": ["red", "blue"], "default": "red"}
    assert props["zero"] == {"description": "Zero values are no defaults.", "type": "integer"}
    assert props["tags"]["default"] == ["a"]
    assert props["part"]["description"].startswith("The main part")
    assert props["part"]["properties"]["count"]["default"] == 1
    assert props["parts"]["items"]["description"] == "One part."
    assert widget["x-kubernetes-validations"] == [
        {"rule": "self.size <= 5 || self.color == 'blue'", "message": "big ones are blue"}
    ]


def test_versions_of_one_kind_make_one_crd_in_version_order() -> None:
    spec = one_crd(WidgetV1alpha1, Widget, WidgetV1beta1)["spec"]
    versions = {v["name"]: v for v in spec["versions"]}
    assert [v["name"] for v in spec["versions"]] == ["v1", "v1beta1", "v1alpha1"]
    assert [v["storage"] for v in spec["versions"]] == [True, False, False]
    assert versions["v1beta1"]["deprecated"] is True
    assert versions["v1beta1"]["deprecationWarning"] == "use v1"
    assert versions["v1alpha1"]["schema"]["openAPIV3Schema"]["properties"]["spec"] == {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }


def test_two_storage_versions_are_refused() -> None:
    @crd(
        group="example.com", version="v2", kind="Widget", short_names=("wdg",), categories=("all",)
    )
    class WidgetV2(Resource):
        spec: WidgetSpec

    with pytest.raises(CrdError, match="exactly one version must be the storage version"):
        crd_documents([Widget, WidgetV2])


def test_versions_that_disagree_on_scope_are_refused() -> None:
    @crd(
        group="example.com",
        version="v3",
        kind="Widget",
        scope="Cluster",
        storage=False,
        short_names=("wdg",),
        categories=("all",),
    )
    class WidgetV3(Resource):
        spec: WidgetSpec

    with pytest.raises(CrdError, match="disagree on scope"):
        crd_documents([Widget, WidgetV3])


def test_rendering_is_deterministic_and_marked_as_generated() -> None:
    first = render_all([Widget, WidgetV1beta1])
    second = render_all([WidgetV1beta1, Widget])
    assert first == second
    (name,) = first
    assert name == "example.com_widgets.yaml"
    text = first[name]
    assert text.startswith(GENERATED_MARK)
    assert "test_crdgen.Widget" in text.splitlines()[0]
    assert yaml.safe_load(text) == one_crd(Widget, WidgetV1beta1)
    assert "shortNames: [wdg]" in text  # lists of scalars in flow style


def test_sync_writes_checks_and_prunes_only_generated_files(tmp_path: Path) -> None:
    files = render_all([Widget])
    (tmp_path / "hand-written.yaml").write_text("kind: Namespace\n")
    (tmp_path / "example.com_gone.yaml").write_text(f"{GENERATED_MARK} from x\n")
    assert sync(files, tmp_path, check=True) == [
        "example.com_widgets.yaml",
        "-example.com_gone.yaml",
    ]
    assert not (tmp_path / "example.com_widgets.yaml").exists()
    assert sync(files, tmp_path) == ["example.com_widgets.yaml", "-example.com_gone.yaml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "example.com_widgets.yaml",
        "hand-written.yaml",
    ]
    assert sync(files, tmp_path, check=True) == []


def test_the_command_line_checks_the_operator_crds() -> None:
    command = [sys.executable, "-m", "controller_runtime.crdgen", "controllers.api"]
    ok = subprocess.run(
        [*command, "--output-dir", str(ROOT / "manifests" / "crds"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    stale = subprocess.run(
        [*command, "--output-dir", "/nonexistent-dir", "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert stale.returncode == 1
    assert "/nonexistent-dir is out of date (" in stale.stderr
    assert "tasks.crpy.io_tasks.yaml" in stale.stderr
    assert "postgres.crpy.io_postgresinstances.yaml" in stale.stderr


WIDGET_CONVERSION = WebhookConversion(service_name="widget-webhook", service_namespace="shop")


@crd(
    group="convert.example.com",
    version="v2",
    kind="Widget",
    short_names=("wdg",),
    categories=("all",),
    conversion=WIDGET_CONVERSION,
)
class WidgetV2Hub(Resource):
    spec: WidgetSpec


@crd(
    group="convert.example.com",
    version="v1",
    kind="Widget",
    storage=False,
    short_names=("wdg",),
    categories=("all",),
    conversion=WIDGET_CONVERSION,
)
class WidgetV1Spoke(Resource):
    spec: dict[str, Any] = field(default_factory=dict)


def test_versions_that_declare_a_conversion_webhook_convert_through_it() -> None:
    spec = one_crd(WidgetV2Hub, WidgetV1Spoke)["spec"]
    assert [v["name"] for v in spec["versions"]] == ["v2", "v1"]
    assert [v["storage"] for v in spec["versions"]] == [True, False]
    assert spec["conversion"] == {
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {
                "service": {"name": "widget-webhook", "namespace": "shop", "path": "/convert"}
            },
        },
    }
    assert list(spec) == ["group", "scope", "names", "versions", "conversion"]


def test_without_a_declared_webhook_the_api_server_converts_alone() -> None:
    assert "conversion" not in one_crd(WidgetV1alpha1, Widget, WidgetV1beta1)["spec"]


def test_a_conversion_webhook_on_another_port_and_path_is_written_as_declared() -> None:
    @crd(
        group="convert.example.com",
        version="v1",
        kind="Gadget",
        conversion=WebhookConversion(
            service_name="hooks",
            service_namespace="ops",
            path="/convert-gadgets",
            port=9443,
            review_versions=("v1", "v1beta1"),
        ),
    )
    class Gadget(Resource):
        spec: dict[str, Any] = field(default_factory=dict)

    conversion = one_crd(Gadget)["spec"]["conversion"]
    assert conversion["webhook"]["conversionReviewVersions"] == ["v1", "v1beta1"]
    assert conversion["webhook"]["clientConfig"]["service"] == {
        "name": "hooks",
        "namespace": "ops",
        "path": "/convert-gadgets",
        "port": 9443,
    }


def test_versions_that_declare_different_webhooks_are_refused() -> None:
    @crd(
        group="convert.example.com",
        version="v1beta2",
        kind="Widget",
        storage=False,
        short_names=("wdg",),
        categories=("all",),
        conversion=WebhookConversion(service_name="other", service_namespace="shop"),
    )
    class WidgetV1beta2(Resource):
        spec: WidgetSpec

    with pytest.raises(CrdError, match="different conversion webhooks"):
        crd_documents([WidgetV2Hub, WidgetV1beta2])


def test_a_conversion_path_must_be_absolute() -> None:
    @crd(
        group="convert.example.com",
        version="v1",
        kind="Doohickey",
        conversion=WebhookConversion(service_name="s", service_namespace="n", path="convert"),
    )
    class Doohickey(Resource):
        spec: dict[str, Any] = field(default_factory=dict)

    with pytest.raises(CrdError, match="must start with /"):
        crd_documents([Doohickey])


def test_a_multi_version_crd_with_a_webhook_renders_and_reads_back() -> None:
    (text,) = render_all([WidgetV2Hub, WidgetV1Spoke]).values()
    document = yaml.safe_load(text.split("\n", 1)[1])
    assert document["spec"]["conversion"]["strategy"] == "Webhook"
    assert text == render_all([WidgetV1Spoke, WidgetV2Hub])["convert.example.com_widgets.yaml"]
