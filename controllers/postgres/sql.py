"""The operator's SQL: idempotent role and database management, and a reachability check.

Every statement is composed with ``psycopg.sql``: names are validated
(:func:`~controllers.postgres.api.check_identifier`) and then quoted as identifiers, values as
literals. Passwords are sent as SCRAM verifiers (:mod:`controllers.postgres.scram`), never in
plain text. Errors from the driver are re-raised as :class:`DatabaseError`, whose message is
the server's first line with the password redacted: safe for conditions and logs.

Roles the operator creates carry an ownership mark (a comment, see
:mod:`controllers.postgres.ownership`): :func:`owned_roles` lists them for the orphan sweep.

Connections use ``autocommit`` (``CREATE DATABASE`` cannot run in a transaction) and a 5 s
connect timeout; each operation opens and closes its own connections (reconciles are rare:
a pool would hold idle connections on every server for nothing).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

import psycopg
from psycopg import sql

from controllers.postgres import scram
from controllers.postgres.api import check_identifier
from controllers.postgres.common import redact
from controllers.postgres.ownership import MARK_PREFIX, RoleOwner, parse_mark

log = logging.getLogger(__name__)

Privileges = Literal["ReadWrite", "ReadOnly"]
CONNECT_TIMEOUT = 5
ROLE_LOCK_CLASS = 0x63727079
"""The first key of the operator's advisory locks on role names (``pg_advisory_lock(class,
hashtext(role))``): :func:`ensure_role` holds one while it creates or converges a role, and
the orphan sweep drops a role only while it holds it (:func:`role_lock`)."""


class DatabaseError(RuntimeError):
    """A database operation failed; the message is safe to show (no secrets)."""


@dataclass(frozen=True)
class ConnInfo:
    """How to reach a server as its administrator. The password is kept out of ``repr``."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    dbname: str = "postgres"
    sslmode: str = "prefer"

    def kwargs(self, dbname: str | None = None) -> dict[str, object]:
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "dbname": dbname or self.dbname,
            "sslmode": self.sslmode,
            "connect_timeout": CONNECT_TIMEOUT,
            "application_name": "crpy-postgres-operator",
        }


@dataclass(frozen=True)
class RoleSpec:
    """What a role should look like. ``password`` is kept out of ``repr``."""

    name: str
    password: str = field(repr=False)
    database: str
    privileges: Privileges = "ReadWrite"
    connection_limit: int = -1
    owner: RoleOwner | None = None
    """The ownership mark the role carries (see :mod:`controllers.postgres.ownership`);
    ``None`` leaves its comment alone."""


@dataclass(frozen=True)
class RoleOutcome:
    """What :func:`ensure_role` changed."""

    role_created: bool
    password_set: bool
    database_created: bool


def _safe(err: Exception, *secrets: str | None) -> DatabaseError:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return DatabaseError(redact(f"{type(err).__name__}: {first}", *secrets))


@contextlib.asynccontextmanager
async def connect(
    info: ConnInfo, dbname: str | None = None
) -> AsyncIterator[psycopg.AsyncConnection[tuple[object, ...]]]:
    """An autocommit connection as the administrator; driver errors become
    :class:`DatabaseError`."""
    try:
        conn = await psycopg.AsyncConnection.connect(autocommit=True, **info.kwargs(dbname))  # type: ignore[arg-type]
    except psycopg.Error as err:
        raise _safe(err, info.password) from None
    try:
        async with conn:
            yield conn
    except psycopg.Error as err:
        raise _safe(err, info.password) from None


async def server_version_num(info: ConnInfo) -> int:
    """The server's ``server_version_num`` (e.g. 150004): also a reachability check."""
    async with connect(info) as conn:
        cur = await conn.execute("SHOW server_version_num")
        row = await cur.fetchone()
    assert row is not None
    return int(str(row[0]))


Conn = psycopg.AsyncConnection[tuple[object, ...]]


async def _role_comment(conn: Conn, name: str) -> tuple[bool, str | None]:
    """(exists, its comment or None)."""
    cur = await conn.execute(
        "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = %s", (name,)
    )
    row = await cur.fetchone()
    if row is None:
        return False, None
    return True, (str(row[0]) if row[0] is not None else None)


async def _role_verifier(conn: Conn, name: str) -> str | None:
    """The stored verifier of an existing role, or None when unreadable (not a superuser)."""
    try:
        cur = await conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (name,))
    except psycopg.errors.InsufficientPrivilege:
        return None
    row = await cur.fetchone()
    return str(row[0]) if row and row[0] is not None else None


def _needs_mark(comment: str | None, owner: RoleOwner) -> bool:
    """Whether an existing role claimed for ``owner`` gets ``owner``'s mark: when it has no
    comment (a role of an earlier operator version, or adopted) or another mark of ours (its
    claimant changed); never over a comment someone else wrote."""
    if not comment:
        return True
    mark = parse_mark(comment)
    return mark is not None and mark != owner


async def _lock_role(conn: Conn, name: str) -> None:
    """Hold the role's advisory lock until ``conn`` closes (see :data:`ROLE_LOCK_CLASS`)."""
    await conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (ROLE_LOCK_CLASS, name))


def _grants(role: RoleSpec) -> list[sql.Composed]:
    """Idempotent GRANT/REVOKE statements run inside the role's database."""
    r = sql.Identifier(role.name)
    if role.privileges == "ReadOnly":
        return [
            sql.SQL("REVOKE CREATE ON SCHEMA public FROM {}").format(r),
            sql.SQL(
                "REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public FROM {}"
            ).format(r),
            sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(r),
            sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(r),
            sql.SQL("GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO {}").format(r),
        ]
    return [
        sql.SQL("GRANT USAGE, CREATE ON SCHEMA public TO {}").format(r),
        sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA public TO {}").format(r),
        sql.SQL("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}").format(r),
    ]


