"""controller_runtime."""
