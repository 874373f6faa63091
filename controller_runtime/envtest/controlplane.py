"""A real etcd and kube-apiserver on loopback, for tests and local runs (like envtest).

The storage is etcd by default, or kine over SQLite or PostgreSQL, for all resources or for
chosen ones (``storage=``, ``storage_overrides=``; :mod:`controller_runtime.envtest.storage`).

Guarantees:

* All processes bind to 127.0.0.1 on free ports and keep their state in one temporary
  directory, removed by :meth:`ControlPlane.stop`.
* The children are started with ``PR_SET_PDEATHSIG``, so they die with the process that
  started them, even on ``SIGKILL``; directories left behind by a killed run are swept at the
  next start.
* ``--authorization-mode=RBAC``: identities minted with :meth:`ControlPlane.mint_identity`
  start with no permissions at all.

Caveats: there is no controller-manager and no scheduler. Namespaces stay ``Terminating``
once deleted, garbage collection of dependents does not run, Pods are never scheduled, and
service-account tokens are not created automatically (identities use client certificates).

``USE_EXISTING_CLUSTER=true`` skips all of this and uses the current kubeconfig's cluster;
identities are then service accounts with tokens from the TokenRequest API.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import http.client
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from controller_runtime.envtest.binaries import Binaries, find_binaries, find_kine
from controller_runtime.envtest.certs import CertificateAuthority, service_account_signing_key
from controller_runtime.envtest.storage import (
    ETCD,
    KINE_POSTGRES,
    OwnedPostgres,
    PostgresServer,
    StorageProcess,
    check_overrides,
    check_storage,
    default_storage,
    servers_overrides_flag,
    start_local_postgres,
)

log = logging.getLogger(__name__)

DEFAULT_CRD_DIRECTORY = Path(__file__).resolve().parents[2] / "manifests" / "crds"
"""The operator's CRDs, installed by default when present."""

_TMP_PREFIX = "crpy-envtest-"
_SERVICE_CIDR = "10.0.0.0/24"
_PR_SET_PDEATHSIG = 1


class ControlPlaneError(RuntimeError):
    """The control plane failed to start, or a request to it failed."""


@dataclass(frozen=True)
class Identity:
    """A user the tests can act as: its kubeconfig and who the API server thinks it is."""

    kubeconfig: Path
    user: str
    groups: tuple[str, ...] = ()


def use_existing_cluster() -> bool:
    """True when ``USE_EXISTING_CLUSTER`` asks for the current kubeconfig's cluster."""
    return os.environ.get("USE_EXISTING_CLUSTER", "").lower() in ("1", "true", "yes")


def feature_gate_args(gates: Mapping[str, bool]) -> dict[str, str]:
    """``{"--feature-gates": "A=true,B=false"}`` for ``gates`` (empty for no gates)."""
    if not gates:
        return {}
    text = ",".join(f"{name}={'true' if on else 'false'}" for name, on in sorted(gates.items()))
    return {"--feature-gates": text}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL it when the parent thread dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _sweep_stale_directories() -> None:
    """Remove temporary directories of control planes whose owner process is gone."""
    root = Path(tempfile.gettempdir())
    for directory in root.glob(f"{_TMP_PREFIX}*"):
        owner = directory / "owner.pid"
        try:
            pid = int(owner.read_text())
        except (OSError, ValueError):
            continue
        if not Path(f"/proc/{pid}").exists():
            shutil.rmtree(directory, ignore_errors=True)


