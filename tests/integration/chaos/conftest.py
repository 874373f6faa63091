"""The chaos suite's fixtures: its audited control plane, and the session's PostgreSQL server
of the postgres tests."""

from tests.integration.chaos.cluster import audited_plane
from tests.integration.postgres.conftest import postgres_server

__all__ = ["audited_plane", "postgres_server"]
