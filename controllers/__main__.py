"""The operator's command line: ``python -m controllers`` (or ``controller-runtime-py-operator``).

Every flag is documented in ``--help``. Exit status: 0 after a graceful shutdown, 1 when
leadership was lost or a cache did not sync, 2 for bad flags.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import sys
from collections.abc import Sequence

from controllers.cli import parser, settings_from

__all__ = ["main", "parser", "settings_from"]

log = logging.getLogger("controllers")


def enable_crash_tracebacks() -> None:
    """Dump every thread's Python traceback to stderr if the process dies of a fatal signal
    (SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL), e.g. an abort inside the event loop's C code:
    the Pod's last log then says where, instead of nothing."""
    faulthandler.enable(file=sys.stderr, all_threads=True)


def main(argv: Sequence[str] | None = None) -> int:
    enable_crash_tracebacks()
    settings = settings_from(argv)  # --help and bad flags end here, before anything loads
    # The runtime and the controllers are imported after the flags are read (seconds of
    # imports that --help should not wait for).
    from controller_runtime import configure_logging  # noqa: PLC0415
    from controller_runtime.manager import install_event_loop  # noqa: PLC0415
    from controllers.app import run_operator  # noqa: PLC0415

    configure_logging(settings.log_level, settings.log_format)

    try:
        loop = install_event_loop()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    log.debug("event loop: %s", loop)
    return asyncio.run(run_operator(settings))


if __name__ == "__main__":
    sys.exit(main())
