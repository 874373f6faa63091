"""Informers: raw list+watch streams feeding a local cache kept exactly in step with the API
server, and shared informers that fan one watch out to many handlers.

Layers, bottom up: :mod:`~informers.transport` (aiohttp, our own retries) and
:mod:`~informers.config` (kubeconfig / in-cluster); :mod:`~informers._framing` (watch-body
lines); :mod:`~informers.reflector_machine` (the sans-IO state machine) driven by
:mod:`~informers.reflector`; :mod:`~informers.store` (the cache); :mod:`~informers.shared`.
"""

from informers.config import ClusterConfig, ConfigError, load_config, load_kubeconfig
from informers.discovery import Discovery, ResourceInfo, UnknownKindError
from informers.errors import (
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
from informers.labels import LabelSelector
from informers.reflector import Reflector, strip_managed_fields
from informers.reflector_machine import ReflectorMachine, ReflectorOptions
from informers.resource_version import compare_resource_versions, is_at_least
from informers.shared import InformerFactory, InformerKey, Registration, SharedInformer
from informers.store import Store, StoreDelta, object_key
from informers.transport import Transport

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
    "InformerFactory",
    "InformerKey",
    "InvalidError",
    "LabelSelector",
    "NotFoundError",
    "Reflector",
    "ReflectorMachine",
    "ReflectorOptions",
    "Registration",
    "ResourceInfo",
    "ServerTimeoutError",
    "SharedInformer",
    "Store",
    "StoreDelta",
    "TooManyRequestsError",
    "Transport",
    "UnauthorizedError",
    "UnknownKindError",
    "compare_resource_versions",
    "is_at_least",
    "load_config",
    "load_kubeconfig",
    "object_key",
    "strip_managed_fields",
]
