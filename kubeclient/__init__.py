"""kubeclient: the HTTP client layer under the informers and the controller runtime.

- :mod:`~kubeclient.config` loads a cluster's address and credentials (kubeconfig through
  kubernetes-asyncio, or the in-cluster service account).
- :mod:`~kubeclient.transport` sends requests with aiohttp, with client-go's retry rules, and
  opens the long-lived list and watch streams the informers read.
- :mod:`~kubeclient.errors` turns the API server's Status answers into typed exceptions.
- :mod:`~kubeclient.discovery` maps a kind to its resource (cached per group/version).

Controller authors rarely import this package: :mod:`controller_runtime` re-exports what they
need.
"""

import kubeclient._aiohttp  # noqa: F401  (first: aiohttp without its import-time CA loads)
from kubeclient.config import ClusterConfig, ConfigError, load_config, load_kubeconfig
from kubeclient.discovery import Discovery, ResourceInfo, UnknownKindError
from kubeclient.errors import (
    AlreadyExistsError,
    ApiError,
    BadRequestError,
    ConflictError,
    ForbiddenError,
    GoneError,
    InvalidError,
    NotFoundError,
    ServerTimeoutError,
    TooManyRequestsError,
    UnauthorizedError,
)
from kubeclient.transport import Transport

__all__ = [
    "AlreadyExistsError",
    "ApiError",
    "BadRequestError",
    "ClusterConfig",
    "ConfigError",
    "ConflictError",
    "Discovery",
    "ForbiddenError",
    "GoneError",
    "InvalidError",
    "NotFoundError",
    "ResourceInfo",
    "ServerTimeoutError",
    "TooManyRequestsError",
    "Transport",
    "UnauthorizedError",
    "UnknownKindError",
    "load_config",
    "load_kubeconfig",
]
