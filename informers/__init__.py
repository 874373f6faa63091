"""Informers: raw list+watch streams feeding a local cache kept exactly in step with the API
server, and shared informers that fan one watch out to many handlers.

They run on the HTTP client in :mod:`kubeclient` (transport, configuration, typed errors,
discovery). Layers here, bottom up: :mod:`~informers._framing` (watch-body lines);
:mod:`~informers.reflector_machine` (the sans-IO state machine) driven by
:mod:`~informers.reflector`; :mod:`~informers.store` (the cache); :mod:`~informers.shared`.
"""

import kubeclient._aiohttp  # noqa: F401  (first: aiohttp without its import-time CA loads)
from informers.labels import LabelSelector
from informers.reflector import Reflector, strip_managed_fields
from informers.reflector_machine import ReflectorMachine, ReflectorOptions
from informers.resource_version import compare_resource_versions, is_at_least
from informers.shared import InformerFactory, InformerKey, Registration, SharedInformer
from informers.store import Store, StoreDelta, object_key

__all__ = [
    "InformerFactory",
    "InformerKey",
    "LabelSelector",
    "Reflector",
    "ReflectorMachine",
    "ReflectorOptions",
    "Registration",
    "SharedInformer",
    "Store",
    "StoreDelta",
    "compare_resource_versions",
    "is_at_least",
    "object_key",
    "strip_managed_fields",
]
