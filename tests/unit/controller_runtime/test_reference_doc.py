"""docs/reference.md is the contract: every public Client method and every option of the
manager, the cache, leader election, the webhook server, its self-managed certificates and
envtest's webhook installation is listed there, with the default the code has."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from controller_runtime import ByObject, Client, LeaderElectionConfig, ManagerOptions
from controller_runtime.client import LiveReader
from controller_runtime.envtest import WebhookInstallOptions
from controller_runtime.webhook import (
    DEFAULT_CERT_DIR,
    RotationPolicy,
    SelfManagedCertificates,
    WebhookServer,
)

REFERENCE = (Path(__file__).resolve().parents[3] / "docs" / "reference.md").read_text()
ROW = re.compile(r"^\| `(?P<name>\w+)` \| (?P<default>[^|]+) \|", re.M)


def public_methods(cls: type) -> list[str]:
    return [n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")]


def section(title: str) -> str:
    start = REFERENCE.index(f" {title}\n")
    following = re.search(r"^#{2,3} ", REFERENCE[start + 1 :], re.M)
    return REFERENCE[start : start + 1 + following.start()] if following else REFERENCE[start:]


def test_every_public_client_method_is_documented() -> None:
    methods = public_methods(Client)
    assert {"get", "list", "create", "delete", "patch", "apply", "mutate_with_retry"} <= set(
        methods
    )
    for name in methods:
        assert re.search(rf"`(await )?{name}\(", REFERENCE), f"Client.{name} is not in reference.md"
    for name in public_methods(LiveReader):
        assert f"live.{name}(" in REFERENCE, f"client.live.{name} is not in reference.md"


def documented_defaults(title: str) -> dict[str, str]:
    rows = {m.group("name"): m.group("default").strip() for m in ROW.finditer(section(title))}
    assert rows, f"no option table under {title}"
    return rows


def code_default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


@pytest.mark.parametrize(
    ("title", "cls"),
    [
        ("ManagerOptions", ManagerOptions),
        ("ByObject", ByObject),
        ("LeaderElectionConfig", LeaderElectionConfig),
        ("SelfManagedCertificates", SelfManagedCertificates),
        ("RotationPolicy", RotationPolicy),
        ("WebhookInstallOptions", WebhookInstallOptions),
    ],
)
def test_every_option_is_documented_with_its_default(title: str, cls: type) -> None:
    documented = documented_defaults(title)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert set(documented) == set(fields), f"{title}: doc and code disagree on the options"
    for name, text in documented.items():
        default = code_default(fields[name])
        if default is dataclasses.MISSING:
            assert text == "required", f"{title}.{name} has no default: document it as required"
            continue
        literal = text.strip("`")
        if literal == "RotationPolicy()":  # the one default that is an object
            assert default == RotationPolicy(), f"{title}.{name}"
            continue
        try:
            value = ast.literal_eval(literal)
        except (ValueError, SyntaxError):
            # A computed default (e.g. the identity): documented in words, checked by name.
            assert name == "identity", f"{title}.{name}: {text} is not a Python literal"
            continue
        assert value == default, f"{title}.{name}: documented {value!r}, code has {default!r}"


def test_every_webhook_server_option_is_documented_with_its_default() -> None:
    documented = documented_defaults("WebhookServer")
    parameters = {
        name: p for name, p in inspect.signature(WebhookServer).parameters.items() if name != "self"
    }
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters.values())
    assert set(documented) == set(parameters), "doc and code disagree on the options"
    for name, text in documented.items():
        default = parameters[name].default
        literal = text.strip("`")
        if literal == "DEFAULT_CERT_DIR":
            assert default == DEFAULT_CERT_DIR, name
            continue
        value = ast.literal_eval(literal)
        assert value == default, f"WebhookServer.{name}: documented {value!r}, code has {default!r}"
