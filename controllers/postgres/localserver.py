"""The throwaway PostgreSQL server of the operator's tests and ``make run``: the library's
(:mod:`controller_runtime.envtest.postgres`), which the local control plane's
``kine-postgres`` storage starts too. Kept under this name for the operator's code."""

from controller_runtime.envtest.postgres import LocalPostgres, PostgresNotFoundError, find_bindir

__all__ = ["LocalPostgres", "PostgresNotFoundError", "find_bindir"]
