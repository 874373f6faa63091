"""The webhook builder: a kind's defaulter, validator and converter, registered with the
manager's webhook server at controller-runtime's paths.

::

    WebhookBuilder(manager).for_("shop.example.com/v1", "Widget") \\
        .with_defaulter(WidgetDefaulter()).with_validator(WidgetValidator()).complete()

serves ``/mutate-shop-example-com-v1-widget`` and ``/validate-shop-example-com-v1-widget``
(``custom_path=`` on either changes it), and ``with_converter(HubConverter(...))`` the kind's
conversion at ``/convert``. The paths are what the webhook configurations' ``clientConfig``
name (:attr:`WebhookPaths`, returned by :meth:`complete`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from controller_runtime.webhook.admission import (
    AdmissionRequest,
    AdmissionResult,
    Defaulter,
    Denied,
    Validator,
)
from controller_runtime.webhook.conversion import Converter
from controller_runtime.webhook.server import (
    CONVERT_PATH,
    AdmissionHandler,
    WebhookServer,
    default_paths,
)

if TYPE_CHECKING:
    from controller_runtime.client import Client
    from controller_runtime.resource import Resource

__all__ = [
    "WebhookBuilder",
    "WebhookHost",
    "WebhookPaths",
    "defaulting_handler",
    "validating_handler",
]


class WebhookHost(Protocol):
    """What the builder needs of a manager: its webhook server and its client."""

    @property
    def webhook_server(self) -> WebhookServer: ...

    @property
    def client(self) -> Client: ...


@dataclass(frozen=True)
class WebhookPaths:
    """The paths :meth:`WebhookBuilder.complete` registered (``None``: not registered)."""

    mutate: str | None
    validate: str | None
    convert: str | None


def defaulting_handler(defaulter: Defaulter, client: Client) -> AdmissionHandler:
    """The admission handler running ``defaulter`` on CREATE and UPDATE (DELETE and CONNECT
    are allowed unchanged), answering with the JSON patch of what it changed."""

    async def handle(request: AdmissionRequest) -> AdmissionResult:
        if request.operation not in ("CREATE", "UPDATE") or request.object is None:
            return AdmissionResult(allowed=True)
        obj = copy.deepcopy(request.object)
        try:
            await defaulter.default(request, client, obj)
        except Denied as denial:
            return AdmissionResult.denied(denial)
        return AdmissionResult.mutated(request.object, obj)

    return handle


def validating_handler(validator: Validator, client: Client) -> AdmissionHandler:
    """The admission handler calling ``validator``'s method for the operation (CONNECT is
    allowed), with copies of the objects."""

    async def handle(request: AdmissionRequest) -> AdmissionResult:
        new = copy.deepcopy(request.object) if request.object is not None else None
        old = copy.deepcopy(request.old_object) if request.old_object is not None else None
        try:
            if request.operation == "CREATE" and new is not None:
                warnings = await validator.validate_create(request, client, new)
            elif request.operation == "UPDATE" and new is not None and old is not None:
                warnings = await validator.validate_update(request, client, new, old)
            elif request.operation == "DELETE" and old is not None:
                warnings = await validator.validate_delete(request, client, old)
            else:
                return AdmissionResult(allowed=True)
        except Denied as denial:
            return AdmissionResult.denied(denial)
        return AdmissionResult(allowed=True, warnings=tuple(warnings or ()))

    return handle


class WebhookBuilder:
    """Registers one kind's webhooks with ``manager.webhook_server``; see the module
    docstring. Each ``with_*`` is optional, but one is needed; :meth:`complete` registers
    them (a path registered twice raises ``ValueError``)."""

    def __init__(self, manager: WebhookHost) -> None:
        self._manager = manager
        self._api_version: str | None = None
        self._kind: str | None = None
        self._defaulter: Defaulter | None = None
        self._validator: Validator | None = None
        self._converter: Converter | None = None
        self._mutate_path: str | None = None
        self._validate_path: str | None = None

    def for_(self, api_version: str | type[Resource], kind: str | None = None) -> WebhookBuilder:
        """The kind: ``for_("shop.example.com/v1", "Widget")`` or a typed resource class
        (``for_(Widget)``)."""
        if isinstance(api_version, str):
            if kind is None:
                raise TypeError("for_(api_version, kind): kind is required with an apiVersion")
            self._api_version, self._kind = api_version, kind
        else:
            from controller_runtime.resource import resource_info  # noqa: PLC0415

            info = resource_info(api_version)
            self._api_version, self._kind = info.api_version, info.kind
        return self

    def with_defaulter(
        self, defaulter: Defaulter, *, custom_path: str | None = None
    ) -> WebhookBuilder:
        self._defaulter, self._mutate_path = defaulter, custom_path
        return self

    def with_validator(
        self, validator: Validator, *, custom_path: str | None = None
    ) -> WebhookBuilder:
        self._validator, self._validate_path = validator, custom_path
        return self

    def with_converter(self, converter: Converter) -> WebhookBuilder:
        self._converter = converter
        return self

    def complete(self) -> WebhookPaths:
        """Register the webhooks; returns their paths."""
        if self._api_version is None or self._kind is None:
            raise ValueError("WebhookBuilder: call for_(api_version, kind) first")
        if self._defaulter is None and self._validator is None and self._converter is None:
            raise ValueError(
                "WebhookBuilder: nothing to register; add with_defaulter, with_validator "
                "or with_converter"
            )
        server, client = self._manager.webhook_server, self._manager.client
        paths = default_paths(self._api_version, self._kind)
        mutate = validate = convert = None
        if self._converter is not None:
            group = self._api_version.rpartition("/")[0]
            if self._api_version not in self._converter.versions():
                raise ValueError(
                    f"the converter of {self._kind} does not know {self._api_version} "
                    f"(it knows {', '.join(self._converter.versions())})"
                )
            server.register_converter(group, self._kind, self._converter)
            convert = CONVERT_PATH
        if self._defaulter is not None:
            mutate = self._mutate_path or paths["mutate"]
            server.register(mutate, defaulting_handler(self._defaulter, client))
        if self._validator is not None:
            validate = self._validate_path or paths["validate"]
            server.register(validate, validating_handler(self._validator, client))
        return WebhookPaths(mutate=mutate, validate=validate, convert=convert)
