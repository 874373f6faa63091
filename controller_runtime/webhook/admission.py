"""Admission: the request a handler sees, the handlers' shapes, and the AdmissionReview
(``admission.k8s.io/v1``) on the wire.

A **defaulter** changes the object in place (:class:`Defaulter`); the server answers with the
JSON patch from the object as sent to the object as left (:mod:`.jsonpatch`), so fields the
handler does not know are never removed. A **validator** (:class:`Validator`) returns warnings,
or raises :class:`Denied` with a message (and a field path): the API server refuses the request
and its client sees the message. Both get the request (operation, user, dry run, old object)
and a client (the manager's, reading from its cache: use ``client.live`` for a kind the cache
does not watch).

What the server answers (:func:`review_response`):

==========================================  ======================================================
the handler                                 the AdmissionReview's response
==========================================  ======================================================
returns (warnings)                          ``allowed: true``, the warnings, the patch (defaulter)
raises :class:`Denied`                      ``allowed: false``, ``status`` with its code (403),
                                            message and field (``details.causes``)
raises anything else, or times out          no review: an HTTP error (500, 504) whose body says
                                            why, so the webhook's ``failurePolicy`` decides
==========================================  ======================================================
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import orjson

from controller_runtime.webhook.jsonpatch import diff

if TYPE_CHECKING:
    from controller_runtime.client import Client

__all__ = [
    "ADMISSION_API_VERSION",
    "OPERATIONS",
    "AdmissionRequest",
    "AdmissionResult",
    "Defaulter",
    "Denied",
    "MalformedReviewError",
    "Validator",
    "parse_admission_review",
    "review_response",
]

ADMISSION_API_VERSION = "admission.k8s.io/v1"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class MalformedReviewError(ValueError):
    """The request body is not an AdmissionReview (or ConversionReview) the server can answer;
    the server replies 400 with this message."""


@dataclass(frozen=True)
class AdmissionRequest:
    """One admission request, as the API server sent it (``AdmissionReview.request``).

    ``kind`` and ``resource`` are ``{"group", "version", "kind"}`` and ``{"group", "version",
    "resource"}``; ``user_info`` is ``{"username", "uid", "groups", "extra"}``; ``object`` is
    ``None`` on DELETE and ``old_object`` ``None`` on CREATE and CONNECT. ``dry_run`` is true
    when the request will not be persisted: a handler with side effects must not make them
    then. The handlers get their own copy of the object, never ``object`` itself.
    """

    uid: str
    kind: dict[str, str]
    resource: dict[str, str]
    name: str
    namespace: str
    operation: str
    user_info: dict[str, Any]
    dry_run: bool
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    sub_resource: str = ""
    options: dict[str, Any] | None = field(default=None, compare=False)
    """The operation's options (``CreateOptions``, ``UpdateOptions``, ``DeleteOptions``)."""


class Denied(Exception):  # noqa: N818 (controller-runtime's word: admission.Denied)
    """Refuse the request: the API server answers its client with ``message``.

    ``field`` is the path of the offending field (``spec.version``), reported as the cause;
    ``code`` is the HTTP status the client sees (403 Forbidden by default; 422 for an invalid
    value is also common).
    """

    def __init__(self, message: str, *, field: str | None = None, code: int = 403) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.code = code


@runtime_checkable
class Defaulter(Protocol):
    """Sets defaults: change ``obj`` in place (a copy of the request's object). Not called on
    DELETE or CONNECT. Raise :class:`Denied` to refuse the request."""

    async def default(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any]
    ) -> None: ...


@runtime_checkable
class Validator(Protocol):
    """Validates; each method returns warnings (shown by kubectl), or raises :class:`Denied`.

    ``validate_delete`` gets the object being deleted (the request's ``oldObject``).
    CONNECT is not validated (allowed)."""

    async def validate_create(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any]
    ) -> Sequence[str]: ...

    async def validate_update(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any], old: dict[str, Any]
    ) -> Sequence[str]: ...

    async def validate_delete(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any]
    ) -> Sequence[str]: ...


