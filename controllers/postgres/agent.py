"""The agent that runs beside PostgreSQL in every Pod of an in-cluster PostgresInstance
(``python -m controllers.postgres.agent``, a sidecar in the operator's image).

Every second (at once when the operator calls ``POST /refresh``) it reads its instance from
the API server with the Pod's ServiceAccount (a quorum read: ``get`` on that one
PostgresInstance is all its Role allows), asks the local server how it stands (over the
Unix socket), applies the rules of :mod:`controllers.postgres.standing` and writes the
supervisor's ``desired`` file (then wakes it through the ``wake`` pipe). It serves, on
``CRPY_AGENT_PORT`` (default 8008, every address of the Pod: the operator calls it):

- ``GET /status``: the member's report (JSON, :class:`~controllers.postgres.standing.Report`),
  observed when asked: role, readiness, timeline, received and replayed LSN, the member it
  streams from, ``pg_stat_replication`` on a primary. Read-only; it holds no secret (no
  authentication: anyone who reaches the Pod may read WAL positions and roles);
- ``POST /refresh``: read the standing now (at most ten times a second);
- ``GET /healthz``: the process runs.

Environment: ``POD_NAME`` (the member), ``POD_NAMESPACE``, ``CRPY_INSTANCE``,
``CRPY_HEADLESS`` (the headless Service: members are ``<member>.<headless>``), ``CRPY_RUN``
(``/run/crpy-ha``), ``CRPY_SOCKET_DIR`` (``/var/run/postgresql``), ``PGPORT`` (5432),
``POSTGRES_USER`` (``postgres``), ``CRPY_PEERS`` (JSON ``{member: "host port"}``: addresses
other than the headless Service's, for tests), ``CRPY_AGENT_PORT``. The API server is found as
``kubectl`` finds it (``KUBECONFIG``, else the Pod's service account).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg
from aiohttp import web

from controller_runtime.client import Transport
from controller_runtime.config import ClusterConfig, load_config
from controller_runtime.errors import ApiError
from controllers.postgres.standing import (
    AgentState,
    Desired,
    Postgres,
    Replica,
    Standing,
    SupervisorState,
    decide,
    parse_lsn,
    report,
    standing_of,
    supervisor_state,
)

log = logging.getLogger("controllers.postgres.agent")

AGENT_PORT = 8008
INTERVAL = 1.0
READ_TIMEOUT = 2.0
"""Seconds one read of the instance may take (it is retried at the next round)."""
API_PATH = "/apis/postgres.crpy.io/v1beta1/namespaces/{namespace}/postgresinstances/{name}"
WAITING_FOR_WAL = frozenset({"RecoveryWalStream", "RecoveryRetrieveRetryInterval"})
"""The startup process's wait events once a standby has replayed every WAL record it has."""


def boottime() -> float:
    """The monotonic clock the agent's rules use (it counts suspended time too)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class AgentSettings:
    member: str
    namespace: str
    instance: str
    headless: str = ""
    run_dir: Path = Path("/run/crpy-ha")
    socket_dir: str = "/var/run/postgresql"
    pg_port: int = 5432
    superuser: str = "postgres"
    port: int = AGENT_PORT
    host: str = "0.0.0.0"
    """Every address of the Pod: the operator calls the agent on the Pod's address."""
    interval: float = INTERVAL
    peers: Mapping[str, str] = field(default_factory=dict)
    """``{member: "host port"}``; members not named are ``<member>.<headless> 5432``."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> AgentSettings:
        missing = [k for k in ("POD_NAME", "POD_NAMESPACE", "CRPY_INSTANCE") if not env.get(k)]
        if missing:
            raise SystemExit(f"the agent needs {', '.join(missing)} in its environment")
        peers = json.loads(env["CRPY_PEERS"]) if env.get("CRPY_PEERS") else {}
        return cls(
            member=env["POD_NAME"],
            namespace=env["POD_NAMESPACE"],
            instance=env["CRPY_INSTANCE"],
            headless=env.get("CRPY_HEADLESS", f"{env['CRPY_INSTANCE']}-headless"),
            run_dir=Path(env.get("CRPY_RUN", "/run/crpy-ha")),
            socket_dir=env.get("CRPY_SOCKET_DIR", "/var/run/postgresql"),
            pg_port=int(env.get("PGPORT", "5432")),
            superuser=env.get("POSTGRES_USER", "postgres"),
            port=int(env.get("CRPY_AGENT_PORT", str(AGENT_PORT))),
            peers={str(k): str(v) for k, v in peers.items()},
        )

    def address_of(self, member: str) -> str:
        return self.peers.get(member) or f"{member}.{self.headless} {self.pg_port}"


class _Members(dict[str, str]):
    """``member -> "host port"`` for any member name (computed on demand)."""

    def __init__(self, settings: AgentSettings) -> None:
        super().__init__()
        self.settings = settings

    def __missing__(self, member: str) -> str:
        return self.settings.address_of(member)

    def get(self, member: str, default: Any = None) -> Any:
        return self[member] if member else default


class _Hosts(dict[str, str]):
    """``"host port" -> member`` for the WAL receiver's upstream."""

    def __init__(self, settings: AgentSettings) -> None:
        super().__init__({v: k for k, v in settings.peers.items()})
        self.suffix = f".{settings.headless} {settings.pg_port}"

    def get(self, host: str, default: Any = None) -> Any:
        if host in self:
            return self[host]
        if host.endswith(self.suffix):
            return host[: -len(self.suffix)]
        return default


