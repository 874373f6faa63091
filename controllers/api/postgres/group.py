"""The PostgreSQL API group."""

GROUP = "postgres.crpy.io"
VERSION = "v1alpha1"
