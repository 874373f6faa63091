"""Typed errors for answers of the API server.

Every non-2xx answer becomes an :class:`ApiError`; the common reasons have subclasses so that
callers can ``except NotFoundError`` instead of comparing numbers. The server's ``Status``
body is parsed when there is one (APF's 429 is plain text and still gets a useful message).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson


class ApiError(Exception):
    """An error answer from the API server.

    Attributes: ``status`` (HTTP code; 0 for a transport failure), ``reason`` (the Status
    reason, e.g. ``NotFound``), ``message``, ``details`` (the Status details dict),
    ``retry_after`` (seconds, from ``Retry-After`` or ``details.retryAfterSeconds``).
    """

    def __init__(
        self,
        status: int,
        reason: str = "",
        message: str = "",
        *,
        details: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
        method: str = "",
        path: str = "",
    ) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.details: Mapping[str, Any] = details or {}
        self.retry_after = retry_after
        self.method = method
        self.path = path
        where = f" ({method} {path})" if method else ""
        super().__init__(f"{status} {reason}: {message}{where}".strip())

    @property
    def causes(self) -> list[dict[str, Any]]:
        """Field causes of an Invalid error: ``[{"field": ..., "message": ..., ...}]``."""
        causes = self.details.get("causes")
        return list(causes) if isinstance(causes, list) else []


class BadRequestError(ApiError):
    """400: malformed request, e.g. an unsupported field selector."""


class UnauthorizedError(ApiError):
    """401: the credentials were refused (after one refresh)."""


class ForbiddenError(ApiError):
    """403: RBAC (or an admission plugin) denied the request."""


class NotFoundError(ApiError):
    """404: the object (or the resource) does not exist."""


class MethodNotAllowedError(ApiError):
    """405: the verb is not supported on this resource."""


class ConflictError(ApiError):
    """409 Conflict: a stale resourceVersion or a failed precondition."""


class AlreadyExistsError(ConflictError):
    """409 AlreadyExists: a create of a name that exists."""


class GoneError(ApiError):
    """410 Expired/Gone: a resourceVersion or continue token is too old."""


class InvalidError(ApiError):
    """422 Invalid: validation failed; :attr:`causes` lists the fields."""


class TooManyRequestsError(ApiError):
    """429: flow control (or a starting server) pushed back; see :attr:`retry_after`."""


class InternalServerError(ApiError):
    """500."""


class ServiceUnavailableError(ApiError):
    """503."""


class ServerTimeoutError(ApiError):
    """504 (or a Status with reason Timeout/ServerTimeout): the outcome may be unknown."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    409: ConflictError,
    410: GoneError,
    422: InvalidError,
    429: TooManyRequestsError,
    500: InternalServerError,
    503: ServiceUnavailableError,
    504: ServerTimeoutError,
}


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from an integer ``Retry-After`` header; HTTP dates are ignored (as client-go)."""
    if not value:
        return None
    try:
        seconds = int(value.strip())
    except ValueError:
        return None
    return float(seconds) if seconds >= 0 else None


def error_from_status(
    status: int,
    body: bytes,
    *,
    retry_after_header: str | None = None,
    method: str = "",
    path: str = "",
) -> ApiError:
    """Build the typed error for an HTTP answer (or a Status from a watch ERROR event)."""
    try:
        decoded = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        decoded = None
    if isinstance(decoded, dict) and decoded.get("kind") == "Status":
        return error_from_status_object(
            decoded, status=status, retry_after_header=retry_after_header, method=method, path=path
        )
    text = body.decode("utf-8", "replace").strip()[:500]
    cls = _BY_STATUS.get(status, ApiError)
    return cls(
        status,
        cls.__name__.removesuffix("Error"),
        text or f"HTTP {status}",
        retry_after=parse_retry_after(retry_after_header),
        method=method,
        path=path,
    )


def error_from_status_object(
    obj: Mapping[str, Any],
    *,
    status: int | None = None,
    retry_after_header: str | None = None,
    method: str = "",
    path: str = "",
) -> ApiError:
    """Build the typed error for a metav1 Status dict."""
    code = int(obj.get("code") or status or 0)
    reason = str(obj.get("reason") or "")
    details = obj.get("details") or {}
    retry_after = parse_retry_after(retry_after_header)
    if retry_after is None and isinstance(details, dict) and "retryAfterSeconds" in details:
        retry_after = float(details["retryAfterSeconds"])
    cls: type[ApiError]
    if reason == "AlreadyExists":
        cls = AlreadyExistsError
    elif reason in ("Timeout", "ServerTimeout"):
        cls = ServerTimeoutError
    else:
        cls = _BY_STATUS.get(code, ApiError)
    return cls(
        code,
        reason,
        str(obj.get("message") or ""),
        details=details if isinstance(details, dict) else {},
        retry_after=retry_after,
        method=method,
        path=path,
    )
