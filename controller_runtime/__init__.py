"""controller_runtime: an asyncio controller runtime for Kubernetes.

What a controller author writes every day is importable from here, in one line (see
``docs/controllers.md``; the exact list is in ``docs/reference.md``, and a test holds the two
to each other)::

    import controller_runtime as ctrl    # or: from controller_runtime import Manager, ...

- running: :class:`Manager`, :class:`ManagerOptions`, :class:`ByObject`,
  :class:`LeaderElectionConfig`, :func:`run_until_signalled`, :func:`load_config`,
  :func:`configure_logging`;
- wiring and reconciling: :class:`ControllerBuilder`, :class:`Controller`,
  :class:`ControllerOptions`, :class:`Request`, :class:`Result`, :class:`TerminalError`,
  :func:`reconcile_logger`;
- reading and writing: :class:`Client`, :func:`ignore_not_found`, :func:`retry_on_conflict`;
- every predicate (:mod:`controller_runtime.predicates`, with :class:`StoreDelta`, what a
  predicate receives) and every handler (:mod:`controller_runtime.handlers`);
- every helper (:mod:`controller_runtime.util`, controller-runtime's ``controllerutil``:
  owner references, finalizers, create-or-update, conditions, the event recorder);
- every error (:mod:`controller_runtime.errors`: the API errors, and the runtime's own);
- webhooks: :class:`WebhookBuilder`, :class:`WebhookServer`, :class:`AdmissionRequest`,
  :class:`Denied`, :class:`HubConverter`, :class:`Spoke` (the rest in
  :mod:`controller_runtime.webhook`).

Everything else lives in a submodule named for what it is, as controller-runtime's
``alias.go`` curates its root package and leaves the rest in packages:
:mod:`controller_runtime.cache` (the cache and the informers under it),
:mod:`controller_runtime.client` (``LiveReader``, ``Transport``, patch and propagation types),
:mod:`controller_runtime.config` (kubeconfig and in-cluster config),
:mod:`controller_runtime.patches` (patch bodies), :mod:`controller_runtime.builder`,
:mod:`controller_runtime.controller`, :mod:`controller_runtime.reconcile`,
:mod:`controller_runtime.manager`, :mod:`controller_runtime.logformat`,
:mod:`controller_runtime.workqueue`, :mod:`controller_runtime.sharding`,
:mod:`controller_runtime.resource` (typed resources and their markers),
:mod:`controller_runtime.crdgen` (CRDs from them), :mod:`controller_runtime.webhook`,
:mod:`controller_runtime.rbac` (RBAC from what controllers watch and declare),
:mod:`controller_runtime.testing` (the pytest plugin) and :mod:`controller_runtime.envtest`
(the local control plane, for tests).
"""

from typing import TYPE_CHECKING, Any

import kubeclient._aiohttp  # noqa: F401  (first: aiohttp without its import-time CA loads)

# The four families below are re-exported whole: their modules' ``__all__`` is the list, kept
# in one place. The other names are picked one by one.
from controller_runtime import errors, handlers, predicates, util
from controller_runtime.builder import ControllerBuilder
from controller_runtime.cache import ByObject
from controller_runtime.client import Client, ignore_not_found, retry_on_conflict
from controller_runtime.config import load_config
from controller_runtime.controller import Controller, ControllerOptions, reconcile_logger
from controller_runtime.errors import *  # noqa: F403
from controller_runtime.handlers import *  # noqa: F403
from controller_runtime.leaderelection import LeaderElectionConfig
from controller_runtime.logformat import configure_logging
from controller_runtime.manager import Manager, ManagerOptions, run_until_signalled
from controller_runtime.predicates import *  # noqa: F403
from controller_runtime.reconcile import Request, Result, TerminalError
from controller_runtime.util import *  # noqa: F403

if TYPE_CHECKING:
    from controller_runtime.webhook import (
        AdmissionRequest,
        Denied,
        HubConverter,
        Spoke,
        WebhookBuilder,
        WebhookServer,
    )

_WEBHOOK_NAMES = frozenset(
    ("AdmissionRequest", "Denied", "HubConverter", "Spoke", "WebhookBuilder", "WebhookServer")
)


def __getattr__(name: str) -> Any:
    """The webhook names, imported on first use: an operator that serves no webhook does not
    load the webhook server, its TLS and its certificate rotation (PEP 562)."""
    if name in _WEBHOOK_NAMES:
        from controller_runtime import webhook  # noqa: PLC0415

        value = getattr(webhook, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_WEBHOOK_NAMES})


# The names picked one by one (the families are added below).
__all__ = [
    "AdmissionRequest",
    "ByObject",
    "Client",
    "Controller",
    "ControllerBuilder",
    "ControllerOptions",
    "Denied",
    "HubConverter",
    "LeaderElectionConfig",
    "Manager",
    "ManagerOptions",
    "Request",
    "Result",
    "Spoke",
    "TerminalError",
    "WebhookBuilder",
    "WebhookServer",
    "configure_logging",
    "ignore_not_found",
    "load_config",
    "reconcile_logger",
    "retry_on_conflict",
    "run_until_signalled",
]
__all__ += errors.__all__
__all__ += handlers.__all__
__all__ += predicates.__all__
__all__ += util.__all__
