"""Storage backends of the local control plane: etcd, or kine over SQLite or PostgreSQL.

``ControlPlane(storage=...)`` picks one of :data:`BACKENDS`:

``etcd`` (the default)
    etcd, as before: one member on loopback, ``--unsafe-no-fsync``.
``kine-sqlite``
    kine (an etcd API over SQL, k3s's default storage) on an SQLite file in the control
    plane's directory, WAL journal, ``synchronous=OFF``.
``kine-postgres``
    kine on a database of its own (``kine_<random>``, created by kine, dropped at stop) in a
    PostgreSQL server: the one given to the control plane, or else a throwaway local server
    it starts and stops itself (:class:`controller_runtime.envtest.postgres.LocalPostgres`,
    ``fsync=off``; needs the ``postgresql`` package's binaries). The database is dropped, and
    its size read, with ``psql`` (the ``postgresql-client`` package).

None of the three is durable, on purpose: they are for tests and benchmarks, and durability
off for each makes their numbers comparable.

``storage_overrides={"/events": "kine-postgres"}`` sends chosen resources (``group/resource``;
the core group is empty, ``"/configmaps"``) to another backend through the API server's
``--etcd-servers-overrides``; everything else stays on ``storage``. One process is started
per backend named (an override naming the main backend shares it).

kube-apiserver applies ``--etcd-servers-overrides`` only to the resources compiled into it:
for a custom resource (``tasks.crpy.io/tasks``) the flag is accepted and silently ignored,
and its objects stay on the main storage (kubernetes/kubernetes#118858; the flag's own help
says so since v1.36). An override naming a group that cannot be built in is therefore
refused here, with that reason; to keep custom resources on SQL, make that the main
storage (``storage="kine-postgres"``).

Guarantees:

* Every listener is on 127.0.0.1: kine's defaults (``0.0.0.0:2379`` for its etcd API, ``:8080``
  for metrics) are both overridden, with free ports.
* The database password of ``kine-postgres`` reaches kine through its environment
  (``PGPASSWORD``), never its command line or a log.
* Processes die with the thread that started them (``PR_SET_PDEATHSIG``), like etcd's.

The default storage of every control plane in a process is ``etcd`` unless
``CRPY_ENVTEST_STORAGE`` names another backend: that is how ``make test-storage`` runs whole
suites on kine without changing them.

What kine does not do that etcd does, as far as the API server can tell
(docs/informers.md, "Storage backends", has the tests that show each):

* compaction: kine ignores a compaction's target when fewer than ``--compact-min-retain``
  (1000) revisions would remain, so a watcher is expired (410) only once it is more than 1000
  revisions behind; the API server still asks (``--etcd-compaction-interval``), and etcd's
  own gRPC-gateway (``/v3/kv/compaction``) does not exist on kine: compaction happens only
  through the API server;
* some etcd range options (``serializable``, sorting, revision bounds) answer "unsupported";
  the API server does not use them.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import signal
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from controller_runtime.envtest.postgres import LocalPostgres, PostgresNotFoundError, psql

log = logging.getLogger(__name__)

ETCD = "etcd"
KINE_SQLITE = "kine-sqlite"
KINE_POSTGRES = "kine-postgres"
BACKENDS = (ETCD, KINE_SQLITE, KINE_POSTGRES)
"""The storage names :func:`check_storage` accepts."""

STORAGE_ENV = "CRPY_ENVTEST_STORAGE"
KINE_POSTGRES_CONNECTIONS = 300
"""``max_connections`` of a PostgreSQL server the control plane starts for kine. kine keeps no
upper bound on its pool by default (about one connection per request in flight), and with one
(``--datastore-max-open-connections=20``) it stalled here under the API server's concurrency:
of 600 creates 64 at a time, 30 went through, the rest timed out (504). So the server must
allow what the API server sends, not the other way round."""
_PR_SET_PDEATHSIG = 1


class StorageError(RuntimeError):
    """A storage backend is unknown, or failed to start."""


def check_storage(name: str) -> str:
    """``name`` if it is one of :data:`BACKENDS`, else :class:`StorageError` saying which are."""
    if name not in BACKENDS:
        raise StorageError(f"unknown storage {name!r}; expected one of {', '.join(BACKENDS)}")
    return name


def default_storage() -> str:
    """``$CRPY_ENVTEST_STORAGE`` when set (checked), else ``etcd``."""
    return check_storage(os.environ.get(STORAGE_ENV, "").strip() or ETCD)


_BUILT_IN_GROUPS_WITHOUT_DOMAIN = frozenset({"", "apps", "autoscaling", "batch", "policy"})


def is_built_in_group(group: str) -> bool:
    """Whether kube-apiserver can have ``group`` compiled in: the core group, the legacy
    groups without a domain, and ``*.k8s.io``. Any other group is served for custom
    resources (or by an aggregated API server), never from the API server's own storage
    configuration."""
    return group in _BUILT_IN_GROUPS_WITHOUT_DOMAIN or group.endswith(".k8s.io")


def check_overrides(overrides: Mapping[str, str]) -> dict[str, str]:
    """Validated ``{"group/resource": backend}``: one slash, a resource name, a known backend,
    and a group that can be built in (see the module docs for why custom resources cannot
    be moved). The core group is the empty group (``"/configmaps"``)."""
    checked: dict[str, str] = {}
    for key, backend in overrides.items():
        group, sep, resource = key.partition("/")
        if not sep or not resource or "/" in resource or any(c in key for c in "#,; "):
            raise StorageError(
                f"storage override {key!r}: expected 'group/resource' (e.g. "
                "'coordination.k8s.io/leases', or '/events' for the core group)"
            )
        if not is_built_in_group(group):
            raise StorageError(
                f"storage override {key!r}: kube-apiserver applies --etcd-servers-overrides "
                "only to resources compiled into it, and ignores it for custom resources "
                "(their objects would stay on the main storage); make the main storage "
                f"{backend!r} instead (storage={backend!r}), or override a built-in resource"
            )
        checked[f"{group}/{resource}"] = check_storage(backend)
    return checked


def servers_overrides_flag(urls: Mapping[str, str]) -> str:
    """The value of ``--etcd-servers-overrides`` for ``{"group/resource": url}``."""
    return ",".join(f"{key}#{url}" for key, url in sorted(urls.items()))


class PostgresServer(Protocol):
    """Where ``kine-postgres`` keeps its databases: a superuser's address and password
    (:class:`~controller_runtime.envtest.postgres.LocalPostgres` is one)."""

    host: str
    port: int
    user: str
    password: str


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL it when the parent thread dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def directory_bytes(path: Path) -> int:
    """Bytes on disk (allocated blocks) of the files under ``path``."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


