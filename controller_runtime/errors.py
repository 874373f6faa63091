"""The errors a controller meets, in one place.

API errors are raised by the transport for every non-2xx answer (:mod:`kubeclient.errors`);
the common reasons have their own types so that callers can ``except NotFoundError``. They are
re-exported here, with the runtime's own: the cache's :class:`NotCachedError` and
:class:`CacheSyncTimeoutError`, discovery's :class:`UnknownKindError` and
:class:`ServerUnreachableError` (a manager's ``start_timeout`` passed while the API server
could not be reached), configuration's :class:`ConfigError` and the manager's
:class:`LeaderElectionLostError`. Every name here is also importable from
``controller_runtime`` itself.

- :class:`NotFoundError` (404), :class:`AlreadyExistsError` (409 AlreadyExists, a subclass of
  :class:`ConflictError`), :class:`ConflictError` (409: stale resourceVersion, failed
  precondition, server-side apply conflict; see ``causes``), :class:`InvalidError` (422; the
  field causes in ``causes``), :class:`ForbiddenError` (403), :class:`TooManyRequestsError`
  (429, ``retry_after`` in seconds), :class:`ServerTimeoutError` (504, a Status with reason
  Timeout, or the client's own request timeout with status 0: the outcome of a write is
  unknown), :class:`GoneError` (410), and the base :class:`ApiError` (status 0 for a transport
  failure such as a dropped connection).
"""

from controller_runtime.cache import CacheSyncTimeoutError, NotCachedError
from controller_runtime.leaderelection import LeaderElectionLostError
from kubeclient.config import ConfigError
from kubeclient.discovery import ServerUnreachableError, UnknownKindError
from kubeclient.errors import (
    AlreadyExistsError,
    ApiError,
    BadRequestError,
    ConflictError,
    ForbiddenError,
    GoneError,
    InternalServerError,
    InvalidError,
    MethodNotAllowedError,
    NotFoundError,
    ServerTimeoutError,
    ServiceUnavailableError,
    TooManyRequestsError,
    UnauthorizedError,
)

__all__ = [
    "AlreadyExistsError",
    "ApiError",
    "BadRequestError",
    "CacheSyncTimeoutError",
    "ConfigError",
    "ConflictError",
    "ForbiddenError",
    "GoneError",
    "InternalServerError",
    "InvalidError",
    "LeaderElectionLostError",
    "MethodNotAllowedError",
    "NotCachedError",
    "NotFoundError",
    "ServerTimeoutError",
    "ServerUnreachableError",
    "ServiceUnavailableError",
    "TooManyRequestsError",
    "UnauthorizedError",
    "UnknownKindError",
]
