"""Finding a cluster: kubeconfig files, in-cluster service-account config.

:func:`load_config` (also importable from ``controller_runtime``) finds the cluster as
``kubectl`` does: an explicit path, else ``$KUBECONFIG``, else the in-cluster service account,
else ``~/.kube/config``. :func:`load_kubeconfig` reads one kubeconfig file (a context of it),
:func:`in_cluster_available` tells whether the in-cluster config is there
(:data:`SERVICE_ACCOUNT_DIR`). A :class:`ClusterConfig` is what a
:class:`~controller_runtime.Manager` or a :class:`~controller_runtime.client.Transport` is
built from; every failure to find or read one is a :class:`ConfigError`.
"""

from kubeclient.config import (
    SERVICE_ACCOUNT_DIR,
    ClusterConfig,
    ConfigError,
    in_cluster_available,
    load_config,
    load_kubeconfig,
)

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "ClusterConfig",
    "ConfigError",
    "in_cluster_available",
    "load_config",
    "load_kubeconfig",
]
