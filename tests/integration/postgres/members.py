"""Members of a replicated PostgresInstance on this machine, without Pods: for each member the
real supervisor (the postgres container's entrypoint, bash, run as the ``postgres`` user with
the local PostgreSQL binaries) and the real agent (in this process, reading the instance from
the test's API server), each member on its own loopback port, data directory and shared
directory. What runs in a Pod runs here, but for the container runtime and the network.

Faults: :meth:`LocalMembers.kill_postmaster` (SIGKILL the postmaster, as from the host),
:meth:`LocalMembers.terminate` (SIGTERM the supervisor, as the kubelet does when the Pod is
deleted), :meth:`LocalMembers.cut_agent` (the agent can no longer read the API server).
Every process dies with the test process (``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from controllers.postgres import agent as agent_module
from controllers.postgres.agent import Agent, AgentSettings
from controllers.postgres.localserver import find_bindir
from controllers.postgres.render import pg_hba_conf, postgresql_conf
from controllers.postgres.supervisor import SCRIPT
from kubeclient.config import ClusterConfig
from kubeclient.transport import Transport

_PR_SET_PDEATHSIG = 1


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _as_postgres(uid: int, gid: int) -> Callable[[], None]:
    def setup() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return setup


class _CutTransport(Transport):
    """A transport whose requests fail while ``cut`` is set (the agent's API link)."""

    cut = False

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if self.cut:
            raise OSError("network is unreachable (cut by the test)")
        return await super().request(method, path, **kwargs)


@dataclass
class Member:
    name: str
    root: Path
    port: int
    agent_port: int
    process: subprocess.Popen[bytes] | None = None
    agent_task: asyncio.Task[None] | None = None
    agent_stop: asyncio.Event = field(default_factory=asyncio.Event)
    transport: _CutTransport | None = None
    agent: Agent | None = None

    @property
    def pgdata(self) -> Path:
        return self.root / "data" / "pgdata"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def sockets(self) -> Path:
        return self.root / "sockets"

    def log(self) -> str:
        try:
            return (self.root / "supervisor.log").read_text(errors="replace")
        except OSError:
            return ""


class LocalMembers:
    """``count`` members ``<instance>-0`` … of ``namespace/instance`` (module docs)."""

    def __init__(
        self,
        config: ClusterConfig,
        namespace: str,
        instance: str,
        count: int,
        spec: Mapping[str, Any],
    ) -> None:
        self.config = config
        self.namespace = namespace
        self.instance = instance
        self.spec = spec
        self.bindir = find_bindir()
        entry = pwd.getpwnam("postgres")
        self.ids = (entry.pw_uid, entry.pw_gid)
        self.workdir = Path(tempfile.mkdtemp(prefix="crpy-members-"))
        os.chown(self.workdir, *self.ids)
        self.password = secrets.token_urlsafe(18)
        self.replication_password = secrets.token_urlsafe(18)
        self.members = [
            Member(f"{instance}-{i}", self.workdir / f"m{i}", _free_port(), _free_port())
            for i in range(count)
        ]
        self.peers = {m.name: f"127.0.0.1 {m.port}" for m in self.members}
        (self.workdir / "conf").mkdir()
        (self.workdir / "conf" / "postgresql.conf").write_text(postgresql_conf(spec))
        (self.workdir / "conf" / "pg_hba.conf").write_text(pg_hba_conf(spec))
        (self.workdir / "supervisor.sh").write_text(SCRIPT)
        for path in (self.workdir / "conf", self.workdir / "supervisor.sh"):
            path.chmod(0o755)

    def __getitem__(self, index: int) -> Member:
        return self.members[index]

    def by_name(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    # -- life ---------------------------------------------------------------------------------

    async def start(self, index: int | None = None) -> None:
        for member in self.members if index is None else [self.members[index]]:
            for path in (member.root, member.root / "data", member.run, member.sockets):
                path.mkdir(exist_ok=True)
                os.chown(path, *self.ids)
            self.start_supervisor(member)
            await self.start_agent(member)

    def start_supervisor(self, member: Member) -> None:
        env = {
            "PATH": f"{self.bindir}:/usr/local/bin:/usr/bin:/bin",
            "PGDATA": str(member.pgdata),
            "CRPY_RUN": str(member.run),
            "CRPY_CONFIG_DIR": str(self.workdir / "conf"),
            "CRPY_SOCKET_DIR": str(member.sockets),
            "PGPORT": str(member.port),
            "CRPY_MEMBER": member.name,
            "CRPY_TERM_WAIT": "20",
            "POSTGRES_USER": "postgres",
            "POSTGRES_PASSWORD": self.password,
            "REPLICATION_PASSWORD": self.replication_password,
            "POSTGRES_INITDB_ARGS": "--no-sync",
            "LANG": "C.UTF-8",
        }
        log = open(member.root / "supervisor.log", "ab")  # noqa: SIM115 (the child keeps it)
        member.process = subprocess.Popen(
            ["/bin/bash", str(self.workdir / "supervisor.sh")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(member.root),
            preexec_fn=_as_postgres(*self.ids),  # noqa: PLW1509 (the main thread)
        )
        log.close()

    async def start_agent(self, member: Member) -> None:
        settings = AgentSettings(
            member=member.name,
            namespace=self.namespace,
            instance=self.instance,
            headless=f"{self.instance}-headless",
            run_dir=member.run,
            socket_dir=str(member.sockets),
            pg_port=member.port,
            port=member.agent_port,
            host="127.0.0.1",
            peers=self.peers,
        )
        member.transport = _CutTransport(self.config, max_retries=0)
        member.agent_stop = asyncio.Event()

        async def run() -> None:
            assert member.transport is not None
            member.agent = Agent(settings, member.transport)
            await agent_module.run_agent(member.agent, settings, member.agent_stop)

        member.agent_task = asyncio.create_task(run())

    def kill_postmaster(self, index: int) -> int:
        """SIGKILL the member's postmaster (its pid from ``postmaster.pid``)."""
        pid = int((self.members[index].pgdata / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        return pid

    def terminate(self, index: int) -> None:
        """SIGTERM the supervisor, as the kubelet does when the Pod is deleted."""
        process = self.members[index].process
        assert process is not None
        process.send_signal(signal.SIGTERM)

    def cut_agent(self, index: int, cut: bool = True) -> None:
        transport = self.members[index].transport
        assert transport is not None
        transport.cut = cut

    async def stop_member(self, index: int, timeout: float = 60) -> int | None:
        """SIGTERM the supervisor, wait for it to exit, stop the agent; the exit status."""
        member = self.members[index]
        code = None
        if member.process is not None:
            if member.process.poll() is None:
                member.process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(member.process.wait, timeout)
        await self.stop_agent(index)
        return code

    async def stop_agent(self, index: int) -> None:
        member = self.members[index]
        member.agent_stop.set()
        if member.agent_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(member.agent_task, 10)
        if member.transport is not None:
            await member.transport.close()

    async def close(self) -> None:
        """Stop everything at once (the data goes with it: no clean shutdown needed)."""
        for index, member in enumerate(self.members):
            await self.stop_agent(index)
            if member.process is not None and member.process.poll() is None:
                member.process.kill()
                await asyncio.to_thread(member.process.wait, 30)
            # Its postmaster outlives it (a child's death signal is not inherited).
            with contextlib.suppress(OSError, ValueError):
                pid = int((member.pgdata / "postmaster.pid").read_text().split()[0])
                os.kill(pid, signal.SIGQUIT)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(
            f"--- {m.name} (port {m.port}, agent {m.agent_port})\n{m.log()[-4000:]}"
            for m in self.members
        )

    # -- looking at them ----------------------------------------------------------------------

    async def status(self, index: int) -> dict[str, Any] | None:
        member = self.members[index]
        try:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{member.agent_port}/status"
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=3)) as answer:
                    data: dict[str, Any] = await answer.json()
                    return data
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
            return None

    def conninfo(self, index: int, **extra: Any) -> dict[str, Any]:
        member = self.members[index]
        return {
            "host": "127.0.0.1",
            "port": member.port,
            "user": "postgres",
            "password": self.password,
            "dbname": "postgres",
            "connect_timeout": 3,
            **extra,
        }

    async def query(self, index: int, sql: str) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(
            **self.conninfo(index), autocommit=True
        ) as conn:
            cur = await conn.execute(sql)
            return await cur.fetchall() if cur.description else []


@contextlib.asynccontextmanager
async def local_members(
    config: ClusterConfig, namespace: str, instance: str, count: int, spec: Mapping[str, Any]
) -> AsyncIterator[LocalMembers]:
    members = LocalMembers(config, namespace, instance, count, spec)
    try:
        await members.start()
        yield members
    finally:
        await members.close()