async def ensure_role(info: ConnInfo, role: RoleSpec) -> RoleOutcome:
    """Make ``role`` exist with LOGIN, its password, its connection limit, its database
    (created, owned by the administrator, when absent) and its grants. Idempotent: an
    existing role is converged, never dropped and recreated; its password is rewritten only
    when the stored verifier does not match (or cannot be read).

    With ``role.owner``, a role created here carries its ownership mark from the start (the
    ``COMMENT ON ROLE`` is in the ``CREATE ROLE``'s transaction), and an existing one gets it
    when it has no comment or another mark of ours (never over someone else's comment). The
    role's advisory lock is held until the role is created or converged, so the orphan sweep
    cannot drop it in between (:func:`role_lock`)."""
    check_identifier(role.name, "role name")
    check_identifier(role.database, "database name")
    name = sql.Identifier(role.name)
    limit = sql.Literal(int(role.connection_limit))
    role_created = password_set = db_created = False
    async with connect(info) as conn:
        await _lock_role(conn, role.name)  # the orphan sweep never drops it meanwhile
        exists, comment = await _role_comment(conn, role.name)
        if not exists:
            verifier = sql.Literal(scram.verifier(role.password))
            try:
                # One transaction: a role of ours never exists without its mark.
                async with conn.transaction():
                    await conn.execute(
                        sql.SQL(
                            "CREATE ROLE {} WITH LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB "
                            "CONNECTION LIMIT {} PASSWORD {}"
                        ).format(name, limit, verifier)
                    )
                    if role.owner is not None:
                        await _mark(conn, role.name, role.owner)
                role_created = password_set = True
            except psycopg.errors.DuplicateObject:
                # Created concurrently (another operator replica, or by hand): converge.
                exists, comment = await _role_comment(conn, role.name)
        if exists:
            stored = await _role_verifier(conn, role.name)
            await conn.execute(
                sql.SQL("ALTER ROLE {} WITH LOGIN CONNECTION LIMIT {}").format(name, limit)
            )
            if role.owner is not None and _needs_mark(comment, role.owner):
                await _mark(conn, role.name, role.owner)
            if not scram.verify(stored, role.password):
                verifier = sql.Literal(scram.verifier(role.password))
                await conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(name, verifier))
                password_set = True
        cur = await conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (role.database,))
        if await cur.fetchone() is None:
            try:
                await conn.execute(
                    sql.SQL("CREATE DATABASE {}").format(sql.Identifier(role.database))
                )
                db_created = True
            except psycopg.errors.DuplicateDatabase:
                pass
        db = sql.Identifier(role.database)
        if role.privileges == "ReadOnly":
            await conn.execute(sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM {}").format(db, name))
            await conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(db, name))
        else:
            await conn.execute(
                sql.SQL("GRANT CONNECT, TEMPORARY ON DATABASE {} TO {}").format(db, name)
            )
    async with connect(info, role.database) as conn:
        for statement in _grants(role):
            await conn.execute(statement)
    return RoleOutcome(role_created, password_set, db_created)


async def _mark(conn: Conn, name: str, owner: RoleOwner) -> None:
    await conn.execute(
        sql.SQL("COMMENT ON ROLE {} IS {}").format(
            sql.Identifier(name), sql.Literal(owner.comment())
        )
    )


async def owned_roles(info: ConnInfo) -> dict[str, RoleOwner]:
    """Every role on the server that carries an ownership mark of this operator (any
    instance's), with what the mark says."""
    async with connect(info) as conn:
        cur = await conn.execute(
            "SELECT rolname, shobj_description(oid, 'pg_authid') FROM pg_roles "
            "WHERE left(shobj_description(oid, 'pg_authid'), %s) = %s",
            (len(MARK_PREFIX), MARK_PREFIX),
        )
        rows = await cur.fetchall()
    owned: dict[str, RoleOwner] = {}
    for name, comment in rows:
        owner = parse_mark(str(comment))
        if owner is not None:
            owned[str(name)] = owner
    return owned


@contextlib.asynccontextmanager
async def role_lock(info: ConnInfo, name: str) -> AsyncIterator[bool]:
    """Try to take role ``name``'s advisory lock (see :data:`ROLE_LOCK_CLASS`) without
    waiting; yields whether it is held (``False``: :func:`ensure_role` is working on that role
    right now). Released on exit, when its connection closes."""
    async with connect(info) as conn:
        cur = await conn.execute(
            "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (ROLE_LOCK_CLASS, name)
        )
        row = await cur.fetchone()
        yield bool(row and row[0])


async def role_exists(info: ConnInfo, name: str) -> bool:
    async with connect(info) as conn:
        cur = await conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,))
        return await cur.fetchone() is not None


async def drop_role(info: ConnInfo, name: str, database: str | None) -> bool:
    """Drop role ``name`` if it exists; return whether it existed. Its sessions are ended;
    objects it owns in ``database`` and the maintenance database are handed to the
    administrator (``REASSIGN OWNED``: data is kept), its privileges there revoked
    (``DROP OWNED``). Objects it owns in other databases make the drop fail (reported, and
    retried). Two connections at most: the maintenance database's, held throughout, and the
    role's database's when it has one."""
    check_identifier(name, "role name")
    ident = sql.Identifier(name)
    async with connect(info) as conn:
        cur = await conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,))
        if await cur.fetchone() is None:
            return False
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        cur = await conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
        has_database = database is not None and await cur.fetchone() is not None
        if has_database and database != info.dbname:
            async with connect(info, database) as own:
                await own.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(ident))
                await own.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        await conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(ident))
        await conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        await conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident))
    return True
