#!/bin/sh
# Make sure the Debian packages a local node needs are installed: runc (the OCI runtime
# containerd starts containers with), the CNI plugins (bridge, host-local, loopback), iptables
# and conntrack (kube-proxy), and mmdebstrap (the root filesystems of the node's images).
# Installs what is missing when we are root; otherwise says what to do. Quiet when there is
# nothing to do.
set -eu

missing=""
command -v runc >/dev/null 2>&1 || missing="$missing runc"
[ -x /usr/lib/cni/bridge ] || missing="$missing containernetworking-plugins"
command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
command -v conntrack >/dev/null 2>&1 || missing="$missing conntrack"
command -v mmdebstrap >/dev/null 2>&1 || missing="$missing mmdebstrap"

[ -z "$missing" ] && exit 0

if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "the local node needs these Debian packages:$missing; install them with apt-get" >&2
    exit 1
fi

echo "installing the local node's Debian packages:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
