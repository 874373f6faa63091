"""A single-node Kubernetes cluster on this machine: the local control plane plus a real
kubelet, containerd, controller-manager, scheduler, kube-proxy and CoreDNS, with Pods in a
network namespace of its own (see :mod:`controller_runtime.envtest.node.cluster`)."""