@dataclass(frozen=True)
class AdmissionResult:
    """What a handler decided: allowed or not, warnings, and the patch (mutating only)."""

    allowed: bool
    warnings: tuple[str, ...] = ()
    patch: list[dict[str, Any]] | None = None
    code: int = 200
    message: str = ""
    field: str | None = None

    @staticmethod
    def denied(error: Denied, warnings: Sequence[str] = ()) -> AdmissionResult:
        return AdmissionResult(
            allowed=False,
            warnings=tuple(warnings),
            code=error.code,
            message=error.message,
            field=error.field,
        )

    @staticmethod
    def mutated(before: Any, after: Any) -> AdmissionResult:
        """Allowed, with the patch from ``before`` to ``after`` (none when equal)."""
        operations = diff(before, after)
        return AdmissionResult(allowed=True, patch=operations or None)


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedReviewError(f"{what} must be an object, got {type(value).__name__}")
    return value


def _optional_object(value: Any, what: str) -> dict[str, Any] | None:
    if value is None:
        return None
    return _mapping(value, what)


def parse_admission_review(body: bytes) -> AdmissionRequest:
    """The request of an ``admission.k8s.io/v1`` AdmissionReview; raises
    :class:`MalformedReviewError` saying what is wrong (not JSON, another apiVersion or kind,
    no request, no uid, an unknown operation)."""
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise MalformedReviewError(f"the body is not JSON: {err}") from None
    review = _mapping(review, "the AdmissionReview")
    if review.get("apiVersion") != ADMISSION_API_VERSION or review.get("kind") != "AdmissionReview":
        raise MalformedReviewError(
            f"expected apiVersion {ADMISSION_API_VERSION} kind AdmissionReview, got "
            f"{review.get('apiVersion')!r} {review.get('kind')!r} (configure the webhook with "
            f"admissionReviewVersions: [v1])"
        )
    request = _mapping(review.get("request"), "request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReviewError("request.uid is missing")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise MalformedReviewError(f"request.operation {operation!r} is not one of {OPERATIONS}")
    return AdmissionRequest(
        uid=uid,
        kind=_mapping(request.get("kind") or {}, "request.kind"),
        resource=_mapping(request.get("resource") or {}, "request.resource"),
        name=str(request.get("name") or ""),
        namespace=str(request.get("namespace") or ""),
        operation=operation,
        user_info=_mapping(request.get("userInfo") or {}, "request.userInfo"),
        dry_run=bool(request.get("dryRun")),
        object=_optional_object(request.get("object"), "request.object"),
        old_object=_optional_object(request.get("oldObject"), "request.oldObject"),
        sub_resource=str(request.get("subResource") or ""),
        options=_optional_object(request.get("options"), "request.options"),
    )


def review_response(uid: str, result: AdmissionResult) -> bytes:
    """The AdmissionReview answering request ``uid``, encoded."""
    response: dict[str, Any] = {"uid": uid, "allowed": result.allowed}
    if result.warnings:
        response["warnings"] = list(result.warnings)
    if result.patch:
        encoded = orjson.dumps(result.patch)
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(encoded).decode()
    if not result.allowed:
        status: dict[str, Any] = {
            "status": "Failure",
            "code": result.code,
            "message": result.message,
            "reason": _REASONS.get(result.code, "Forbidden"),
        }
        if result.field:
            status["details"] = {
                "causes": [
                    {"type": "FieldValueInvalid", "message": result.message, "field": result.field}
                ]
            }
        response["status"] = status
    return orjson.dumps(
        {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}
    )


_REASONS: Mapping[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
}


def object_copy(obj: dict[str, Any] | None) -> dict[str, Any]:
    """A private copy for a handler (``{}`` when absent)."""
    return copy.deepcopy(obj) if obj is not None else {}