@dataclass
class StorageProcess:
    """One storage server (etcd or kine) of a control plane; :meth:`url` is its client URL.

    ``start`` returns at once: the API server waits for its storage, and the control plane's
    readiness check notices a storage process that exited.
    """

    backend: str
    workdir: Path
    executable: Path
    postgres: PostgresServer | None = None
    extra_args: tuple[str, ...] = ()
    """More flags for the process (``("--quota-backend-bytes=2147483648",)`` for etcd)."""
    port: int = field(init=False, default=0)
    metrics_port: int = field(init=False, default=0)
    """kine's Prometheus endpoint (``/metrics``), or etcd's peer port."""
    database: str = field(init=False, default="")
    popen: subprocess.Popen[bytes] | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        check_storage(self.backend)
        self.port, self.metrics_port = free_port(), free_port()
        if self.backend == KINE_POSTGRES:
            if self.postgres is None:
                raise StorageError("kine-postgres needs a PostgreSQL server")
            self.database = f"kine_{secrets.token_hex(6)}"

    @property
    def name(self) -> str:
        return self.backend if self.backend == ETCD else "kine"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.workdir / self.backend

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.backend}.log"

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The command line and environment (pure, given the ports and database)."""
        env = dict(os.environ)
        if self.backend == ETCD:
            peer = f"http://127.0.0.1:{self.metrics_port}"
            return [
                str(self.executable),
                f"--data-dir={self.data_dir}",
                f"--listen-client-urls={self.url}",
                f"--advertise-client-urls={self.url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
                *self.extra_args,
            ], env
        if self.backend == KINE_SQLITE:
            endpoint = (
                f"sqlite://{self.data_dir / 'state.db'}?_journal_mode=WAL&_busy_timeout=30000"
                "&_synchronous=OFF&_txlock=immediate"
            )
        else:
            assert self.postgres is not None
            endpoint = (
                f"postgres://{self.postgres.user}@{self.postgres.host}:{self.postgres.port}/"
                f"{self.database}?sslmode=disable"
            )
            env["PGPASSWORD"] = self.postgres.password
        return [
            str(self.executable),
            f"--endpoint={endpoint}",
            f"--listen-address=127.0.0.1:{self.port}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            "--log-format=json",
            *self.extra_args,
        ], env

    def start(self) -> None:
        """Start the process (again, after :meth:`stop`, on the same ports and data)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command, env = self.command()
        with open(self.log_path, "ab") as log_file:
            self.popen = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                # Not thread-safe in general; the callback only calls prctl, which is.
                preexec_fn=_die_with_parent,  # noqa: PLW1509
            )

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None and self.running() else None

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the process (SIGTERM, SIGKILL after ``timeout``); the data stays. Idempotent."""
        if self.popen is not None:
            if self.popen.poll() is None:
                self.popen.terminate()
                try:
                    self.popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait()
            self.popen = None

    def remove(self) -> None:
        """Stop, and for ``kine-postgres`` drop the database. Idempotent."""
        self.stop()
        if self.database and self.postgres is not None:
            try:
                self._drop_database()
            except Exception as err:  # a leftover database is no reason to fail a stop
                log.warning("could not drop kine's database %s: %s", self.database, err)
            self.database = ""

    def _sql(self, statement: str) -> str:
        assert self.postgres is not None
        return psql(
            host=self.postgres.host,
            port=self.postgres.port,
            user=self.postgres.user,
            password=self.postgres.password,
            sql=statement,
        )

    def _drop_database(self) -> None:
        self._sql(f"DROP DATABASE IF EXISTS {_identifier(self.database)} WITH (FORCE)")

    def disk_bytes(self) -> int:
        """Bytes the stored data takes on disk: the data directory (etcd, SQLite with its
        WAL), or ``pg_database_size`` of kine's database."""
        if self.backend != KINE_POSTGRES:
            return directory_bytes(self.data_dir)
        answer = self._sql(f"SELECT pg_database_size({_literal(self.database)})").strip()
        return int(answer) if answer else 0

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class OwnedPostgres(PostgresServer, Protocol):
    """A PostgreSQL server the control plane started, and stops."""

    @property
    def pid(self) -> int | None: ...

    def stop(self) -> None: ...


def _identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    """``text`` as a quoted SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def start_local_postgres() -> OwnedPostgres:
    """A throwaway PostgreSQL server on loopback for ``kine-postgres``
    (:class:`~controller_runtime.envtest.postgres.LocalPostgres`); ``StorageError`` saying
    what to install when PostgreSQL's binaries are missing."""
    server = LocalPostgres(max_connections=KINE_POSTGRES_CONNECTIONS)
    try:
        server.start()
    except PostgresNotFoundError as err:
        raise StorageError(f"kine-postgres needs PostgreSQL: {err}") from err
    return server
