"""Giving the memory of a freed cache back to the operating system.

Where a store's memory lives: its encoded objects above 512 B (most bodies) come from the C
library's ``malloc``; keys, small objects and metadata stubs from CPython's own allocator,
which unmaps a 1 MiB arena once nothing in it is alive. glibc's ``malloc`` keeps what is
freed in its heap for reuse and gives back only a free *top* of the heap: a store freed in
the middle of the heap stays resident however long nothing reuses it.
``python -m bench.dynamic_release`` measured it: 10k ConfigMaps of 1 KiB freed, the process
heap (``[heap]`` in ``/proc/self/smaps``) stayed 14 MiB above its size before, and
CPython's arenas did not change.

:func:`release_freed_memory` asks glibc to return every free page of its heaps
(``malloc_trim(0)``, which since glibc 2.8 also releases free pages inside the heap). The
informer factory calls it after it freed a released informer's store. Guarded: glibc only,
found through :mod:`ctypes` once; elsewhere (musl, macOS) it does nothing and returns
``False``. Cost: it walks the free chunks under malloc's lock, so it blocks the event loop
while it runs; ``python -m bench.dynamic_release`` reports the time it took (1.4 ms for
a 35 MiB heap). Nothing else calls it: a process that keeps its caches keeps reusing the
pages, and returning them only to fault them in again would cost more than it saves.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

__all__ = ["release_freed_memory", "trim_available"]

log = logging.getLogger(__name__)

_resolved = False
_trim: Callable[[int], int] | None = None


def _resolve() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # noqa: PLC0415 (on first use: 1-2 ms of every start-up otherwise)

    try:
        # The process's own symbols (dlopen(NULL)): the C library it runs on, found without
        # ctypes.util.find_library (which runs ldconfig in a subprocess). musl has no
        # malloc_trim: the attribute lookup fails there.
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_available() -> bool:
    """Whether :func:`release_freed_memory` can do anything here (glibc's ``malloc_trim``)."""
    global _trim, _resolved  # resolved once, on first use
    if not _resolved:
        _trim, _resolved = _resolve(), True
    return _trim is not None


def release_freed_memory() -> bool:
    """Return the free pages of the C heap to the operating system (module docs). Returns
    whether ``malloc_trim`` ran and released something; never raises."""
    if not trim_available() or _trim is None:
        return False
    try:
        return bool(_trim(0))
    except OSError as err:  # not expected from malloc_trim; never worth failing a release
        log.debug("malloc_trim failed: %s", err)
        return False
