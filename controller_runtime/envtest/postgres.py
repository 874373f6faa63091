"""A throwaway PostgreSQL server on loopback: the local control plane's ``kine-postgres``
storage, and the tests and ``make run`` of a PostgreSQL operator.

:class:`LocalPostgres` runs ``initdb`` into a fresh temporary directory and starts
``postgres`` on a free port of 127.0.0.1 (plus a Unix socket in the same directory), with a
generated password for the superuser ``postgres`` and SCRAM authentication. Durability is
off (``fsync``, ``full_page_writes``): it is for throwaway data only.

Guarantees:

* :meth:`LocalPostgres.stop` (or leaving the ``with`` block) shuts the server down (fast
  shutdown, then SIGKILL after 20 s) and removes the directory.
* The server is started with ``PR_SET_PDEATHSIG``: it dies with the thread that started it,
  even on SIGKILL, so no orphan outlives a crashed test run; directories left behind by such
  a run are swept at the next start. Start it from a thread that lives as long as the server
  (the main thread), not from a worker thread.
* As root, PostgreSQL refuses to run: ``initdb`` and ``postgres`` then run as the
  ``postgres`` system user (which the Debian package creates), and the directory is owned by
  it.

Binaries: ``$PG_BINDIR`` if set, else the directory of ``initdb`` on ``$PATH`` (symlinks
resolved), else the newest ``/usr/lib/postgresql/<version>/bin`` (Debian, Ubuntu), else
``/usr/pgsql-<version>/bin`` (RHEL): the ``postgresql`` package (Debian, Ubuntu: ``apt
install postgresql``; this repository's ``scripts/ensure-postgres.sh`` installs it).
:func:`psql` runs the client of the same directory (or the one on ``$PATH``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LocalPostgres", "PostgresNotFoundError", "find_bindir", "psql"]

_TMP_PREFIX = "crpy-postgres-"
_PR_SET_PDEATHSIG = 1
START_TIMEOUT = 30.0


class PostgresNotFoundError(RuntimeError):
    """No PostgreSQL server binaries were found."""


def find_bindir() -> Path:
    """The directory holding ``initdb`` and ``postgres``; see the module docs for the order."""
    candidates: list[Path] = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(Path(os.environ["PG_BINDIR"]))
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)

    def version_of(path: Path) -> tuple[int, ...]:
        found = re.search(r"(\d+(?:\.\d+)*)", str(path))
        return tuple(int(p) for p in found[1].split(".")) if found else (0,)

    for pattern in ("usr/lib/postgresql/*/bin", "usr/pgsql-*/bin"):
        found = sorted(Path("/").glob(pattern), key=version_of, reverse=True)
        candidates.extend(found)
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "postgres").is_file():
            return directory
    raise PostgresNotFoundError(
        "PostgreSQL server binaries (initdb, postgres) not found: install the 'postgresql' "
        "package (in this repository: scripts/ensure-postgres.sh, as root), or set PG_BINDIR"
    )


def psql(
    *,
    host: str,
    port: int,
    user: str,
    password: str,
    sql: str,
    dbname: str = "postgres",
    timeout: float = 30.0,
) -> str:
    """Run one SQL statement with ``psql`` (unaligned, tuples only) and return its output.
    The password reaches psql through its environment (``PGPASSWORD``), never its command
    line. ``psql`` is the one beside ``initdb`` (see :func:`find_bindir`), else the one on
    ``$PATH``; ``PostgresNotFoundError`` says what to install when there is none, and
    ``RuntimeError`` carries psql's error when the statement fails."""
    candidates = []
    with contextlib.suppress(PostgresNotFoundError):
        candidates.append(find_bindir() / "psql")
    on_path = shutil.which("psql")
    if on_path:
        candidates.append(Path(on_path))
    executable = next((c for c in candidates if c.is_file()), None)
    if executable is None:
        raise PostgresNotFoundError(
            "the PostgreSQL client psql was not found: install the 'postgresql-client' package"
        )
    environment = {**os.environ, "PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10"}
    result = subprocess.run(
        [
            *(str(executable), "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"),
            *("-h", host, "-p", str(port), "-U", user, "-d", dbname, "-c", sql),
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"psql failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _sweep_stale_directories() -> None:
    for directory in Path(tempfile.gettempdir()).glob(f"{_TMP_PREFIX}*"):
        try:
            pid = int((directory / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if not Path(f"/proc/{pid}").exists():
            shutil.rmtree(directory, ignore_errors=True)


def _child_setup(uid: int | None, gid: int | None, *, die_with_parent: bool) -> Callable[[], None]:
    """Runs in the child between fork and exec: drop to ``uid``/``gid``, then ask for SIGKILL
    when the parent thread dies (after the switch: changing credentials clears it)."""

    def setup() -> None:
        if uid is not None and gid is not None:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        if die_with_parent:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return setup


@dataclass
class LocalPostgres:
    """A local server; see the module docs. ``host``/``port``/``user``/``password`` are
    valid once :meth:`start` returned. The password is kept out of ``repr``."""

    bindir: Path | None = None
    host: str = "127.0.0.1"
    port: int = 0
    user: str = "postgres"
    password: str = field(default="", repr=False)
    max_connections: int = 50
    workdir: Path | None = None
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _ids: tuple[int, int] | None = field(default=None, repr=False)

    def __enter__(self) -> LocalPostgres:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def version(self) -> str:
        """The server's ``MAJOR.MINOR``, from ``postgres --version``."""
        out = subprocess.run(
            [str(self._bindir() / "postgres"), "--version"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found = re.search(r"(\d+(?:\.\d+)?)", out)
        return found[1] if found else ""

    def _bindir(self) -> Path:
        if self.bindir is None:
            self.bindir = find_bindir()
        return self.bindir

    def _run_as(self) -> tuple[int, int] | None:
        if os.geteuid() != 0:
            return None
        try:
            entry = pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresNotFoundError(
                "running as root, but there is no 'postgres' system user to run the server as "
                "(install the postgresql package, which creates it)"
            ) from None
        return entry.pw_uid, entry.pw_gid

    def start(self) -> None:
        """initdb, start, and wait until the server accepts connections (30 s)."""
        bindir = self._bindir()
        _sweep_stale_directories()
        self._ids = ids = self._run_as()
        uid, gid = ids if ids else (None, None)
        self.workdir = workdir = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX))
        (workdir / "owner.pid").write_text(str(os.getpid()))
        if ids:
            os.chown(workdir, *ids)
        self.password = secrets.token_urlsafe(24)
        pwfile = workdir / "pwfile"
        pwfile.touch(mode=0o600)
        pwfile.write_text(self.password + "\n")
        if ids:
            os.chown(pwfile, *ids)
        try:
            subprocess.run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(workdir / "data"),
                    "-U",
                    self.user,
                    f"--pwfile={pwfile}",
                    "--auth=scram-sha-256",
                    "--encoding=UTF8",
                    "--no-locale",
                    "--no-sync",
                ],
                check=True,
                capture_output=True,
                preexec_fn=_child_setup(uid, gid, die_with_parent=False),
            )
        except subprocess.CalledProcessError as err:
            self.stop()
            raise RuntimeError(f"initdb failed: {err.stderr.decode(errors='replace')}") from err
        finally:
            pwfile.unlink(missing_ok=True)
        for _ in range(3):  # a free port may be taken before the server binds it
            self.port = _free_port()
            if self._start_server(uid, gid):
                return
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"postgres did not start:\n{tail}")

    def _start_server(self, uid: int | None, gid: int | None) -> bool:
        assert self.workdir is not None
        log_path = self.workdir / "postgres.log"
        with open(log_path, "ab") as log_file:
            if uid is not None and gid is not None:
                os.chown(log_path, uid, gid)
            self._popen = subprocess.Popen(
                [
                    str(self._bindir() / "postgres"),
                    "-D",
                    str(self.workdir / "data"),
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.workdir),
                    "-c",
                    f"listen_addresses={self.host}",
                    "-c",
                    "fsync=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    f"max_connections={self.max_connections}",
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_child_setup(uid, gid, die_with_parent=True),  # noqa: PLW1509
            )
        pid_file = self.workdir / "data" / "postmaster.pid"
        deadline = time.monotonic() + START_TIMEOUT
        # Nothing to await: poll the status line the postmaster writes ("ready" once it
        # accepts connections), with a deadline.
        while time.monotonic() < deadline:
            if self._popen.poll() is not None:
                return False
            with contextlib.suppress(OSError):
                lines = pid_file.read_text().splitlines()
                if len(lines) >= 8 and lines[7].strip() == "ready":
                    return True
            time.sleep(0.05)
        return False

    def log_tail(self, lines: int = 30) -> str:
        if self.workdir is None:
            return ""
        try:
            text = (self.workdir / "postgres.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Fast shutdown (SIGINT), SIGKILL after 20 s; remove the directory. Idempotent."""
        if self._popen is not None:
            if self._popen.poll() is None:
                self._popen.send_signal(signal.SIGINT)
                try:
                    self._popen.wait(20)
                except subprocess.TimeoutExpired:
                    self._popen.kill()
                    self._popen.wait()
            self._popen = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def conninfo(self, dbname: str = "postgres") -> dict[str, object]:
        """Keyword arguments for ``psycopg.connect`` as the superuser."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "dbname": dbname,
        }
