"""The fuzzer's fixtures: the session's PostgreSQL server of the postgres tests."""

from tests.integration.postgres.conftest import postgres_server

__all__ = ["postgres_server"]