class Agent:
    """One member's agent (module docs)."""

    def __init__(self, settings: AgentSettings, transport: Transport) -> None:
        self.settings = settings
        self.transport = transport
        self.state = AgentState()
        self.members = _Members(settings)
        self.hosts = _Hosts(settings)
        self.wake = asyncio.Event()
        self.seq = 0
        self.reading_ok: bool | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._last_refresh = 0.0

    # -- the round ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.round()
            except Exception:  # one bad round must not end the agent
                log.exception("round failed")
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.interval):
                    waiters = [
                        asyncio.create_task(self.wake.wait()),
                        asyncio.create_task(stop.wait()),
                    ]
                    try:
                        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for waiter in waiters:
                            waiter.cancel()

    async def round(self) -> None:
        started = boottime()
        standing = await self.read_standing()
        postgres = await self.observe_postgres()
        before = self.state
        self.state = decide(
            self.state,
            me=self.settings.member,
            standing=standing,
            read_started=started,
            now=boottime(),
            supervisor=self.supervisor(),
            postgres=postgres,
            address_of=self.members,
        )
        self._log_changes(before, self.state)
        self.write_desired(self.state.desired)

    async def read_standing(self) -> Standing | None:
        path = API_PATH.format(namespace=self.settings.namespace, name=self.settings.instance)
        try:
            answer = await self.transport.request("GET", path, timeout=READ_TIMEOUT, max_retries=0)
            standing = standing_of(orjson.loads(answer.body))
        except (ApiError, OSError, TimeoutError, ValueError) as err:
            if self.reading_ok is not False:
                log.warning("cannot read the instance's standing: %s", err)
            self.reading_ok = False
            return None
        if self.reading_ok is False:
            log.info("reading the instance's standing again")
        self.reading_ok = True
        return standing

    def supervisor(self) -> SupervisorState:
        try:
            return supervisor_state((self.settings.run_dir / "state").read_text())
        except OSError:
            return SupervisorState()

    def write_desired(self, desired: Desired) -> None:
        self.seq += 1
        target = self.settings.run_dir / "desired"
        temporary = target.with_name(".desired.tmp")
        temporary.write_text(desired.render(self.seq))
        temporary.replace(target)
        self.poke_supervisor()

    def poke_supervisor(self) -> None:
        try:
            fd = os.open(self.settings.run_dir / "wake", os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            if err.errno not in (errno.ENXIO, errno.ENOENT):
                log.debug("cannot wake the supervisor: %s", err)
            return
        try:
            os.write(fd, b"w\n")
        except OSError:
            pass  # the pipe is full: the supervisor has wake-ups enough
        finally:
            os.close(fd)

    def _log_changes(self, before: AgentState, after: AgentState) -> None:
        if after.intent_primary and not before.intent_primary:
            log.info("granted the primary role (grant %d)", after.grant)
        elif before.intent_primary and not after.intent_primary:
            log.info("the primary role is withdrawn")
        if after.desired.upstream != before.desired.upstream:
            log.info("follow %s", after.desired.upstream or "nobody")
        if after.desired.rewind != before.desired.rewind:
            log.info("asking for a rewind: not streaming from %s", after.desired.upstream)
        if after.desired.sync_names != before.desired.sync_names:
            log.info("synchronous_standby_names override: %r", after.desired.sync_names)

    # -- the local server --------------------------------------------------------------------

    async def observe_postgres(self) -> Postgres | None:
        """The local server's state in one connection (``None`` when it does not answer)."""
        try:
            async with asyncio.timeout(2.0):
                conn = await self._connection()
                return await _observe(conn)
        except (psycopg.Error, OSError, TimeoutError):
            await self._drop_connection()
            return None

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                host=self.settings.socket_dir,
                port=self.settings.pg_port,
                user=self.settings.superuser,
                dbname="postgres",
                autocommit=True,
                connect_timeout=2,
                application_name="crpy-agent",
            )
        return self._conn

    async def close(self) -> None:
        await self._drop_connection()

    async def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
        self._conn = None

    # -- HTTP --------------------------------------------------------------------------------

    async def status(self, _: web.Request) -> web.Response:
        postgres = await self.observe_postgres()
        answer, self.state = report(
            self.state,
            me=self.settings.member,
            now=boottime(),
            supervisor=self.supervisor(),
            postgres=postgres,
            member_of_host=self.hosts,
        )
        return web.json_response(answer.to_json(), dumps=lambda d: orjson.dumps(d).decode())

    async def refresh(self, _: web.Request) -> web.Response:
        now = boottime()
        if now - self._last_refresh >= 0.1:
            self._last_refresh = now
            self.wake.set()
        return web.Response(status=202)

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/status", self.status)
        app.router.add_post("/refresh", self.refresh)
        app.router.add_get("/healthz", self.healthz)
        return app


