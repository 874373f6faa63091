"""The local control plane: real etcd and kube-apiserver on loopback, for tests and local runs.

Like controller-runtime's envtest: binaries from ``KUBEBUILDER_ASSETS`` or built once from Go
modules into a cache directory, generated certificates, RBAC on, CRDs installed, identities
minted on demand, and ``USE_EXISTING_CLUSTER=true`` to run the same tests against a real
cluster.
"""

from controller_runtime.envtest.binaries import (
    ETCD_VERSION,
    KUBERNETES_VERSION,
    Binaries,
    BinaryError,
    cache_root,
    find_binaries,
)
from controller_runtime.envtest.controlplane import (
    ControlPlane,
    ControlPlaneError,
    Identity,
    use_existing_cluster,
)
from controller_runtime.envtest.faultproxy import FaultProxy
from controller_runtime.envtest.webhooks import (
    WebhookInstallation,
    WebhookInstallOptions,
    admission_webhook,
    configuration,
)

__all__ = [
    "ETCD_VERSION",
    "KUBERNETES_VERSION",
    "Binaries",
    "BinaryError",
    "ControlPlane",
    "ControlPlaneError",
    "FaultProxy",
    "Identity",
    "WebhookInstallOptions",
    "WebhookInstallation",
    "admission_webhook",
    "cache_root",
    "configuration",
    "find_binaries",
    "use_existing_cluster",
]