@dataclass
class _Process:
    name: str
    command: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log_file:
            self.popen = subprocess.Popen(
                self.command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Not thread-safe in general; the callback only calls prctl, which is.
                preexec_fn=_die_with_parent,  # noqa: PLW1509
            )

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.popen = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class ControlPlane:
    """etcd + kube-apiserver with generated certificates, or an existing cluster.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. ``crd_directory``
    (default: the CRDs in ``manifests/crds``) is installed once the API server is ready, and
    the call returns only when every CRD is established and served.

    Defaults: start timeout 60 s; the API server's own flags as envtest sets them, plus
    ``extra_apiserver_args`` (``{"--flag": "value"}``) which win over the defaults.
    ``feature_gates`` (``{"ShardedListAndWatch": True}``) become ``--feature-gates``
    (an explicit ``--feature-gates`` in ``extra_apiserver_args`` wins); they are ignored for
    an existing cluster, whose gates are what they are.

    ``audit_policy`` (the YAML of an ``audit.k8s.io/v1`` Policy, e.g.
    :data:`~controller_runtime.envtest.audit.WRITES_POLICY`; default none) turns on the API
    server's audit log: every request the policy selects is written to :attr:`audit_log`
    (JSON lines, never rotated; read it with
    :func:`~controller_runtime.envtest.audit.audit_events`). Ignored for an existing
    cluster, whose audit log is not this process's to read: :attr:`audit_log` stays ``None``.

    ``storage`` is ``"etcd"`` (default, unless ``$CRPY_ENVTEST_STORAGE`` names another),
    ``"kine-sqlite"`` or ``"kine-postgres"``; ``storage_overrides``
    (``{"/events": "kine-postgres"}``) send chosen built-in resources to another backend
    through ``--etcd-servers-overrides`` (custom resources cannot be moved so: the API
    server ignores the flag for them, and the control plane refuses such an override).
    ``kine-postgres`` keeps its database in ``postgres`` when given (any object with ``host``,
    ``port``, ``user``, ``password``, e.g. a
    :class:`~controllers.postgres.localserver.LocalPostgres` shared by several control
    planes), else in a throwaway local server the control plane starts and stops. Both are
    ignored for an existing cluster. See :mod:`controller_runtime.envtest.storage`.
    """

    crd_directory: Path | None = DEFAULT_CRD_DIRECTORY
    extra_apiserver_args: Mapping[str, str] = field(default_factory=dict)
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    audit_policy: str | None = None
    start_timeout: float = 60.0
    existing_cluster: bool = field(default_factory=use_existing_cluster)
    binaries: Binaries | None = None
    storage: str = field(default_factory=default_storage)
    storage_overrides: Mapping[str, str] = field(default_factory=dict)
    storage_args: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """More flags per backend name, e.g. ``{"etcd": ["--quota-backend-bytes=8589934592"]}``."""
    postgres: PostgresServer | None = None
    node_address: str | None = None
    """Set by the local node (:mod:`controller_runtime.envtest.node`): the API server binds
    this address instead of 127.0.0.1, with ServiceAccount admission on, ``Node,RBAC``
    authorization and a client certificate for kubelets (``pki/kubelet-client.*``)."""

    workdir: Path = field(init=False)
    kubeconfig: Path = field(init=False)
    server: str = field(init=False, default="")
    audit_log: Path | None = field(init=False, default=None)
    """The API server's audit log (with ``audit_policy`` on a local control plane)."""
    etcd_url: str = field(init=False, default="")
    """The client URL of the main storage (etcd's, or kine's etcd API)."""
    storage_processes: dict[str, StorageProcess] = field(init=False, default_factory=dict)
    """The running storage servers by backend name: the main one and those of overrides."""
    admin_token: str = field(init=False, default="", repr=False)
    """A bearer token of an admin (``system:masters``) on the local control plane, for tests of
    token-based authentication (static token file; empty on an existing cluster)."""
    _ca: CertificateAuthority | None = field(init=False, default=None)
    _owned_postgres: OwnedPostgres | None = field(init=False, default=None, repr=False)
    _apiserver: _Process | None = field(init=False, default=None)
    _admin_ssl: ssl.SSLContext | None = field(init=False, default=None)
    _started: bool = field(init=False, default=False)

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start (or connect to) the control plane and install the CRDs."""
        if self._started:
            return
        check_storage(self.storage)
        self.storage_overrides = check_overrides(self.storage_overrides)
        _sweep_stale_directories()
        self.workdir = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX))
        (self.workdir / "owner.pid").write_text(str(os.getpid()))
        self._started = True
        try:
            if self.existing_cluster:
                self._connect_existing()
            else:
                self._start_local()
            if self.crd_directory is not None and self.crd_directory.is_dir():
                self.install_crds(self.crd_directory)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the processes and remove the temporary directory. Safe to call twice."""
        if self._apiserver is not None:
            self._apiserver.stop()
        for process in self.storage_processes.values():
            process.remove()
        self.storage_processes = {}
        if self._owned_postgres is not None:
            self._owned_postgres.stop()
            self._owned_postgres = None
        if self._started:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self._started = False

    def pids(self) -> list[int]:
        """Process ids of the running children (empty for an existing cluster): the storage
        servers and the API server (a PostgreSQL server the control plane started included,
        its postmaster only: see :meth:`storage_pids`)."""
        pids = [pid for pid in self.storage_pids().values() if pid is not None]
        if self._apiserver is not None and self._apiserver.popen and self._apiserver.running():
            pids.append(self._apiserver.popen.pid)
        return pids

    def storage_pids(self) -> dict[str, int | None]:
        """Process ids by role: ``etcd``/``kine`` per backend name, and ``postgres`` (the
        postmaster of a server this control plane started; its per-connection backends are
        its children)."""
        pids: dict[str, int | None] = {
            name: process.pid for name, process in self.storage_processes.items()
        }
        if self._owned_postgres is not None:
            pids["postgres"] = self._owned_postgres.pid
        return pids

    def apiserver_pid(self) -> int | None:
        """The API server's process id while it runs (None for an existing cluster)."""
        if self._apiserver is None or self._apiserver.popen is None:
            return None
        return self._apiserver.popen.pid if self._apiserver.running() else None

    # -- local processes -------------------------------------------------------------------

    def _start_local(self) -> None:
        binaries = self.binaries or find_binaries()
        self.binaries = binaries
        pki = self.workdir / "pki"
        pki.mkdir()
        self._ca = CertificateAuthority()
        ca_file = pki / "ca.crt"
        ca_file.write_bytes(self._ca.cert_pem)
        serving_cert, serving_key = self._ca.issue_serving(
            [
                "127.0.0.1",
                *([self.node_address] if self.node_address else []),
                "localhost",
                "10.0.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]
        ).write(pki, "apiserver")
        sa_private, sa_public = service_account_signing_key()
        sa_key, sa_pub = pki / "sa.key", pki / "sa.pub"
        sa_key.touch(mode=0o600)
        sa_key.write_bytes(sa_private)
        sa_pub.write_bytes(sa_public)

        self.admin_token = secrets.token_urlsafe(32)
        tokens = pki / "tokens.csv"
        tokens.touch(mode=0o600)
        tokens.write_text(
            f'{self.admin_token},envtest-token-admin,envtest-token-admin,"system:masters"\n'
        )

        api_port = _free_port()
        self.server = f"https://{self.node_address or '127.0.0.1'}:{api_port}"
        self._prepare_storage(binaries)
        self.etcd_url = self.storage_processes[self.storage].url
        overrides = {
            key: self.storage_processes[backend].url
            for key, backend in self.storage_overrides.items()
        }
        override_args = (
            {"--etcd-servers-overrides": servers_overrides_flag(overrides)} if overrides else {}
        )
        audit_args: dict[str, str] = {}
        if self.audit_policy is not None:
            policy = self.workdir / "audit-policy.yaml"
            policy.write_text(self.audit_policy)
            self.audit_log = self.workdir / "audit.log"
            audit_args = {
                "--audit-policy-file": str(policy),
                "--audit-log-path": str(self.audit_log),
                "--audit-log-maxsize": "0",
            }
        args = {
            "--etcd-servers": self.etcd_url,
            **override_args,
            "--bind-address": "127.0.0.1",
            "--advertise-address": "127.0.0.1",
            "--secure-port": str(api_port),
            "--tls-cert-file": str(serving_cert),
            "--tls-private-key-file": str(serving_key),
            "--client-ca-file": str(ca_file),
            "--service-cluster-ip-range": _SERVICE_CIDR,
            "--service-account-issuer": "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file": str(sa_pub),
            "--service-account-signing-key-file": str(sa_key),
            "--authorization-mode": "RBAC",
            "--token-auth-file": str(tokens),
            # No controller-manager creates default service accounts, so Pods would be
            # refused by this admission plugin; envtest disables it for the same reason.
            "--disable-admission-plugins": "ServiceAccount",
            "--allow-privileged": "true",
            "--profiling": "false",
            "--v": "1",
            **(self._node_args(pki) if self.node_address else {}),
            **audit_args,
            **feature_gate_args(self.feature_gates),
            **self.extra_apiserver_args,
        }
        self._apiserver = _Process(
            "kube-apiserver",
            [str(binaries.kube_apiserver), *(f"{flag}={value}" for flag, value in args.items())],
            self.workdir / "kube-apiserver.log",
        )
        admin = self._ca.issue_client("envtest-admin", ["system:masters"])
        admin_cert, admin_key = admin.write(pki, "admin")
        self._admin_ssl = ssl.create_default_context(cafile=str(ca_file))
        self._admin_ssl.load_cert_chain(str(admin_cert), str(admin_key))
        self.kubeconfig = self._write_kubeconfig("envtest-admin", admin.cert_pem, admin.key_pem)

        for process in self.storage_processes.values():
            process.start()
        self._apiserver.start()
        self._wait_ready()

    def _prepare_storage(self, binaries: Binaries) -> None:
        """One storage process per backend named by ``storage`` and the overrides."""
        backends = dict.fromkeys([self.storage, *self.storage_overrides.values()])
        kine = find_kine() if any(b != ETCD for b in backends) else None
        postgres = self.postgres
        if KINE_POSTGRES in backends and postgres is None:
            self._owned_postgres = start_local_postgres()
            postgres = self._owned_postgres
        for backend in backends:
            executable = binaries.etcd if backend == ETCD else kine
            assert executable is not None
            self.storage_processes[backend] = StorageProcess(
                backend,
                self.workdir,
                executable,
                postgres=postgres,
                extra_args=tuple(self.storage_args.get(backend, ())),
            )

    def _node_args(self, pki: Path) -> dict[str, str]:
        assert self._ca is not None and self.node_address is not None
        cert, key = self._ca.issue_client(
            "kube-apiserver-kubelet-client", ["system:masters"]
        ).write(pki, "kubelet-client")
        return {
            "--bind-address": self.node_address,
            "--advertise-address": self.node_address,
            "--authorization-mode": "Node,RBAC",
            "--disable-admission-plugins": "",
            "--kubelet-client-certificate": str(cert),
            "--kubelet-client-key": str(key),
            "--kubelet-preferred-address-types": "InternalIP",
        }

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            for proc in (*self.storage_processes.values(), self._apiserver):
                if proc is not None and not proc.running():
                    raise ControlPlaneError(
                        f"{proc.name} exited during start-up; last lines of its log:\n"
                        + proc.log_tail()
                    )
            try:
                status, body = self._request("GET", "/readyz")
                if status == 200:
                    return
                last_error = f"/readyz answered {status}: {body[:200]!r}"
            except OSError as err:
                last_error = str(err)
            time.sleep(0.1)
        tail = self._apiserver.log_tail() if self._apiserver else ""
        raise ControlPlaneError(
            f"kube-apiserver not ready after {self.start_timeout:.0f}s ({last_error}); "
            f"last lines of its log:\n{tail}"
        )

    def stop_apiserver(self) -> None:
        """Stop only the API server (the storage keeps the data), e.g. to test a restart."""
        if self._apiserver is None:
            raise ControlPlaneError("stop_apiserver needs a local control plane")
        self._apiserver.stop()

    def start_apiserver(self) -> None:
        """Start the API server again on the same port and wait until it is ready."""
        if self._apiserver is None:
            raise ControlPlaneError("start_apiserver needs a local control plane")
        self._apiserver.start()
        self._wait_ready()

    # -- requests as the admin -------------------------------------------------------------

    def _request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        if self._admin_ssl is None:
            raise ControlPlaneError("raw admin requests need a local control plane")
        host, port = self.server.removeprefix("https://").rsplit(":", 1)
        conn = http.client.HTTPSConnection(host, int(port), context=self._admin_ssl, timeout=10)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": content_type, "Accept": "application/json"}
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def kubectl(self, *args: str, kubeconfig: Path | None = None, check: bool = True) -> str:
        """Run kubectl against this control plane (as the admin unless told otherwise)."""
        binaries = self.binaries or (None if self.existing_cluster else find_binaries())
        kubectl = binaries.kubectl if binaries else None
        executable = str(kubectl) if kubectl else shutil.which("kubectl")
        if executable is None:
            raise ControlPlaneError("kubectl is not available; run `make binaries`")
        result = subprocess.run(
            [executable, f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result.stdout

    # -- CRDs --------------------------------------------------------------------------------

    def install_crds(self, source: Path | Iterable[Path], timeout: float = 30.0) -> list[str]:
        """Apply the CRDs in a directory (or files) and wait until they are established and
        served. Returns the CRD names."""
        files = sorted(source.glob("*.yaml")) if isinstance(source, Path) else list(source)
        crds: list[dict[str, Any]] = []
        with_crds: list[Path] = []  # a CRD directory may hold a kustomization.yaml too
        for path in files:
            for document in yaml.safe_load_all(path.read_text()):
                if (
                    isinstance(document, dict)
                    and document.get("kind") == "CustomResourceDefinition"
                ):
                    crds.append(document)
                    if path not in with_crds:
                        with_crds.append(path)
        if not crds:
            return []
        for path in with_crds:
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        names = [crd["metadata"]["name"] for crd in crds]
        self.kubectl(
            "wait",
            "--for=condition=Established",
            f"--timeout={int(timeout)}s",
            *(f"crd/{name}" for name in names),
        )
        self._wait_served(crds, timeout)
        return names

    def _wait_served(self, crds: Sequence[Mapping[str, Any]], timeout: float) -> None:
        """Discovery lags the Established condition briefly; wait until each is listed."""
        deadline = time.monotonic() + timeout
        for crd in crds:
            spec = crd["spec"]
            plural = spec["names"]["plural"]
            for version in spec["versions"]:
                if not version.get("served", True):
                    continue
                path = f"/apis/{spec['group']}/{version['name']}"
                while True:
                    if self.existing_cluster:
                        out = self.kubectl("get", "--raw", path, check=False)
                        served = f'"name":"{plural}"' in out
                    else:
                        status, body = self._request("GET", path)
                        served = status == 200 and f'"name":"{plural}"'.encode() in body
                    if served:
                        break
                    if time.monotonic() > deadline:
                        raise ControlPlaneError(f"{plural}.{spec['group']} not served at {path}")
                    time.sleep(0.05)

    # -- identities --------------------------------------------------------------------------

    def mint_identity(self, user: str, groups: Sequence[str] = ()) -> Identity:
        """A kubeconfig for ``user`` in ``groups``; RBAC gives it nothing until bound.

        On the local control plane this is a client certificate. On an existing cluster only
        service accounts can be minted (see :meth:`mint_service_account`).
        """
        if self._ca is None:
            raise ControlPlaneError(
                "minting a user needs the local control plane's CA; on an existing cluster use "
                "mint_service_account()"
            )
        pair = self._ca.issue_client(user, list(groups))
        path = self._write_kubeconfig(user, pair.cert_pem, pair.key_pem)
        return Identity(path, user, tuple(groups))

    def mint_service_account(self, namespace: str, name: str) -> Identity:
        """A kubeconfig that authenticates as ``system:serviceaccount:<namespace>:<name>``.

        The ServiceAccount object is created when missing (RBAC subjects of kind
        ServiceAccount need no object, but an existing cluster's token API does).
        """
        user = f"system:serviceaccount:{namespace}:{name}"
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")
        if self._ca is not None:
            pair = self._ca.issue_client(user, list(groups))
            path = self._write_kubeconfig(f"sa-{namespace}-{name}", pair.cert_pem, pair.key_pem)
            return Identity(path, user, groups)
        self.kubectl("create", "serviceaccount", name, "-n", namespace, check=False)
        token = self.kubectl("create", "token", name, "-n", namespace, "--duration=2h").strip()
        path = self._write_token_kubeconfig(f"sa-{namespace}-{name}", token)
        return Identity(path, user, groups)

    # -- kubeconfig files --------------------------------------------------------------------

    def _write_kubeconfig(self, name: str, cert_pem: bytes, key_pem: bytes) -> Path:
        assert self._ca is not None
        return self._write_config(
            name,
            {
                "client-certificate-data": base64.b64encode(cert_pem).decode(),
                "client-key-data": base64.b64encode(key_pem).decode(),
            },
            cluster={
                "server": self.server,
                "certificate-authority-data": base64.b64encode(self._ca.cert_pem).decode(),
            },
        )

    def _write_token_kubeconfig(self, name: str, token: str) -> Path:
        current = yaml.safe_load(self.kubeconfig.read_text())
        context = next(
            c for c in current["contexts"] if c["name"] == current.get("current-context")
        )
        cluster = next(
            c["cluster"] for c in current["clusters"] if c["name"] == context["context"]["cluster"]
        )
        return self._write_config(name, {"token": token}, cluster=cluster)

    def _write_config(self, name: str, user: Mapping[str, str], cluster: Mapping[str, Any]) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "envtest", "cluster": dict(cluster)}],
            "users": [{"name": name, "user": dict(user)}],
            "contexts": [{"name": name, "context": {"cluster": "envtest", "user": name}}],
            "current-context": name,
        }
        path = self.workdir / f"kubeconfig-{name.replace(':', '_')}.yaml"
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(config))
        return path

    def _connect_existing(self) -> None:
        source = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(
            Path.home() / ".kube" / "config"
        )
        if not Path(source).is_file():
            raise ControlPlaneError(
                f"USE_EXISTING_CLUSTER is set but there is no kubeconfig at {source}; "
                "set KUBECONFIG"
            )
        self.kubeconfig = Path(source)
        with contextlib.suppress(ControlPlaneError):
            self.server = self.kubectl(
                "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"
            ).strip()