async def _observe(conn: psycopg.AsyncConnection[Any]) -> Postgres:
    async with conn.cursor() as cur:
        await cur.execute(
            "SELECT pg_is_in_recovery(), pg_last_wal_receive_lsn()::text,"
            " pg_last_wal_replay_lsn()::text, (SELECT timeline_id FROM pg_control_checkpoint()),"
            " extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8,"
            " current_setting('synchronous_standby_names')"
        )
        row = await cur.fetchone()
        assert row is not None
        in_recovery, received, replayed, checkpoint_tli, replay_age, sync_names = row
        if not in_recovery:
            await cur.execute(
                "SELECT pg_current_wal_lsn()::text, pg_walfile_name(pg_current_wal_lsn())"
            )
            current = await cur.fetchone()
            assert current is not None
            await cur.execute(
                "SELECT application_name, state, coalesce(sync_state, ''),"
                " coalesce(flush_lsn::text, ''), coalesce(replay_lsn::text, ''),"
                " extract(epoch FROM replay_lag)::float8 FROM pg_stat_replication"
            )
            replicas = tuple(
                Replica(str(n), str(s), str(ss), parse_lsn(f), parse_lsn(r), lag)
                for n, s, ss, f, r, lag in await cur.fetchall()
            )
            return Postgres(
                in_recovery=False,
                timeline=int(str(current[1])[:8], 16),
                current_lsn=parse_lsn(current[0]),
                replicas=replicas,
                sync_names=str(sync_names),
            )
        await cur.execute(
            "SELECT status, received_tli, sender_host, sender_port FROM pg_stat_wal_receiver"
        )
        receiver = await cur.fetchone()
        await cur.execute("SELECT wait_event FROM pg_stat_activity WHERE backend_type = 'startup'")
        startup = await cur.fetchone()
    status, timeline, host = None, int(checkpoint_tli or 0), None
    if receiver is not None and receiver[0] is not None:
        status = str(receiver[0])
        timeline = int(receiver[1] or timeline)
        host = f"{receiver[2]} {receiver[3]}"
    return Postgres(
        in_recovery=True,
        timeline=timeline,
        received_lsn=parse_lsn(received),
        replay_lsn=parse_lsn(replayed),
        receiver_host=host,
        receiver_status=status,
        local_wal_replayed=startup is not None and startup[0] in WAITING_FOR_WAL,
        replay_age=replay_age,
        sync_names=str(sync_names),
    )


async def serve(settings: AgentSettings, config: ClusterConfig, stop: asyncio.Event) -> None:
    """Run an agent until ``stop`` is set."""
    async with Transport(config, max_retries=0) as transport:
        await run_agent(Agent(settings, transport), settings, stop)


async def run_agent(agent: Agent, settings: AgentSettings, stop: asyncio.Event) -> None:
    """Serve ``agent``'s HTTP endpoints and run its rounds until ``stop`` is set."""
    runner = web.AppRunner(agent.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    await site.start()
    log.info(
        "agent of %s (instance %s/%s) on port %d",
        settings.member,
        settings.namespace,
        settings.instance,
        settings.port,
    )
    try:
        await agent.run(stop)
    finally:
        await agent.close()
        await runner.cleanup()


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s agent: %(message)s", datefmt="%Y-%m-%dT%H:%M:%S"
    )
    settings = AgentSettings.from_env()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, await load_config(), stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()


__all__ = ["AGENT_PORT", "Agent", "AgentSettings", "run_agent", "serve"]
