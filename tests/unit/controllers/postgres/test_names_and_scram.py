"""Names that reach SQL, and SCRAM verifiers computed on the client."""

from __future__ import annotations

import asyncio
import base64

import pytest
from psycopg import sql as psql

from controllers.postgres import scram, sql
from controllers.postgres.api import InvalidNameError, check_identifier, identifier_from

# Stored by PostgreSQL 15 for CREATE ROLE x PASSWORD 'correct horse'.
PG_VERIFIER = (
    "SCRAM-SHA-256$4096:5x9DLgLxQRJQsjv/+3G/fg==$gNDyXdh4MvgRqzD2Akp/ahcPvsX2PB5GKmqhO0HqUMM="
    ":2smy6b/Qk9QY9zV59Z1mr3Dj5yF4hbmJ8SbAzzE6b1I="
)


@pytest.mark.parametrize("name", ["app", "_x", "a1_b2", "a" * 63])
def test_plain_lowercase_identifiers_are_accepted(name: str) -> None:
    assert check_identifier(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "App",
        "1abc",
        "a-b",
        "a" * 64,
        'x"; DROP ROLE postgres; --',
        "x' OR '1'='1",
        "pg_monitor",
        "postgres",
        "template1",
        "ü",
    ],
)
def test_anything_else_is_refused_with_a_reason(name: str) -> None:
    with pytest.raises(InvalidNameError, match="role name"):
        check_identifier(name, "role name")


def test_derived_identifiers_are_valid_deterministic_and_distinct_when_cut() -> None:
    assert identifier_from("team-a", "shop.api") == "team_a_shop_api"
    assert identifier_from("9lives") == "r_9lives"
    assert identifier_from("pg-x") == "u_pg_x"
    long_a = identifier_from("n" * 40, "a" * 40)
    long_b = identifier_from("n" * 40, "b" * 40)
    assert len(long_a) == 63 and long_a != long_b
    assert identifier_from("n" * 40, "a" * 40) == long_a


def test_a_verifier_matches_its_password_only() -> None:
    stored = scram.verifier("s3cret")
    assert stored.startswith("SCRAM-SHA-256$4096:")
    assert scram.verify(stored, "s3cret")
    assert not scram.verify(stored, "s3cret ")
    assert scram.verifier("s3cret") != stored  # a fresh salt each time


def test_verifiers_stored_by_postgresql_are_understood() -> None:
    assert scram.verify(PG_VERIFIER, "correct horse")
    assert not scram.verify(PG_VERIFIER, "battery staple")
    salt = "5x9DLgLxQRJQsjv/+3G/fg=="
    assert scram.verifier("correct horse", salt=base64.b64decode(salt)) == PG_VERIFIER


@pytest.mark.parametrize(
    "stored", [None, "", "md5abcdef", "SCRAM-SHA-256$x", "SCRAM-SHA-256$4096:!!$a:b"]
)
def test_other_stored_passwords_never_verify(stored: str | None) -> None:
    assert not scram.verify(stored, "anything")


def test_generated_passwords_are_long_random_and_uri_safe() -> None:
    passwords = {scram.generate_password() for _ in range(50)}
    assert len(passwords) == 50
    assert all(len(p) == 32 and p.isalnum() for p in passwords)


def test_sql_quotes_identifiers_and_literals() -> None:
    statement = psql.SQL("ALTER ROLE {} PASSWORD {}").format(
        psql.Identifier('we"ird'), psql.Literal("it's")
    )
    assert statement.as_string(None) == "ALTER ROLE \"we\"\"ird\" PASSWORD 'it''s'"


def test_invalid_names_are_refused_before_any_connection() -> None:
    info = sql.ConnInfo("192.0.2.1", 1, "admin", "pw")  # unroutable: never reached
    role = sql.RoleSpec('x"; DROP TABLE t; --', "pw", "db")
    with pytest.raises(InvalidNameError):
        asyncio.run(sql.ensure_role(info, role))
    with pytest.raises(InvalidNameError):
        asyncio.run(sql.drop_role(info, "Robert'); DROP", None))


def test_connection_info_and_role_specs_keep_passwords_out_of_repr() -> None:
    assert "hunter2" not in repr(sql.ConnInfo("h", 1, "u", "hunter2"))
    assert "hunter2" not in repr(sql.RoleSpec("r", "hunter2", "d"))


def test_database_errors_are_redacted() -> None:
    err = sql._safe(RuntimeError("bad password hunter2\nDETAIL: more"), "hunter2")
    assert str(err) == "RuntimeError: bad password ***"
