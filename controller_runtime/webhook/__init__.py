"""Admission and conversion webhooks: the HTTPS server the manager runs on every replica,
defaulting and validating handlers, hub-and-spoke conversion, and the builder that
registers them at controller-runtime's paths.

::

    from controller_runtime.webhook import WebhookBuilder, Denied, HubConverter, Spoke

    WebhookBuilder(manager).for_("shop.example.com/v1", "Widget") \\
        .with_defaulter(WidgetDefaulter()).with_validator(WidgetValidator()).complete()

Modules: :mod:`.admission` (the request, :class:`Defaulter`, :class:`Validator`,
:class:`Denied`, the AdmissionReview), :mod:`.conversion` (:class:`HubConverter`,
:class:`Spoke`, the ConversionReview), :mod:`.server` (:class:`WebhookServer`: what each
request is answered, metrics, draining), :mod:`.tls` (hot-reloaded serving certificates),
:mod:`.builder` (:class:`WebhookBuilder`), :mod:`.selfmanaged` (certificates the leader creates,
injects and rotates; :mod:`.rotation` its decisions), :mod:`.trust` (readiness against the
``caBundle`` values the API server holds) and :mod:`.jsonpatch` (the defaulter's patch).
"""

from controller_runtime.webhook.admission import (
    AdmissionRequest,
    AdmissionResult,
    Defaulter,
    Denied,
    MalformedReviewError,
    Validator,
)
from controller_runtime.webhook.builder import (
    WebhookBuilder,
    WebhookHost,
    WebhookPaths,
    defaulting_handler,
    validating_handler,
)
from controller_runtime.webhook.conversion import ConversionError, Converter, HubConverter, Spoke
from controller_runtime.webhook.rotation import RotationPolicy
from controller_runtime.webhook.selfmanaged import SelfManagedCertificates
from controller_runtime.webhook.server import (
    CONVERT_PATH,
    DEFAULT_PORT,
    AdmissionHandler,
    WebhookServer,
    default_paths,
)
from controller_runtime.webhook.tls import DEFAULT_CERT_DIR, CertificateError, ServingPair
from controller_runtime.webhook.trust import InjectedCABundles

__all__ = [
    "CONVERT_PATH",
    "DEFAULT_CERT_DIR",
    "DEFAULT_PORT",
    "AdmissionHandler",
    "AdmissionRequest",
    "AdmissionResult",
    "CertificateError",
    "ConversionError",
    "Converter",
    "Defaulter",
    "Denied",
    "HubConverter",
    "InjectedCABundles",
    "MalformedReviewError",
    "RotationPolicy",
    "SelfManagedCertificates",
    "ServingPair",
    "Spoke",
    "Validator",
    "WebhookBuilder",
    "WebhookHost",
    "WebhookPaths",
    "WebhookServer",
    "default_paths",
    "defaulting_handler",
    "validating_handler",
]
